"""SQLite's WAL checkpoints, run by a background thread instead of inside somebody's commit.

SQLite checkpoints from the commit that makes the write-ahead log cross ``wal_autocheckpoint`` pages: that
commit returns only after the log was flushed to disk and copied into the database file. With 16 MB of log
that is tens of milliseconds, paid by whichever caller happened to commit then — a claim in the processor, an
enqueue behind a webhook — and it was the whole of the 99th-percentile pickup latency at a steady 200
messages/s (bench/latency.py: p99 35 ms with inline checkpoints, 1.4 ms without any).

So every process that writes asks for a checkpoint after its commits, and one thread per process runs a
``PASSIVE`` checkpoint (it never waits for, or blocks, a reader or a writer) on a short-lived connection of
its own, at most every :data:`CHECKPOINT_INTERVAL_S`. The log stays small, so the automatic checkpoint the
connections still have (``shared.storage.db.WAL_CHECKPOINT_PAGES``) only fires if this thread falls behind (a reader
holding an old snapshot), and then finds little left to copy.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

from shared.storage.errors import DatabaseNotWritable, refuse_unwritable

log = logging.getLogger("agentpost.db")

#: At most this often per database: each checkpoint flushes what was written since the one before.
CHECKPOINT_INTERVAL_S = 0.25


class Checkpointer:
    """Checkpoints the SQLite files this process wrote to, off the committing threads.

    :meth:`wrote` is called after each write commit (cheap: a set lookup, a lock once per round);
    :meth:`run_pending` checkpoints what is due in the calling thread — the background thread's one step,
    and what tests call to run it to idle.
    """

    def __init__(self, interval_s: float = CHECKPOINT_INTERVAL_S, *, background: bool = True) -> None:
        self.interval_s = interval_s
        #: False: no thread; :meth:`run_pending` is called by the owner (tests drive it so).
        self.background = background
        self._pending: set[str] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._owner_pid = 0
        self._stop = threading.Event()

    def wrote(self, path: str) -> None:
        """The SQLite file ``path`` has new commits in its log: checkpoint it soon."""
        if path in self._pending:
            return
        with self._cond:
            self._pending.add(path)
            self._cond.notify()
        if self.background and self._owner_pid != os.getpid():  # first use, or a forked child's first
            self._start()

    def run_pending(self) -> int:
        """Checkpoint every file written since the last round; returns how many were checkpointed."""
        with self._cond:
            due, self._pending = self._pending, set()
        done = 0
        for path in sorted(due):
            done += checkpoint(path)
        return done

    def stop(self) -> None:
        """Stop the background thread (what is pending stays pending until the next :meth:`wrote`)."""
        self._stop.set()
        with self._cond:
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._thread, self._owner_pid = None, 0
        self._stop = threading.Event()

    def _start(self) -> None:
        with self._cond:
            if self._owner_pid == os.getpid():
                return
            self._owner_pid = os.getpid()
            self._thread = threading.Thread(
                target=self._loop, args=(self._stop,), name="agentpost-wal-checkpoint", daemon=True
            )
            self._thread.start()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self._cond:
                while not self._pending and not stop.is_set():
                    self._cond.wait()
            if stop.is_set():
                return
            self.run_pending()
            stop.wait(self.interval_s)  # what commits meanwhile waits for the next round


def checkpoint(path: str) -> int:
    """One ``PASSIVE`` checkpoint of the SQLite file ``path``; 1 when it ran, 0 when it could not (the file
    is gone or unwritable, the disk is full, another connection was checkpointing): the next round, or the
    connections' own automatic checkpoint, catches up."""
    if not Path(path).exists():
        return 0
    try:
        # Never a read-only connection: it would make this process's shared -shm mapping read-only too.
        refuse_unwritable(path)
        # mode=rw: never create a file that was removed meanwhile; timeout 0: never wait for a lock.
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=0, isolation_level=None)
    except (sqlite3.Error, DatabaseNotWritable) as exc:
        log.debug("no WAL checkpoint of %s: %s", path, exc)
        return 0
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        return 1
    except sqlite3.Error as exc:
        log.debug("WAL checkpoint of %s did not run: %s", path, exc)
        return 0
    finally:
        conn.close()


#: The process's checkpointer, shared by every :class:`shared.storage.db.Database` on SQLite.
CHECKPOINTER = Checkpointer()
