"""Peer and baseline queues for the benchmark, each used the way its documentation intends.

Every class implements `harness.QueueSystem`: picklable config only, connections opened in the processes.
Consumers yield a claimed id, ack it when resumed, and yield None when nothing is claimable.

Plain sqlite3 baselines (WAL, synchronous=NORMAL): `SqlitePerOp` (one transaction per operation),
`SqliteInsertEvent` (as per-op, but each enqueue also writes one event row in the same transaction: the
baseline of issue 17's "enqueue alone" target) and `SqliteClaimAgent` (one claim takes an agent's rows).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from harness import Msg, msg_id_of

PENDING, CLAIMED, DONE = 0, 1, 2


# ------------------------------------------------------------------------------- plain sqlite3 baseline


def _sqlite_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)  # autocommit; explicit BEGIN below
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


class SqlitePerOp:
    """Plain sqlite3, WAL, synchronous=NORMAL, one transaction per operation: the physical limit.

    enqueue: one INSERT (autocommit). claim: BEGIN IMMEDIATE; UPDATE ... RETURNING one row; COMMIT.
    ack: one UPDATE (autocommit). After an empty claim the next poll first probes read-only, so an idle
    consumer does not take the write lock. A (re)started consumer releases the rows its slot had claimed.
    """

    name: str = "sqlite-per-op"
    backend: Literal["sqlite", "postgres"] = "sqlite"
    max_n: int | None = None

    schema: ClassVar[tuple[str, ...]] = (
        "CREATE TABLE q (id INTEGER PRIMARY KEY, agent TEXT NOT NULL, body TEXT NOT NULL,"
        " state INTEGER NOT NULL DEFAULT 0, claimed_by INTEGER)",
        "CREATE INDEX q_pending ON q(id) WHERE state = 0",
    )
    claim_sql: ClassVar[str] = (
        "UPDATE q SET state = 1, claimed_by = ?"
        " WHERE id = (SELECT id FROM q WHERE state = 0 ORDER BY id LIMIT 1) RETURNING id, body"
    )

    def setup(self, target: str) -> None:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        conn = _sqlite_connect(target)
        for stmt in self.schema:
            conn.execute(stmt)
        conn.close()

    def producer(self, target: str, messages: Sequence[Msg]) -> Iterator[int]:
        conn = _sqlite_connect(target)

        def run() -> Iterator[int]:
            ins = "INSERT INTO q (id, agent, body) VALUES (?, ?, ?)"
            for m in messages:
                conn.execute(ins, (m.id, m.agent, m.body))
                yield m.id
            conn.close()

        return run()

    def consumer(self, target: str, slot: int) -> Iterator[int | None]:
        conn = _sqlite_connect(target)
        conn.execute("UPDATE q SET state = 0, claimed_by = NULL WHERE state = 1 AND claimed_by = ?", (slot,))

        def run() -> Iterator[int | None]:
            idle = False
            try:
                while True:
                    if idle and conn.execute("SELECT 1 FROM q WHERE state = 0 LIMIT 1").fetchone() is None:
                        yield None
                        continue
                    rows = self._claim(conn, slot)
                    idle = not rows
                    if idle:
                        yield None
                        continue
                    for msg_id, _body in rows:
                        yield msg_id
                        conn.execute("UPDATE q SET state = 2 WHERE id = ?", (msg_id,))
            finally:
                conn.close()

        return run()

    def _claim(self, conn: sqlite3.Connection, slot: int) -> list[tuple[int, str]]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            rows = conn.execute(self.claim_sql, (slot,)).fetchall()
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return rows


class SqliteInsertEvent(SqlitePerOp):
    """Plain sqlite3 as `SqlitePerOp`, but an enqueue is what agentpost's must at least do: the message row
    and one event row, atomically.

    enqueue: BEGIN IMMEDIATE; INSERT the message; INSERT into an `events`-like table (integer primary key,
    topic, type, message_id, ~60 bytes of JSON made per message, created_at); COMMIT. BEGIN IMMEDIATE as a
    writer that reads before writing would need it; here it also keeps the two inserts one transaction.
    The consumer is the per-op one: the figure this peer exists for is the producer's enq/s.
    """

    name = "sqlite-insert-event"
    schema = (
        *SqlitePerOp.schema,
        "CREATE TABLE events (id INTEGER PRIMARY KEY, topic TEXT NOT NULL, type TEXT NOT NULL,"
        " message_id INTEGER, payload TEXT NOT NULL, created_at INTEGER NOT NULL)",
    )

    def producer(self, target: str, messages: Sequence[Msg]) -> Iterator[int]:
        conn = _sqlite_connect(target)

        def run() -> Iterator[int]:
            ins = "INSERT INTO q (id, agent, body) VALUES (?, ?, ?)"
            event = "INSERT INTO events (topic, type, message_id, payload, created_at) VALUES (?, ?, ?, ?, ?)"
            for m in messages:
                # The payload is encoded per message, as a real event's would be (about 60 bytes).
                payload = json.dumps({"channel": "bench", "sender": "bench-user", "agent": m.agent})
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.execute(ins, (m.id, m.agent, m.body))
                    conn.execute(
                        event, ("messages", "message_received", m.id, payload, int(time.time() * 1000))
                    )
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                yield m.id
            conn.close()

        return run()


class SqliteClaimAgent(SqlitePerOp):
    """Plain sqlite3 as above, but one claim takes every pending row of one agent (the oldest's agent).

    Acks stay one transaction per message (each message is completed on its own).
    """

    name = "sqlite-claim-agent"
    schema = (
        "CREATE TABLE q (id INTEGER PRIMARY KEY, agent TEXT NOT NULL, body TEXT NOT NULL,"
        " state INTEGER NOT NULL DEFAULT 0, claimed_by INTEGER)",
        "CREATE INDEX q_pending ON q(id) WHERE state = 0",
        "CREATE INDEX q_pending_agent ON q(agent, id) WHERE state = 0",
    )
    claim_sql = (
        "UPDATE q SET state = 1, claimed_by = ?"
        " WHERE state = 0 AND agent = (SELECT agent FROM q WHERE state = 0 ORDER BY id LIMIT 1)"
        " RETURNING id, body"
    )

    def _claim(self, conn: sqlite3.Connection, slot: int) -> list[tuple[int, str]]:
        return sorted(super()._claim(conn, slot))  # RETURNING order is unspecified


# ------------------------------------------------------------------------------------------------ huey


class HueySqlite:
    """huey's SqliteStorage: enqueue(bytes) / dequeue(). At most once: dequeue deletes the row.

    Its defaults (WAL, `begin exclusive` for dequeue after a read-only `select 1` probe, synchronous left at
    SQLite's default, FULL) with a 30 s busy timeout instead of 5 s. Like huey's own consumer loop, which
    logs a failed dequeue and sleeps, a "database is locked" error counts as an empty poll; the producer
    retries a failed enqueue.
    """

    name: str = "huey-SqliteStorage"
    backend: Literal["sqlite", "postgres"] = "sqlite"
    max_n: int | None = None

    def _storage(self, target: str) -> Any:
        from huey.storage import SqliteStorage

        return SqliteStorage(name="bench", filename=target, timeout=30)

    def setup(self, target: str) -> None:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        self._storage(target).close()

    def producer(self, target: str, messages: Sequence[Msg]) -> Iterator[int]:
        storage = self._storage(target)

        def run() -> Iterator[int]:
            for m in messages:
                while True:
                    try:
                        storage.enqueue(m.body.encode())
                        break
                    except sqlite3.OperationalError:
                        time.sleep(0.001)
                yield m.id
            storage.close()

        return run()

    def consumer(self, target: str, slot: int) -> Iterator[int | None]:
        storage = self._storage(target)

        def run() -> Iterator[int | None]:
            try:
                while True:
                    try:
                        data = storage.dequeue()
                    except sqlite3.OperationalError:
                        data = None
                    yield None if data is None else msg_id_of(bytes(data))
            finally:
                storage.close()

        return run()


def _put_bodies(q: Any, messages: Sequence[Msg]) -> Iterator[int]:
    """A producer over a queue object with ``put`` and ``close`` (persist-queue, litequeue): put each
    message's body, yielding its id once put, then close the queue."""
    for m in messages:
        q.put(m.body)
        yield m.id
    q.close()


# --------------------------------------------------------------------------------------- persist-queue


class PersistQueueAck:
    """persist-queue SQLiteAckQueue: put / get(block=False) / ack(item), multithreading=True as its docs
    recommend for concurrent use. A new consumer's constructor runs auto_resume (its default), which puts
    every unacked row back to ready, those of live consumers too. Slow: its claim scans acked rows.
    """

    name: str = "persist-queue-SQLiteAckQueue"
    backend: Literal["sqlite", "postgres"] = "sqlite"
    max_n: int | None = 3000

    def _queue(self, target: str) -> Any:
        from persistqueue import SQLiteAckQueue

        return SQLiteAckQueue(target, multithreading=True, timeout=30.0)

    def setup(self, target: str) -> None:
        self._queue(target).close()

    def producer(self, target: str, messages: Sequence[Msg]) -> Iterator[int]:
        return _put_bodies(self._queue(target), messages)

    def consumer(self, target: str, slot: int) -> Iterator[int | None]:
        from persistqueue.exceptions import Empty

        q = self._queue(target)

        def run() -> Iterator[int | None]:
            try:
                while True:
                    try:
                        item = q.get(block=False)  # block=True waits on an in-process event only
                    except Empty:
                        yield None
                        continue
                    yield msg_id_of(item)
                    q.ack(item)
            finally:
                q.close()

        return run()


# ------------------------------------------------------------------------------------------- litequeue


class LiteQueueSystem:
    """litequeue LiteQueue: put / pop / done(message_id). Its pop is BEGIN IMMEDIATE + UPDATE ... RETURNING.
    Its own pragmas (WAL, synchronous=NORMAL); busy timeout 30 s.

    Crash recovery as its API offers it: when idle, retry() messages locked for longer than 1 s
    (list_locked), at most every 0.5 s.
    """

    name: str = "litequeue"
    backend: Literal["sqlite", "postgres"] = "sqlite"
    max_n: int | None = None
    lock_timeout_s: float = 1.0

    def _queue(self, target: str) -> Any:
        from litequeue import LiteQueue

        return LiteQueue(target, queue_name="bench", timeout=30.0)  # passed on to sqlite3.connect

    def setup(self, target: str) -> None:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        self._queue(target).close()

    def producer(self, target: str, messages: Sequence[Msg]) -> Iterator[int]:
        return _put_bodies(self._queue(target), messages)

    def consumer(self, target: str, slot: int) -> Iterator[int | None]:
        q = self._queue(target)

        def run() -> Iterator[int | None]:
            next_sweep = 0.0
            try:
                while True:
                    msg = q.pop()
                    if msg is not None:
                        yield msg_id_of(msg.data)
                        q.done(msg.message_id)
                        continue
                    now = time.monotonic()
                    if now >= next_sweep:
                        next_sweep = now + 0.5
                        for stale in list(q.list_locked(self.lock_timeout_s)):
                            q.retry(stale.message_id)
                    yield None
            finally:
                q.close()

        return run()


# ------------------------------------------------------------------------------------------ PostgreSQL


_PG_SCHEMA = (
    "DROP TABLE IF EXISTS q",
    "CREATE TABLE q (id bigint PRIMARY KEY, agent text NOT NULL, body text NOT NULL,"
    " state smallint NOT NULL DEFAULT 0)",
    "CREATE INDEX q_pending ON q(id) WHERE state = 0",
    "CREATE INDEX q_pending_agent ON q(agent, id) WHERE state = 0",
)


class PgSkipLocked:
    """PostgreSQL hand-written queue, FOR UPDATE SKIP LOCKED, one message per transaction.

    enqueue: one INSERT (autocommit). Consumer transaction: SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1,
    process, UPDATE state = done, COMMIT. A killed consumer's transaction rolls back, so the row is free.
    Sessions run with synchronous_commit=off: commits survive a process crash but not an OS crash, the
    durability of SQLite WAL + synchronous=NORMAL. `PgSkipLockedFsync` keeps the server default (on).
    """

    name: str = "pg-skip-locked"
    backend: Literal["sqlite", "postgres"] = "postgres"
    max_n: int | None = None
    sync_commit_off: bool = True

    def _connect(self, url: str, autocommit: bool) -> Any:
        import psycopg

        conn = psycopg.connect(url, autocommit=autocommit)
        if self.sync_commit_off:
            conn.execute("SET synchronous_commit = off")
            if not autocommit:
                conn.commit()
        return conn

    def setup(self, target: str) -> None:
        with self._connect(target, autocommit=True) as conn:
            for stmt in _PG_SCHEMA:
                conn.execute(stmt)

    def producer(self, target: str, messages: Sequence[Msg]) -> Iterator[int]:
        conn = self._connect(target, autocommit=True)

        def run() -> Iterator[int]:
            ins = "INSERT INTO q (id, agent, body) VALUES (%s, %s, %s)"
            for m in messages:
                conn.execute(ins, (m.id, m.agent, m.body), prepare=True)
                yield m.id
            conn.close()

        return run()

    def consumer(self, target: str, slot: int) -> Iterator[int | None]:
        conn = self._connect(target, autocommit=False)

        def run() -> Iterator[int | None]:
            try:
                while True:
                    ids = self._claim(conn)
                    if not ids:
                        conn.rollback()
                        yield None
                        continue
                    yield from ids
                    conn.execute("UPDATE q SET state = 2 WHERE id = ANY(%s)", (ids,), prepare=True)
                    conn.commit()
            finally:
                conn.close()

        return run()

    def _claim(self, conn: Any) -> list[int]:
        row = conn.execute(
            "SELECT id, body FROM q WHERE state = 0 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED", prepare=True
        ).fetchone()
        return [row[0]] if row else []


class PgSkipLockedAgent(PgSkipLocked):
    """As pg-skip-locked, but one transaction claims every pending row of one agent (SKIP LOCKED),
    processes them, marks them all done in one UPDATE and commits."""

    name = "pg-skip-locked-agent"

    def _claim(self, conn: Any) -> list[int]:
        row = conn.execute(
            "SELECT agent FROM q WHERE state = 0 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED", prepare=True
        ).fetchone()
        if row is None:
            return []
        rows = conn.execute(
            "SELECT id, body FROM q WHERE state = 0 AND agent = %s ORDER BY id FOR UPDATE SKIP LOCKED",
            (row[0],),
            prepare=True,
        ).fetchall()
        return [r[0] for r in rows]


class PgSkipLockedFsync(PgSkipLocked):
    """As pg-skip-locked with the server's default synchronous_commit=on: every commit waits for fsync."""

    name = "pg-skip-locked-fsync"
    max_n = 1000
    sync_commit_off = False


ALL_PEERS: tuple[type, ...] = (
    SqlitePerOp,
    SqliteInsertEvent,
    SqliteClaimAgent,
    HueySqlite,
    PersistQueueAck,
    LiteQueueSystem,
    PgSkipLocked,
    PgSkipLockedAgent,
    PgSkipLockedFsync,
)
