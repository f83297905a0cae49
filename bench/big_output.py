"""What a run printing a lot costs the processor and the database (issue 38, "bounded output").

Each case runs one processor as its own process (``agentpost run processor``, SQLite home, no sandbox) and
one agent whose answer is SIZE bytes: a ``command`` agent printing it as one line, the same as lines of 100
bytes, and (with ``--claude``) the real Claude Code CLI streaming it from the fake Messages API
(``tests/fakes/anthropic_api.py``) in deltas of 4 KB. It prints one table row per case: the processor's peak
memory growth over the run (``VmHWM`` from ``/proc``, reset after a first small run), the database's growth
(pages in use after a checkpoint), the ``events`` rows and payload bytes written, the reply's characters and
its attachments. See :mod:`tests.output_support` for how each figure is taken.

    .venv/bin/python bench/big_output.py [--size-mb 20] [--claude]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.output_support import HEADER, MB, measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=20.0, help="how much the agent prints (MB)")
    parser.add_argument("--claude", action="store_true", help="also the real claude CLI against the fake API")
    parser.add_argument("--cases", default="one_line,many_lines", help="command cases to run")
    args = parser.parse_args()
    size = int(args.size_mb * MB)
    print(HEADER, flush=True)
    for case in [c for c in args.cases.split(",") if c]:
        with tempfile.TemporaryDirectory(prefix="agentpost-big-") as tmp:
            print(measure(case, Path(tmp), size).row(), flush=True)
    if args.claude:
        from tests.fakes.anthropic_api import Chunked, FakeAnthropic

        words = "the quick brown fox jumps over the lazy dog; "
        block = (words * (4096 // len(words) + 1))[:4096]
        parts = [block] * (size // len(block))
        with FakeAnthropic() as api, tempfile.TemporaryDirectory(prefix="agentpost-big-") as tmp:
            api.add_rule("the big one", Chunked(parts, interval=0))
            api.add_rule(None, Chunked(["fine, thanks"], interval=0))
            print(measure("claude", Path(tmp), size, api_url=api.base_url).row(), flush=True)


if __name__ == "__main__":
    main()
