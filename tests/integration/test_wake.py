"""Wake-ups across processes: a commit in another OS process wakes a waiting one quickly."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.events.wake import Waker
from shared.storage.schema import open_database

pytestmark = pytest.mark.integration

ENQUEUE = (
    "import sys, time; from shared.storage.schema import open_database; from shared.queue.core import Queue;"
    "from shared.chat.address import ChatAddress; db = open_database(sys.argv[1], create=False);"
    "Queue(db).intake.enqueue_message(ChatAddress('cli', 's'), 'wake up');"
    "print(time.monotonic()); db.close()"
)
# Measured once the waker has settled: on PostgreSQL its listener imports psycopg and connects in the
# background right after start, a one-off cost that is not the idle cost.
IDLE = (
    "import resource, sys, time; from shared.storage.schema import open_database; from shared.events.wake import Waker;"
    "db = open_database(sys.argv[1], create=False); w = Waker(db).start(); time.sleep(1.0);"
    "r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.monotonic(); time.sleep(6);"
    "r1 = resource.getrusage(resource.RUSAGE_SELF); w.stop();"
    "print((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / (time.monotonic() - t0))"
)


def test_another_process_commit_wakes_a_thread_waiter(db_url: str) -> None:
    db = open_database(db_url)
    try:
        with Waker(db) as waker:
            # Let the listener settle (PostgreSQL LISTEN connects in the background and wakes once).
            deadline = time.monotonic() + 10
            while waker._conn is None and time.monotonic() < deadline:
                time.sleep(0.01)
            waker.wait(waker.generation, 0.2)
            gen = waker.generation
            woke: list[float] = []
            watcher = threading.Thread(target=lambda: (waker.wait(gen, 30.0), woke.append(time.monotonic())))
            watcher.start()
            out = subprocess.run(
                [sys.executable, "-c", ENQUEUE, db_url],
                check=True,
                timeout=60,
                capture_output=True,
                text=True,
            )
            committed_at = float(out.stdout.strip())
            watcher.join(timeout=30)
            assert woke and waker.generation != gen, "no wake-up"
            # The monotonic clock is system-wide: this is commit-to-wake latency, far below the 5 s fallback.
            assert woke[0] - committed_at < 1.0, f"woke {woke[0] - committed_at:.3f} s after the commit"
    finally:
        db.close()


def test_local_commit_wakes_an_async_waiter_at_once(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    from shared.queue.core import Queue

    async def scenario() -> float:
        with Waker(db, interval_ms=1000) as waker:  # slow poll: only the in-process signal can be fast
            gen = waker.generation
            loop = asyncio.get_running_loop()
            t0 = time.monotonic()
            loop.call_later(0.05, lambda: Queue(db).intake.enqueue_message(ChatAddress("cli", "s"), "local"))
            assert await waker.wait_async(gen, 5.0) != gen
            return time.monotonic() - t0

    assert asyncio.run(scenario()) < 0.5
    db.close()


def test_wait_times_out_without_changes(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    with Waker(db) as waker:
        gen = waker.generation
        t0 = time.monotonic()
        assert waker.wait(gen, 0.3) == gen
        assert time.monotonic() - t0 >= 0.29
    db.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_an_idle_waiting_process_costs_a_small_share_of_a_core(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    open_database(url).close()
    out = subprocess.run(
        [sys.executable, "-c", IDLE, url], check=True, capture_output=True, text=True, timeout=60
    )
    share = float(out.stdout.strip())
    # SQLite: well under 1 %. PostgreSQL measured ~1.1 % at the end of this session (0.2 % earlier; not yet
    # explained, named in the session note), so its bound is 2 %: a waker that spins would be near 100 %.
    limit = 0.01 if backend == "sqlite" else 0.02
    assert share < limit, f"idle waker used {share:.2%} of a core"
