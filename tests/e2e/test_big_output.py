"""A run that prints 20 MB (issue 38, "bounded output"): what it costs the processor and the database.

Each test runs a processor as its own process (``agentpost run processor``, SQLite) with an agent that
prints 20 MB, and measures from outside (:mod:`tests.output_support`): the processor's peak memory growth
from ``/proc``, the database's growth, the run's events. The reply is its first 100,000 characters with a
note, and the whole text is attached as ``reply.txt``, byte for byte what the agent printed. Before the
bounds the same runs cost 102-502 MB of memory and 40-525 MB of database (docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures import cli_installed  # noqa: F401  (fixture: the claude CLI is installed)
from tests.output_support import MB, Growth, measure, printed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIZE = 20 * MB
NOTE = "\n\n(The reply was {chars:,} characters; the first 100,000 are shown and the whole text is attached as reply.txt.)"


def _check_reply(growth: Growth, whole: bytes) -> None:
    (attached,) = growth.files
    path = Path(attached)
    assert path.name == "reply.txt" and path.parent.parent.name == "c1"  # the chat's upload folder
    assert path.read_bytes() == whole
    text = whole.decode()
    assert growth.reply == text[:100_000].rstrip() + NOTE.format(chars=len(text))


def _check_costs(growth: Growth) -> None:
    assert growth.rss_mb < 20, growth.row()
    assert growth.db_mb < 2, growth.row()
    assert growth.event_rows < 250 and growth.event_mb < 0.5, growth.row()


@pytest.mark.parametrize(("case", "shape"), [("one_line", "one"), ("many_lines", "many")])
def test_twenty_megabytes_from_a_command_agent(tmp_path: Path, case: str, shape: str) -> None:
    growth = measure(case, tmp_path, SIZE)
    _check_costs(growth)
    _check_reply(growth, printed(SIZE, shape))
    if case == "many_lines":
        # 200,000 lines of progress: joined into a few events, the rest counted in one last event.
        assert 1 < len(growth.progress) <= 201
        assert growth.progress[0].startswith("the quick brown fox")
        assert growth.progress[-1].endswith("more lines not recorded")
        recorded = sum(len(t.splitlines()) for t in growth.progress[:-1])
        assert growth.progress[-1] == f"… {200_000 - recorded:,} more lines not recorded"


def test_twenty_megabytes_streamed_by_the_claude_cli(tmp_path: Path) -> None:
    from tests.fakes.anthropic_api import Chunked, FakeAnthropic

    words = "the quick brown fox jumps over the lazy dog; "
    block = (words * 100)[:4096]
    parts = [f"{n:08d} {block}"[:4096] for n in range(SIZE // 4096)]  # each part its own, in order
    with FakeAnthropic() as api:
        api.add_rule("the big one", Chunked(parts, interval=0))
        api.add_rule(None, Chunked(["fine, thanks"], interval=0))
        growth = measure("claude", tmp_path, SIZE, api_url=api.base_url)
    _check_costs(growth)
    _check_reply(growth, "".join(parts).encode())
