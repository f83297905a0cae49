"""Storage trouble, recognised once: what a database error means for the person waiting on it.

A locked SQLite file, a full disk, a read-only file or disk, an unreachable PostgreSQL server: none of them is
a bug, none of them loses what was already stored, and all of them clear up on their own or after an
operator's fix. Every entry point (the web API, the CLI, the live streams) asks :func:`storage_problem`
whether an exception is such trouble, and if so answers with a short temporary refusal — HTTP 503 with
``Retry-After``, or one line on stderr naming the cause and the database — instead of a 500 or a traceback.

Anything not recognised here (a malformed database, a programming error) is *not* storage trouble and keeps
its usual handling, so a real bug is never disguised as "try again later".
"""

from __future__ import annotations

import errno
import os
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

Kind = Literal["locked", "disk_full", "read_only", "cannot_open", "io_error", "unreachable", "busy"]

#: Seconds a client should wait before trying again, per kind: a lock is usually gone in a moment; a full
#: disk or a read-only file needs a person, so asking again every second would only add load.
RETRY_AFTER: dict[Kind, int] = {
    "locked": 2,
    "busy": 2,
    "unreachable": 5,
    "io_error": 10,
    "disk_full": 30,
    "read_only": 30,
    "cannot_open": 30,
}

#: SQLite's primary result codes (the low byte of an extended code).
_SQLITE_KINDS: dict[int, Kind] = {
    5: "locked",  # SQLITE_BUSY: another connection holds the lock
    6: "locked",  # SQLITE_LOCKED: a table lock inside the same file
    8: "read_only",  # SQLITE_READONLY
    10: "io_error",  # SQLITE_IOERR (also what a full disk looks like while growing the WAL index)
    13: "disk_full",  # SQLITE_FULL
    14: "cannot_open",  # SQLITE_CANTOPEN
}
#: The same, by message, for errors that carry no code (raised by hand, older Pythons).
_SQLITE_MESSAGES: list[tuple[str, Kind]] = [
    ("database is locked", "locked"),
    ("database table is locked", "locked"),
    ("database schema is locked", "locked"),
    ("database or disk is full", "disk_full"),
    ("readonly database", "read_only"),
    ("read-only", "read_only"),
    ("unable to open database file", "cannot_open"),
    ("disk i/o error", "io_error"),
]
#: PostgreSQL SQLSTATEs that are trouble with the server, not with the request.
_PG_KINDS: dict[str, Kind] = {
    "53100": "disk_full",  # disk_full
    "53200": "busy",  # out_of_memory
    "53300": "busy",  # too_many_connections
    "25006": "read_only",  # read_only_sql_transaction (a standby, or default_transaction_read_only)
    "55P03": "locked",  # lock_not_available (lock_timeout)
    "57P01": "unreachable",  # admin_shutdown
    "57P02": "unreachable",  # crash_shutdown
    "57P03": "unreachable",  # cannot_connect_now (starting up or shutting down)
    "08000": "unreachable",  # connection_exception and its subclasses below
    "08003": "unreachable",
    "08006": "unreachable",
    "08001": "unreachable",
    "08004": "unreachable",
}
_OS_KINDS: dict[int, Kind] = {
    errno.ENOSPC: "disk_full",
    errno.EDQUOT: "disk_full",
    errno.EROFS: "read_only",
}


class DatabaseNotWritable(PermissionError):
    """The SQLite file (or its ``-wal``/``-shm``) exists but this process may not write it. An ``OSError``,
    so whatever handles file-system errors handles this one too."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.EACCES, "not writable by this process", path)
        self.path = path


@dataclass(frozen=True)
class StorageProblem:
    """One recognised storage fault, with words for an operator and for a remote client."""

    kind: Kind
    #: Names the database for an operator: its file, or the PostgreSQL server and database name (never a
    #: password).
    database: str
    detail: str

    @property
    def retry_after(self) -> int:
        return RETRY_AFTER[self.kind]

    def describe(self) -> str:
        """A sentence for someone on this machine (CLI, logs): the cause, the database, what to do."""
        db = f" {self.database}" if self.database else ""
        return {
            "locked": f"the database{db} is locked by another process; try again in a moment",
            "busy": f"the database{db} is overloaded right now; try again in a moment",
            "disk_full": f"the disk holding the database{db} is full; free some space, then try again",
            "read_only": f"the database{db} is read-only (the file or its disk cannot be written); "
            "make it and its -wal and -shm files writable, then try again",
            "cannot_open": f"the database{db} cannot be opened (its folder is missing or not accessible)",
            "io_error": f"the database{db} could not be read or written (a disk error); try again shortly",
            "unreachable": f"the database server{db} cannot be reached; try again when it is back",
        }[self.kind]

    def public(self) -> str:
        """A sentence for a remote client: the same cause, without the server's file names."""
        return {
            "locked": "the server's database is busy (locked by another process); try again in a moment",
            "busy": "the server's database is overloaded; try again in a moment",
            "disk_full": "the server's disk is full, so nothing new can be stored; try again later",
            "read_only": "the server's database is read-only right now; try again later",
            "cannot_open": "the server cannot open its database right now; try again later",
            "io_error": "the server's database had a disk error; try again shortly",
            "unreachable": "the server cannot reach its database right now; try again shortly",
        }[self.kind]


