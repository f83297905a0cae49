"""Wake-ups across processes: learn cheaply that the database changed, then run the real query.

- SQLite: an inotify watch of the database's folder (:mod:`shared.events.fswatch`) blocks until another process
  writes the write-ahead log; a dedicated read-only connection then reads the ``data_version`` pragma (a
  shared-memory read, no disk I/O, no lock), whose value changes whenever another connection commits. The
  watch also times out every second to check it anyway (a safety net for a missed event). Where inotify is
  unavailable, the thread polls ``data_version`` every ``interval_ms`` (``queue.wake_interval_ms``) instead.
- PostgreSQL: ``LISTEN agentpost``; writers ``NOTIFY`` inside their transaction.
- Writes made through this process's :class:`~shared.storage.db.Database` wake it directly.
- Always: callers pass a timeout (the 5 s fallback poll), so a lost signal costs latency, never work.

Waiting is generation-based: read :attr:`Waker.generation`, look for work, then ``wait(gen, timeout)``;
a change that lands between the look and the wait is not missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from shared.events.fswatch import open_watch
from shared.storage.db import Database, configure_sqlite
from shared.storage.dialect import pg_connect_args, sqlite_path
from shared.storage.queries import events as q

#: With a file watch, the data_version poll is only a safety net for a missed event.
WATCH_SAFETY_POLL_S = 1.0
COMMIT_SETTLE_TRIES = 20
COMMIT_SETTLE_S = 0.0005
READY_TIMEOUT_S = 5.0


class Waker:
    """One per process: a background thread that turns database changes into a generation bump.

    ``interval_ms`` is the SQLite poll period used only where no file watch is available."""

    def __init__(self, db: Database, *, interval_ms: int = 20) -> None:
        self.db = db
        self.interval = interval_ms / 1000
        self._cond = threading.Condition()
        self._generation = 0
        self._async_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        db.on_commit(self._local_commit)

    @property
    def generation(self) -> int:
        """A counter that grows each time a change is noticed."""
        return self._generation

    def start(self) -> Waker:
        if self._thread is None:
            target = self._listen_postgres if self.db.dialect.notifies_changes else self._poll_sqlite
            self._thread = threading.Thread(target=target, name="agentpost-waker", daemon=True)
            self._thread.start()
            # Return only once the watcher has its baseline (data_version read, LISTEN issued): a commit
            # made between a caller's "look for work" and that baseline would otherwise go unnoticed
            # until the fallback poll.
            self._ready.wait(READY_TIMEOUT_S)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)
            self._thread = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        self.notify()

    def __enter__(self) -> Waker:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def notify(self) -> None:
        """Bump the generation and wake every waiter (thread or coroutine)."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
            waiters = list(self._async_waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # the loop may have closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def _local_commit(self, _kinds: set[str]) -> None:
        # Which kinds of rows changed does not matter here: every waiter runs its own query next.
        self.notify()

    def wait(self, since: int, timeout: float) -> int:
        """Block until the generation differs from ``since`` or ``timeout`` seconds pass; returns it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._generation == since and not self._stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._generation

    def wait_for_change(self, timeout: float) -> None:
        """Wait for the next change after now (for simple loops that re-query anyway)."""
        self.wait(self._generation, timeout)

    async def wait_async(self, since: int, timeout: float) -> int:
        """The coroutine form of :meth:`wait` (asyncio backend)."""
        if self._generation != since:
            return self._generation
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        item = (loop, event)
        with self._cond:
            if self._generation != since:
                return self._generation
            self._async_waiters.add(item)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        finally:
            with self._cond:
                self._async_waiters.discard(item)
        return self._generation

    # -- SQLite ------------------------------------------------------------------------------------------
    def _poll_sqlite(self) -> None:
        path = Path(sqlite_path(self.db.url))
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        configure_sqlite(conn, self.db.busy_timeout_ms)
        self._conn = conn
        watch = open_watch(path.parent, {path.name + "-wal", path.name})
        last = conn.execute(q.DATA_VERSION).fetchone()[0]
        self._ready.set()

        def changed() -> bool:
            nonlocal last
            try:
                current = conn.execute(q.DATA_VERSION).fetchone()[0]
            except sqlite3.Error:
                return False
            if current == last:
                return False
            last = current
            self.notify()
            return True

        try:
            while not self._stop.is_set():
                if watch is None:
                    self._stop.wait(self.interval)
                    changed()
                    continue
                # Block until another process writes the WAL: no CPU while idle. A commit's frames reach
                # the file just before the commit becomes visible, so after a write look again briefly.
                if watch.wait(WATCH_SAFETY_POLL_S):
                    for _ in range(COMMIT_SETTLE_TRIES):
                        if changed() or self._stop.is_set():
                            break
                        time.sleep(COMMIT_SETTLE_S)
                else:
                    changed()
        finally:
            if watch is not None:
                watch.close()

    # -- PostgreSQL --------------------------------------------------------------------------------------
    def _listen_postgres(self) -> None:
        import psycopg  # only here: a process on SQLite never loads the PostgreSQL driver

        while not self._stop.is_set():
            try:
                conn = psycopg.connect(**pg_connect_args(self.db.url), autocommit=True)  # type: ignore[arg-type]
            except psycopg.Error:
                self._stop.wait(1.0)
                continue
            self._conn = conn
            try:
                conn.execute(q.LISTEN)
                self._ready.set()
                # After (re)connecting we may have missed notifications: wake everyone once.
                self.notify()
                while not self._stop.is_set():
                    # One notification at a time: a batch would hold the first one back until the timeout.
                    for _note in conn.notifies(timeout=0.5):
                        self.notify()
                        if self._stop.is_set():
                            break
            except psycopg.Error:
                if not self._stop.is_set():
                    self._stop.wait(0.5)
            finally:
                with contextlib.suppress(Exception):
                    conn.close()
                self._conn = None
