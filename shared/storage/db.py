"""The connection seam: one SQLite file in WAL mode, or PostgreSQL, behind the same small interface.

A :class:`Database` hands out one driver connection per thread, runs transactions (:class:`Tx`) and tells
this process's waiters what a commit changed; the statements it runs are the named queries of
:mod:`shared.storage.queries`, with the engine's differences filled in by :mod:`shared.storage.dialect`. The
schema and its upgrades are :mod:`shared.storage.schema`. SQLAlchemy/SQLModel (and psycopg for a SQLite
database) are imported only when used: opening a database whose schema is current needs neither, which keeps
a short command such as `agentpost send` quick.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from shared.storage.dialect import (
    EVENTS_PER_TRANSACTION,
    Dialect,
    dialect_for_url,
    pg_connect_args,
    sqlalchemy_url,
    sqlite_path,
)
from shared.storage.errors import refuse_unwritable
from shared.storage.wal_checkpoint import CHECKPOINTER

if TYPE_CHECKING:
    from sqlalchemy import Engine

#: The schema version this code writes; equal to :data:`shared.storage.models.SCHEMA_VERSION` (checked whenever the
#: schema is created, and by the tests). Kept here so a current database is recognised without importing
#: SQLAlchemy and the models.
SCHEMA_VERSION = 2

#: WAL pages after which a commit checkpoints (4 KB pages: 16 MB).
WAL_CHECKPOINT_PAGES = 4000

Row = dict[str, Any]
_SIGNAL_RE = re.compile(r"^[a-z_]{1,32}$")
_GOOD_SIGNALS: set[str] = set()
Params = Mapping[str, Any]
_SQLITE_READONLY = 8

#: Per thread: the most a lock wait may last there, when a caller asked for less than the busy timeout.
_wait_limit = threading.local()


@contextlib.contextmanager
def lock_wait_limit(ms: int) -> Iterator[None]:
    """Within this block, on this thread, wait at most ``ms`` for another process's lock on the database
    (instead of the database's whole busy timeout), then fail with the usual "locked" error.

    For callers a person is waiting on — a web request, a CLI command — that should rather answer "busy,
    try again" quickly than hang for the full busy timeout behind a lock some other program holds.
    Processes that only work in the background keep the long timeout and simply wait."""
    previous: int | None = getattr(_wait_limit, "ms", None)
    _wait_limit.ms = ms if previous is None else min(ms, previous)
    try:
        yield
    finally:
        _wait_limit.ms = previous


class DBAPICursor(Protocol):
    description: Any
    rowcount: int
    lastrowid: Any  # sqlite3's new row id (None on drivers that have none)

    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...
    def fetchall(self) -> Sequence[Sequence[Any]]: ...
    def fetchone(self) -> Sequence[Any] | None: ...
    def executemany(self, sql: Any, params: Any, /) -> Any: ...


class DBAPIConnection(Protocol):
    def cursor(self) -> Any: ...
    def close(self) -> None: ...


class Tx:
    """One open transaction on one connection. Collects change signals to send at commit."""

    def __init__(self, db: Database, cursor: DBAPICursor) -> None:
        self.db = db
        self.dialect = db.dialect
        self._cur = cursor
        self.signals: set[str] = set()
        self._events_appended = 0

    def execute(self, sql: str, params: Params | Sequence[Any] = ()) -> DBAPICursor:
        """Run one statement (``:name`` parameters)."""
        self._cur.execute(self.dialect.sql(sql), params)
        return self._cur

    def execute_raw(self, sql: str, params: Params | Sequence[Any] = ()) -> DBAPICursor:
        """Run a statement already in the driver's parameter style (see :meth:`Dialect.sql`)."""
        self._cur.execute(sql, params)
        return self._cur

    def executemany_raw(self, sql: str, params: Sequence[Params]) -> None:
        self._cur.executemany(sql, params)

    def executemany(self, sql: str, params: Sequence[Params]) -> None:
        """Run one statement once per parameter set."""
        self._cur.executemany(self.dialect.sql(sql), params)

    def rows(self, sql: str, params: Params | Sequence[Any] = ()) -> list[Row]:
        """Run a statement and return its rows as dicts."""
        cur = self.execute(sql, params)
        description = cur.description  # psycopg builds it anew on every access
        if description is None:
            return []
        names = [d[0] for d in description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def tuples(self, sql: str, params: Params | Sequence[Any] = ()) -> tuple[list[str], list[Sequence[Any]]]:
        """Run a statement and return its column names and its rows as the driver's tuples (for hot paths
        that build their own objects: no dict per row)."""
        cur = self.execute(sql, params)
        description = cur.description
        if description is None:
            return [], []
        return [d[0] for d in description], list(cur.fetchall())

    def one(self, sql: str, params: Params | Sequence[Any] = ()) -> Row | None:
        found = self.rows(sql, params)
        return found[0] if found else None

    def insert(self, sql: str, params: Params) -> int | None:
        """Run one ``INSERT`` (without ``RETURNING``) into a table with an integer ``id``: the new row's id,
        or None when nothing was inserted (``ON CONFLICT DO NOTHING`` met an existing row)."""
        if self.dialect.id_by_returning:
            value = self.scalar(sql + " RETURNING id", params)
            return None if value is None else int(value)
        cur = self.execute(sql, params)
        return int(cur.lastrowid) if cur.rowcount == 1 and cur.lastrowid is not None else None

    def scalar(self, sql: str, params: Params | Sequence[Any] = ()) -> Any:
        row = self.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def signal(self, kind: str) -> None:
        """Wake other processes (and this one) once this transaction commits."""
        if kind not in _GOOD_SIGNALS:
            if not _SIGNAL_RE.match(kind):
                raise ValueError(f"signal kind {kind!r} must be lowercase letters and '_'")
            _GOOD_SIGNALS.add(kind)  # a handful of kinds exist: checked once each
        self.signals.add(kind)

    def event_ordinals(self, count: int) -> int:
        """Reserve the places of ``count`` events this transaction appends; returns the first. On
        PostgreSQL an event's id is its transaction's id and this place (:mod:`shared.storage.dialect`), so a
        transaction appends at most :data:`~shared.storage.dialect.EVENTS_PER_TRANSACTION` events."""
        first = self._events_appended
        if self.dialect.tx_event_id is not None and first + count > EVENTS_PER_TRANSACTION:
            raise ValueError(
                f"one transaction may append at most {EVENTS_PER_TRANSACTION} events; split the work"
            )
        self._events_appended = first + count
        return first


class Database:
    """A shared database. Thread-safe: each thread gets its own driver connection."""

    def __init__(self, url: str, *, busy_timeout_ms: int = 30_000) -> None:
        self.url = url
        self.dialect: Dialect = dialect_for_url(url)
        self.busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._all: list[Any] = []
        self._all_lock = threading.Lock()
        self._commit_listeners: list[Callable[[set[str]], None]] = []
        self._write_observers: list[Callable[[], None]] = []
        self._engine: Engine | None = None
        #: Bumped to make every thread open a new connection at its next use (see _after_failed_write).
        self._generation = 0
        #: The SQLite file whose log the background checkpointer keeps short (None on PostgreSQL).
        self._checkpoint_file: str | None = None
        if self.dialect.is_sqlite:
            Path(sqlite_path(url)).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._checkpoint_file = os.path.abspath(sqlite_path(url))

    # -- connections -------------------------------------------------------------------------------
    def _open(self) -> Any:
        if self.dialect.is_sqlite:
            refuse_unwritable(sqlite_path(self.url))
            conn = sqlite3.connect(
                sqlite_path(self.url),
                timeout=self.busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
            configure_sqlite(conn, self.busy_timeout_ms)
            return conn
        import psycopg

        return psycopg.connect(**pg_connect_args(self.url), autocommit=True)  # type: ignore[arg-type]

    def connection(self) -> Any:
        """This thread's driver connection (opened on first use, and again after the server dropped it)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and (
            self._local.generation != self._generation or (not self.dialect.is_sqlite and conn.closed)
        ):
            # The server went away (restart, network cut), or a connection of this process found the
            # file read-only: open a new connection, so the process resumes by itself once that is over.
            self._forget_connection()
            conn = None
        if conn is None:
            conn = self._open()
            self._local.conn = conn
            self._local.wait_ms = self.busy_timeout_ms
            self._local.generation = self._generation
            with self._all_lock:
                self._all.append(conn)
            # Worker threads come and go (anyio retires idle ones after 10 s): when this thread ends, its
            # thread-local guard goes with it and the connection is closed, instead of staying open (on
            # PostgreSQL, a server connection) for the life of the process.
            guard = _ThreadGuard()
            self._local.guard = guard
            self._local.retire = weakref.finalize(guard, _retire, self._all, self._all_lock, conn)
        if self.dialect.is_sqlite:
            wanted = self.lock_wait_ms()
            if self._local.wait_ms != wanted:
                conn.execute(f"PRAGMA busy_timeout = {int(wanted)}")
                self._local.wait_ms = wanted
        return conn

    def _forget_connection(self) -> None:
        """Close this thread's connection; the next use opens a fresh one."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        retire = getattr(self._local, "retire", None)
        self._local.retire = self._local.guard = None
        if retire is not None:
            retire()
        elif conn is not None:
            _retire(self._all, self._all_lock, conn)

    def open_connections(self) -> int:
        """How many driver connections this object holds open now (one per thread that used it)."""
        with self._all_lock:
            return len(self._all)

    def lock_wait_ms(self) -> int:
        """How long a lock wait may last on this thread now (see :func:`lock_wait_limit`)."""
        limit: int | None = getattr(_wait_limit, "ms", None)
        return self.busy_timeout_ms if limit is None else min(limit, self.busy_timeout_ms)

    def on_commit(self, listener: Callable[[set[str]], None]) -> None:
        """Call ``listener(signals)`` after each commit that raised change signals in this process."""
        self._commit_listeners.append(listener)

    def observe_writes(self, observer: Callable[[], None]) -> Callable[[], None]:
        """Call ``observer()`` in the committing thread after each write transaction of this process commits
        (tests count the transactions of a path with it; the observer may inspect the caller's stack).
        Returns a function that stops the observing."""
        self._write_observers.append(observer)
        return lambda: self._write_observers.remove(observer)

    def run_transaction(self, work: Callable[[Tx], None]) -> None:
        """``work(tx)`` in a write transaction of its own (for work written to join a caller's one)."""
        with self.transaction() as tx:
            work(tx)

    @contextlib.contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[Tx]:
        """A transaction: ``BEGIN IMMEDIATE`` for SQLite writes, so a writer never fails on upgrade."""
        conn = self.connection()
        cur = conn.cursor()
        begin = self.dialect.begin_write if write else "BEGIN"
        try:
            self._begin(cur, begin)
        except BaseException as exc:
            self._after_failed_write(exc)
            raise
        tx = Tx(self, cur)
        try:
            yield tx
        except BaseException as exc:
            with contextlib.suppress(Exception):
                cur.execute("ROLLBACK")
            self._after_failed_write(exc)
            raise
        try:
            cur.execute(self.dialect.commit_sql(tx.signals))
        except BaseException as exc:
            # A COMMIT refused by a full disk or a lock leaves the transaction open on this connection;
            # close it, or every later use of this thread's connection would fail too.
            with contextlib.suppress(Exception):
                cur.execute("ROLLBACK")
            self._after_failed_write(exc)
            raise
        if write and self._checkpoint_file is not None:
            CHECKPOINTER.wrote(self._checkpoint_file)
        if tx.signals:
            for listener in self._commit_listeners:
                listener(tx.signals)
        if write and self._write_observers:
            for observer in tuple(self._write_observers):
                observer()

    def _after_failed_write(self, exc: BaseException) -> None:
        # SQLite opens a file it may not write (mode 0444, a read-only disk) read-only, and that connection
        # stays read-only after the file is writable again: reopen it next time, so the process resumes.
        # Every thread's connection was opened the same way, so all of them are renewed (each by its own
        # thread, at its next use).
        code = getattr(exc, "sqlite_errorcode", 0) if isinstance(exc, sqlite3.Error) else 0
        if (code & 0xFF) == _SQLITE_READONLY:
            self._generation += 1

    def _begin(self, cur: Any, begin: str) -> None:
        # The busy timeout covers ordinary waits; this loop covers the rare SQLITE_BUSY that SQLite returns
        # without waiting (a WAL checkpoint or recovery in another process), so "locked" never escapes.
        deadline: float | None = None  # set at the first refusal: the usual first try costs no clock read
        while True:
            try:
                cur.execute(begin)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if deadline is None:
                    deadline = time.monotonic() + self.lock_wait_ms() / 1000
                elif time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def write_statement(self, sql: str, params: Params, signals: set[str]) -> list[Row]:
        """One writing statement that is a whole transaction by itself (PostgreSQL's autocommit), with the
        change ``signals`` it raises for this process's waiters — the same effect as a :meth:`transaction`
        holding only that statement, in one round trip instead of three."""
        if not self.dialect.single_statement_writes:
            raise RuntimeError("write_statement is for PostgreSQL; SQLite writes go through transaction()")
        try:
            cur = self.connection().cursor()
            cur.execute(self.dialect.sql(sql), params)
            description = cur.description  # psycopg builds it anew on every access
            names = [d[0] for d in description] if description is not None else []
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()] if names else []
        except BaseException as exc:
            self._after_failed_write(exc)
            raise
        if signals and rows:
            for listener in self._commit_listeners:
                listener(signals)
        for observer in tuple(self._write_observers):
            observer()
        return rows

    def write_statement_values(self, sql: str, params: Params) -> list[Sequence[Any]]:
        """:meth:`write_statement` for a statement whose columns the caller knows and that reports itself
        whether it changed anything: its rows as the driver's tuples (reading no column descriptions, which
        psycopg builds anew for every column on every access); the caller announces the change signals with
        :meth:`announce` when it did."""
        if not self.dialect.single_statement_writes:
            raise RuntimeError("write_statement is for PostgreSQL; SQLite writes go through transaction()")
        try:
            cur = self.connection().cursor()
            cur.execute(self.dialect.sql(sql), params)
            rows = list(cur.fetchall())
        except BaseException as exc:
            self._after_failed_write(exc)
            raise
        for observer in tuple(self._write_observers):
            observer()
        return rows

    def announce(self, signals: set[str]) -> None:
        """Wake this process's waiters for ``signals``, as a committed transaction that raised them does."""
        for listener in self._commit_listeners:
            listener(signals)

    def read(self, sql: str, params: Params | Sequence[Any] = ()) -> list[Row]:
        """A single read statement outside any explicit transaction (autocommit snapshot)."""
        cur = self.connection().cursor()
        cur.execute(self.dialect.sql(sql), params)
        description = cur.description  # psycopg builds it anew on every access
        if description is None:
            return []
        names = [d[0] for d in description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def read_scalar(self, sql: str, params: Params | Sequence[Any] = ()) -> Any:
        cur = self.connection().cursor()
        cur.execute(self.dialect.sql(sql), params)
        row = cur.fetchone()
        return None if row is None else row[0]

    # -- schema ------------------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        """A SQLAlchemy engine for schema work and ad-hoc SQLModel sessions."""
        if self._engine is None:
            from sqlalchemy import create_engine, event
            from sqlalchemy.pool import NullPool

            engine = create_engine(sqlalchemy_url(self.url), poolclass=NullPool)
            if self.dialect.is_sqlite:
                busy = self.busy_timeout_ms

                @event.listens_for(engine, "connect")
                def _on_connect(dbapi_conn: Any, _record: Any) -> None:
                    configure_sqlite(dbapi_conn, busy)

            self._engine = engine
        return self._engine

    def close(self) -> None:
        """Close every connection this object opened (in any thread)."""
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()
        self._local = threading.local()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


class _ThreadGuard:
    """Lives exactly as long as one thread's connection may be used (held only by the thread's locals)."""


def _retire(conns: list[Any], lock: threading.Lock, conn: Any) -> None:
    """Close a connection whose thread is gone (or that is being replaced) and forget it."""
    with lock, contextlib.suppress(ValueError):
        conns.remove(conn)
    with contextlib.suppress(Exception):
        conn.close()


def configure_sqlite(conn: Any, busy_timeout_ms: int) -> None:
    """WAL, ``synchronous=NORMAL`` (durable across process crashes; a power cut may lose the last
    commits) and a busy timeout, on every SQLite connection we open."""
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA temp_store = MEMORY")
    # Checkpoints run in the background (shared.storage.wal_checkpoint); the commit that crosses this many WAL
    # pages runs one itself only when that falls behind (16 MB instead of SQLite's 4 MB: rarer still).
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
