"""One driver connection per thread, and none left behind by threads that ended (worker threads come and
go: anyio retires idle ones), on both backends."""

from __future__ import annotations

import gc
import threading
import time

import anyio
import pytest

from shared.aio import call
from shared.storage.db import Database

pytestmark = pytest.mark.integration


def _burst(db: Database, n: int) -> None:
    barrier = threading.Barrier(n)

    def use() -> None:
        barrier.wait(5)  # all alive at once: n threads, n connections
        assert db.read_scalar("SELECT 1") == 1

    threads = [threading.Thread(target=use) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)


def test_threads_that_end_take_their_connections_with_them(db: Database) -> None:
    base = db.open_connections()
    for _ in range(3):
        _burst(db, 6)
        gc.collect()
        assert db.open_connections() == base
    assert db.read_scalar("SELECT 1") == 1  # this thread's own connection still works


def test_store_calls_from_async_code_do_not_pile_up_connections(db: Database) -> None:
    async def burst() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(call, db.read_scalar, "SELECT 1")

    for _ in range(3):
        anyio.run(burst)
    gc.collect()
    # anyio keeps its idle workers for a while; at most one connection per worker it has.
    assert db.open_connections() <= 1 + 8


@pytest.mark.postgres
def test_a_transaction_its_client_left_open_does_not_stop_every_writer(pg_url: str) -> None:
    """Issue 30: a client cut off by the network in the middle of a transaction (here: one that simply stops
    talking while its transaction is open, which is all the server sees of a partition) holds the event-order
    lock. Every append of every other process waits for it; before, until the server's TCP gave up (hours).
    Now the server ends that transaction after 5 s (shared/storage/dialect.py, PG_SESSION_OPTIONS)."""
    from shared.events.log import PendingEvent, append_events
    from shared.storage.db import open_database

    stalled, other = open_database(pg_url), open_database(pg_url)
    holding, release = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def vanish_mid_transaction() -> None:
        try:
            with stalled.transaction() as tx:
                append_events(tx, [PendingEvent("held", {})])  # takes the lock, until commit
                holding.set()
                release.wait(15)  # the client is gone: nothing more reaches the server
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=vanish_mid_transaction)
    thread.start()
    try:
        assert holding.wait(10)
        began = time.monotonic()
        with other.transaction() as tx:
            append_events(tx, [PendingEvent("waited", {})])
        waited = time.monotonic() - began
    finally:
        release.set()
        thread.join(30)
        stalled.close()
    types = [r["type"] for r in other.read("SELECT type FROM events ORDER BY id")]
    other.close()
    assert 3.0 < waited < 9.0, f"the other writer waited {waited:.1f} s"
    assert outcome and outcome[0] is not None, "the abandoned transaction must not commit afterwards"
    assert types == ["waited"]
