"""Smoke test of the benchmark: agentpost's queue through the bench harness, in real processes.

The harness (bench/harness.py) needs only the standard library, so this runs in the main virtualenv without
the peers: one producer and two consumer processes over a SQLite file, a small N, and the harness's own
lost / duplicated classification must come out clean.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

pytestmark = pytest.mark.integration


@pytest.fixture
def bench_path() -> Iterator[None]:
    sys.path.insert(0, str(BENCH))
    try:
        yield
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize("consumers", [1, 2])
def test_agentpost_through_the_harness_loses_and_duplicates_nothing(
    tmp_path: Path, bench_path: None, consumers: int
) -> None:
    from harness import run_once
    from systems_agentpost import AgentpostSqlite

    system = AgentpostSqlite()
    result = run_once(
        system,
        str(tmp_path / "queue.db"),
        tmp_path / "run",
        n=500,
        consumers=consumers,
        timeout_s=60.0,
        rng=random.Random(0),
    )
    assert result.error is None, result.error
    assert result.produced == 500
    assert result.consumed == 500
    assert result.lost == 0
    assert result.duplicated == 0
    assert result.msgs_per_s > 0

    # Every message was completed with its response, through the public operations.
    queue = system.open_queue(str(tmp_path / "queue.db"))
    try:
        counts = {
            r["status"]: r["n"]
            for r in queue.db.read("SELECT status, COUNT(*) AS n FROM messages GROUP BY status")
        }
        responses = queue.db.read_scalar("SELECT COUNT(*) FROM responses")
    finally:
        queue.db.close()
    assert counts == {"completed": 500}
    assert 1 <= int(responses) <= 500
