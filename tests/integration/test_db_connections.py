"""One driver connection per thread, and none left behind by threads that ended (worker threads come and
go: anyio retires idle ones), on both backends."""

from __future__ import annotations

import gc
import threading

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
