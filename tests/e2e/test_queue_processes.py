"""Real OS processes sharing one database: producers, consumers, and a consumer killed with SIGKILL."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue.core import Directory, Queue
from shared.storage.schema import open_database

pytestmark = pytest.mark.e2e

ACTOR = str(Path(__file__).resolve().parents[1] / "queue_actor.py")
AGENTS = ["a1", "a2", "a3", "a4", "a5"]


def _spawn(*args: str, stderr: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, ACTOR, *args], env=env, stderr=stderr)


def _wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _read_log(paths: list[Path]) -> list[dict[str, Any]]:
    entries = []
    for path in paths:
        if path.exists():
            entries.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return entries


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
@pytest.mark.timeout(300)
def test_four_producers_two_consumers_ten_thousand_messages(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    open_database(url).close()
    stop = tmp_path / "stop"
    logs = [tmp_path / "c1.log", tmp_path / "c2.log"]
    agents = ",".join(AGENTS)
    consumers = [
        _spawn(
            "consumer",
            url,
            "--agents",
            agents,
            "--worker",
            f"c{i}",
            "--log",
            str(log),
            "--stop-file",
            str(stop),
        )
        for i, log in enumerate(logs, start=1)
    ]
    producers = [
        _spawn("producer", url, "--agents", agents, "--count", "2500", "--tag", f"p{i}") for i in range(4)
    ]
    for p in producers:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode()
    db = open_database(url, create=False)
    queue = Queue(db, directory=Directory.single(*AGENTS))
    _wait_until(
        lambda: queue.admin.queue_status()["completed"] == 10_000, 240, "all 10,000 messages completed"
    )
    stop.touch()
    for c in consumers:
        _, err = c.communicate(timeout=60)
        assert c.returncode == 0, err.decode()
        assert b"locked" not in err, err.decode()

    status = queue.admin.queue_status()
    assert status["completed"] == 10_000 and status["pending"] == status["processing"] == status["dead"] == 0
    entries = [e for e in _read_log(logs) if e["event"] == "completed"]
    completed_ids = [i for e in entries for i in e["ids"]]
    assert len(completed_ids) == 10_000 and len(set(completed_ids)) == 10_000  # each exactly once
    assert db.read_scalar("SELECT COUNT(*) FROM responses") == len(entries)  # one response per batch
    # Both consumers did work, and per-agent order is preserved for every producer.
    assert {e["worker"] for e in entries} == {"c1", "c2"}
    seen: dict[tuple[str, str], int] = {}
    for e in sorted(entries, key=lambda e: e["start"]):
        for text in e["texts"]:
            tag, seq = text.split(":")
            key = (tag, e["agent"])
            assert int(seq) > seen.get(key, -1), f"out of order for {key}: {seq} after {seen.get(key)}"
            seen[key] = int(seq)
    # No two consumers ever held one agent at once.
    by_agent: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for e in entries:
        by_agent[e["agent"]].append((e["start"], e["end"], e["worker"]))
    for agent, spans in by_agent.items():
        spans.sort()
        for (_s1, e1, w1), (s2, _e2, w2) in itertools.pairwise(spans):
            assert s2 >= e1 or w1 == w2, f"{agent} held by {w1} and {w2} at once"
    db.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
@pytest.mark.timeout(120)
def test_consumer_killed_holding_claims_loses_nothing(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    db = open_database(url)
    queue = Queue(db, directory=Directory.single("a1"))
    ids = [
        queue.intake.enqueue_message(ChatAddress("cli", "s", conversation="c"), f"job {i}").message_id
        for i in range(3)
    ]
    victim_log = tmp_path / "victim.log"
    victim = _spawn(
        "consumer",
        url,
        "--agents",
        "a1",
        "--worker",
        "victim",
        "--log",
        str(victim_log),
        "--hold-seconds",
        "60",
        "--lease-ms",
        "1500",
        stderr=subprocess.DEVNULL,
    )
    _wait_until(lambda: "claimed" in (victim_log.read_text() if victim_log.exists() else ""), 30, "the claim")
    assert {m.status for m in map(queue.admin.get_message, ids) if m} == {"processing"}
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    killed_at = now_ms()

    stop = tmp_path / "stop"
    rescuer_log = tmp_path / "rescuer.log"
    rescuer = _spawn(
        "consumer",
        url,
        "--agents",
        "a1",
        "--worker",
        "rescuer",
        "--log",
        str(rescuer_log),
        "--stop-file",
        str(stop),
    )
    _wait_until(lambda: queue.admin.queue_status()["completed"] == 3, 60, "the rescue")
    stop.touch()
    rescuer.communicate(timeout=30)

    for mid in ids:
        m = queue.admin.get_message(mid)
        # Merely claimed (no run of them had started): they come back uncharged, with no "interrupted" note.
        assert m is not None and m.status == "completed" and m.retry_count == 0 and m.interruptions == 0
        assert m.last_error is None
    completed = [e for e in _read_log([rescuer_log]) if e["event"] == "completed"]
    assert sorted(i for e in completed for i in e["ids"]) == sorted(ids)
    assert not [e for e in _read_log([victim_log]) if e["event"] == "completed"]
    assert db.read_scalar("SELECT COUNT(*) FROM responses") == 1
    # They came back only after the lease expired, not before (the worker id names no process on this host,
    # so only its lease speaks for it).
    claimed_again = db.read_scalar(
        "SELECT MIN(created_at) FROM events WHERE type = 'message_released' AND message_id = :m",
        {"m": ids[0]},
    )
    assert claimed_again is not None and int(claimed_again) >= killed_at - 1500
    db.close()
