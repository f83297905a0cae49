"""Smoke test of the benchmark: agentpost's queue through the bench harness, in real processes.

The harness (bench/harness.py) needs only the standard library, so this runs in the main virtualenv without
the peers: one producer and two consumer processes over a SQLite file, a small N, and the harness's own
lost / duplicated classification must come out clean. The plain sqlite3 baseline of issue 17's enqueue
target (sqlite-insert-event) writes its event rows, and the two one-process scripts of issue 17
(claim_batch.py, enqueue_agents.py) run end to end with tiny sizes (their own checks raise on a wrong drain
or a wrong route).
"""

from __future__ import annotations

import random
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.claude_env import claude_binary

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


def test_plain_insert_with_event_peer_writes_one_event_per_message(tmp_path: Path, bench_path: None) -> None:
    from harness import run_once
    from systems_peers import SqliteInsertEvent

    target = tmp_path / "queue.db"
    result = run_once(SqliteInsertEvent(), str(target), tmp_path / "run", n=300, timeout_s=60.0)
    assert result.error is None, result.error
    assert (result.produced, result.consumed, result.lost, result.duplicated) == (300, 300, 0, 0)
    assert result.enqueue_per_s > 0
    conn = sqlite3.connect(target)
    try:
        events = conn.execute("SELECT COUNT(*), COUNT(DISTINCT message_id) FROM events").fetchone()
    finally:
        conn.close()
    assert events == (300, 300)


def test_claim_batch_drains_every_round_of_both_systems(bench_path: None) -> None:
    from claim_batch import measure

    r = measure(rounds=2, runs=1, agents=8, per_agent=3)
    assert r["messages"] == 48
    assert r["agentpost_median"] > 0 and r["plain_median"] > 0
    assert r["ratio"] is not None and r["ratio"] > 0


def test_enqueue_agents_routes_by_mention_with_either_directory(bench_path: None) -> None:
    from enqueue_agents import measure

    r = measure(n=80, runs=1, small=8, large=64)
    assert (r["small_agents"], r["large_agents"]) == (8, 64)
    assert r["small_median"] > 0 and r["large_median"] > 0
    assert r["ratio"] is not None and r["ratio"] > 0


def test_instruction_counts_cover_only_the_measured_messages(bench_path: None) -> None:
    # Under real callgrind: each workload counts exactly the messages it says, and a count is an
    # instruction count of the measured part only (a run that counted nothing, or the interpreter's
    # start-up of ~100 million instructions, would fall outside these bounds).
    from instructions import count

    plain = count("enqueue-plain", 40, 8)
    ours = count("enqueue-sql-agentpost", 40, 8)
    assert plain["messages"] == ours["messages"] == 40
    for measured in (plain, ours):
        assert 20_000 < measured["per_message"] < 2_000_000, measured
    # Our enqueue statements write more index entries than a bare INSERT with its event: never cheaper.
    assert ours["per_message"] > plain["per_message"]


def test_drain_statement_counts_drain_every_message_on_both_schemas(bench_path: None) -> None:
    # The drain floor and its split-schema variant each claim and complete a full round (they raise when
    # a claim or completion comes back short), and count that round alone.
    from instructions import count

    for workload in ("drain-sql-agentpost", "drain-sql-hot-split"):
        measured = count(workload, 160, 160)
        assert measured["messages"] == 160, measured
        assert 20_000 < measured["per_message"] < 2_000_000, measured


def test_warm_sessions_bench_measures_a_cold_and_a_warm_message(tmp_path: Path, bench_path: None) -> None:
    from warm_sessions import measure

    claude_binary()  # the pinned CLI is installed (else: a clear error saying how)

    first, later, rss = measure(tmp_path, 60.0, messages=2, chats=1)
    assert len(first) == len(later) == 1
    assert 0 < later[0] < first[0]  # the second message went to the kept process
    assert rss > 10_000  # KiB: a real CLI process was kept
