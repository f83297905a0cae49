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
def test_a_transaction_its_client_left_open_does_not_hold_back_every_reader(pg_url: str) -> None:
    """Issue 30: a client cut off by the network in the middle of a transaction (here: one that simply stops
    talking while its transaction is open, which is all the server sees of a partition) keeps that
    transaction running. Events are readable only below the oldest running transaction, so every reader of
    every host stops seeing new events (and the transaction keeps its row locks); before, until the server's
    TCP gave up (hours). Now the server ends that transaction after 5 s (shared/storage/dialect.py,
    PG_SESSION_OPTIONS), and it does not commit afterwards."""
    from shared.events.log import PendingEvent, SqlEventLog, append_events
    from shared.storage.schema import open_database

    stalled, other = open_database(pg_url), open_database(pg_url)
    holding, release = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def vanish_mid_transaction() -> None:
        try:
            with stalled.transaction() as tx:
                append_events(tx, [PendingEvent("held", {})])
                holding.set()
                release.wait(15)  # the client is gone: nothing more reaches the server
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=vanish_mid_transaction)
    thread.start()
    log = SqlEventLog(other)
    try:
        assert holding.wait(10)
        with other.transaction() as tx:
            append_events(tx, [PendingEvent("later", {})])  # committed at once ...
        began = time.monotonic()
        while not [e for e in log.read(None) if e.type == "later"]:  # ... readable once the other has ended
            assert time.monotonic() - began < 20
            time.sleep(0.05)
        waited = time.monotonic() - began
    finally:
        release.set()
        thread.join(30)
        stalled.close()
    types = [e.type for e in log.read(None)]
    other.close()
    assert 3.0 < waited < 9.0, f"readers saw the committed event {waited:.1f} s late"
    assert outcome and outcome[0] is not None, "the abandoned transaction must not commit afterwards"
    assert types == ["later"]
