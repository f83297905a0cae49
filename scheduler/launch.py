"""``python -m scheduler.launch ENVFILE KIND``: how supervisord starts each process for `agentpost up`.

supervisord hands its children the environment it was itself started with, so a token added (or a port
changed) before a later `agentpost up` would never reach a process started or restarted by that running
supervisord. `up` therefore writes, per process, the variables that process reads (``AGENTPOST_*``, a
channel's own ``TELEGRAM_*`` and the like) to ENVFILE as they are in the shell that ran `up`; this launcher
replaces those variables with the file's values (removing the ones no longer set) and becomes
``python -m shared.cli.main run KIND``: same pid, so supervisord's view and signals are unchanged.

It imports nothing beyond the standard library: every start of every process goes through it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any


def environment(base: Mapping[str, str], spec: Mapping[str, Any]) -> dict[str, str]:
    """``base`` without the variables ``spec`` manages, plus the values ``spec`` gives them."""
    prefixes = tuple(str(p) for p in spec.get("prefixes") or ())
    names = {str(n) for n in spec.get("names") or ()}
    values = {str(k): str(v) for k, v in (spec.get("values") or {}).items()}
    kept = {k: v for k, v in base.items() if not (k.startswith(prefixes) or k in names)}
    return {**kept, **values}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m scheduler.launch ENVFILE KIND", file=sys.stderr)
        return 2
    envfile, kind = argv
    try:
        with open(envfile, encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, ValueError) as exc:
        print(
            f"error: the environment file of {kind} ({envfile}) cannot be read ({exc}); "
            "run `agentpost up` again to write it",
            file=sys.stderr,
        )
        return 1
    env = environment(dict(os.environ), spec)
    python = sys.executable
    os.execve(python, [python, "-m", "shared.cli.main", "run", kind], env)
    return 0  # not reached: execve replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