def describe_database(url: str | None) -> str:
    """How to name the database of ``url`` to a person: the SQLite file path, or ``host:port/name``."""
    if not url:
        return ""
    if url.startswith("sqlite:///"):
        return url[len("sqlite:///") :]
    try:
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        port = f":{parts.port}" if parts.port else ""
        return f"{host}{port}{parts.path or ''}"
    except ValueError:
        return "(PostgreSQL)"


def storage_problem(exc: BaseException, url: str | None = None) -> StorageProblem | None:
    """The storage fault behind ``exc`` (or one it was raised from), or ``None`` when it is something else."""
    for err in _chain(exc):
        kind = _kind(err)
        if kind is not None:
            if kind in ("cannot_open", "io_error") and _sqlite_unwritable(url):
                # SQLite says only "unable to open" when a WAL database sits on a read-only disk (it
                # cannot create the -shm file): the file system tells the real cause.
                kind = "read_only"
            return StorageProblem(kind=kind, database=describe_database(url), detail=str(err)[:300])
    return None


def transient_problem(exc: BaseException, url: str | None = None) -> StorageProblem | None:
    """The storage fault behind ``exc`` when writing the same thing again later can succeed, else ``None``.

    Every recognised kind is a state of the storage, not of the request, and clears on its own (a lock, a
    restarting server) or after an operator's fix (space freed, the file made writable): a long-running
    process keeps what it could not write and writes it again, instead of dropping it. The one judgement
    lives here so every process makes it alike; anything unrecognised (a bug, a malformed database) is
    not retried."""
    problem = storage_problem(exc, url)
    return problem if problem is not None and problem.kind in TRANSIENT_KINDS else None


#: The kinds :func:`transient_problem` retries: all of them (see there); kept as a set so a kind added
#: later must be placed on purpose.
TRANSIENT_KINDS: frozenset[Kind] = frozenset(RETRY_AFTER)


def _sqlite_unwritable(url: str | None) -> bool:
    """True when the SQLite file of ``url`` exists and this process may not write it or its folder."""
    if not url or not url.startswith("sqlite:///"):
        return False
    path = url[len("sqlite:///") :]
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.exists(path) and not (os.access(path, os.W_OK) and os.access(folder, os.W_OK))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the driver error SQLAlchemy wrapped (``.orig``), and what it was raised from."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        err = todo.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        yield err
        orig = getattr(err, "orig", None)
        for nxt in (orig, err.__cause__, err.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def _kind(err: BaseException) -> Kind | None:
    if isinstance(err, DatabaseNotWritable):
        return "read_only"
    if isinstance(err, sqlite3.Error):
        code = getattr(err, "sqlite_errorcode", None)
        if isinstance(code, int) and (code & 0xFF) in _SQLITE_KINDS:
            return _SQLITE_KINDS[code & 0xFF]
        text = str(err).lower()
        return next((kind for needle, kind in _SQLITE_MESSAGES if needle in text), None)
    # psycopg is imported only where PostgreSQL is used (short CLI commands on SQLite never load it): an
    # error can only be one of its errors once it is loaded.
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(err, psycopg.Error):
        state = err.sqlstate
        if state is not None:
            return _PG_KINDS.get(state)
        # No SQLSTATE: the client library itself failed (refused, reset, timed out, server gone).
        return "unreachable" if isinstance(err, psycopg.OperationalError) else None
    if isinstance(err, OSError) and err.errno is not None:
        return _OS_KINDS.get(err.errno)
    return None


def refuse_unwritable(path: str) -> None:
    """Raise :class:`~shared.storage.errors.DatabaseNotWritable` when this process may not write the SQLite
    file (or its ``-wal``/``-shm`` companions).

    SQLite would otherwise open such a file read-only without a word, and that connection — and, through
    the shared ``-shm`` mapping, every later one of this process — would keep refusing writes even after
    the file is writable again. Refused here, nothing read-only is ever opened, so the process resumes
    as soon as the file is fixed."""
    for name in (path, f"{path}-wal", f"{path}-shm"):
        # A refusal is looked at twice more: SQLite removes the -wal and -shm files when another process's
        # last connection closes and makes them again at the next open, so a file that vanished or appeared
        # meanwhile is not "unwritable". (os.access, never an open: closing a descriptor of a database file
        # would drop this process's own locks on it.)
        if not os.access(name, os.W_OK) and os.path.exists(name) and not os.access(name, os.W_OK):
            raise DatabaseNotWritable(name)
