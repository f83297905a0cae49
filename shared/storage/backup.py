"""A consistent copy of the live database while every process keeps working (``agentpost backup``, and the
scheduler's backup job), and the counts that say what a database or a copy holds.

SQLite: the online backup API (:meth:`sqlite3.Connection.backup`) copies the file page by page inside one
read transaction, so the copy is one snapshot and, in WAL mode, writers are never held off (a reader does not
block them; the step size only paces the progress reports, and a write between steps cannot restart the copy
as it would without that transaction). The copy is made a single self-contained file (rollback journal, not
WAL). PostgreSQL: ``pg_dump`` in its custom format (``-Fc``), on a snapshot exported by a transaction that
reads the counts first, so the counts printed are exactly what the dump holds.

Either way the copy is written to a hidden file beside the destination and renamed onto it only when
complete (and synced), so a failed or interrupted backup never leaves a half file under the name asked for.
Restoring a copy is :mod:`shared.storage.restore`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.storage.db import Database, Row
from shared.storage.dialect import libpq_url
from shared.storage.queries import backup as q

#: Pages copied per step of a SQLite backup (4 KiB pages: 4 MiB), between two progress reports.
STEP_PAGES = 1024

#: Where each PostgreSQL client program comes from, for the error when one is missing.
PG_CLIENT_PACKAGES = (
    "install PostgreSQL's client programs, the server's major version or newer "
    "(Debian/Ubuntu: apt install postgresql-client; Fedora/RHEL: dnf install postgresql; "
    "macOS: brew install libpq)"
)


class BackupError(Exception):
    """A backup or restore was refused or failed; the message says why and what to do (nothing was
    changed unless it says so)."""


@dataclass(frozen=True)
class Progress:
    """How far a copy has come: ``done`` of ``total`` units (pages, or tables for pg_dump)."""

    done: int
    total: int
    unit: str
    note: str = ""

    @property
    def percent(self) -> int:
        return 100 if self.total <= 0 else min(100, int(self.done * 100 / self.total))


ProgressFn = Callable[[Progress], None]


@dataclass(frozen=True)
class Counts:
    """What a database (or a copy) holds, in the terms an operator uses."""

    messages: dict[str, int] = field(default_factory=dict)
    responses: dict[str, int] = field(default_factory=dict)
    events: int = 0
    agents: int = 0
    chats: int = 0
    history: int = 0

    @property
    def empty(self) -> bool:
        """True when there is nothing a person would miss: no message, reply, event or history entry."""
        return not (
            sum(self.messages.values()) or sum(self.responses.values()) or self.events or self.history
        )

    def lines(self) -> list[str]:
        """One line per kind, e.g. ``messages: 120 (completed 100, pending 20)``."""
        return [
            f"messages: {_with_statuses(self.messages)}",
            f"replies: {_with_statuses(self.responses)}",
            f"events: {self.events}",
            f"agents: {self.agents}, chats: {self.chats} (with messages in the queue)",
            f"conversation history: {self.history} entries",
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": dict(self.messages),
            "responses": dict(self.responses),
            "events": self.events,
            "agents": self.agents,
            "chats": self.chats,
            "history": self.history,
        }


def _with_statuses(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    if not total:
        return "0"
    parts = ", ".join(f"{status} {n}" for status, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{total} ({parts})"


Reader = Callable[[str], list[Row]]


def read_counts(read: Reader) -> Counts:
    """The counts, through ``read(sql)`` (a database's, a transaction's or a copy's reader)."""

    def by_status(sql: str) -> dict[str, int]:
        return {str(r["status"]): int(r["n"]) for r in read(sql)}

    def one(sql: str) -> int:
        return int(read(sql)[0]["n"] or 0)

    return Counts(
        messages=by_status(q.MESSAGES_BY_STATUS),
        responses=by_status(q.RESPONSES_BY_STATUS),
        events=one(q.EVENTS),
        agents=one(q.AGENTS),
        chats=one(q.CHATS),
        history=one(q.HISTORY),
    )


def sqlite_reader(conn: sqlite3.Connection) -> Reader:
    """A :data:`Reader` over a plain sqlite3 connection (a copy opened by itself)."""

    def read(sql: str) -> list[Row]:
        cur = conn.execute(sql)
        names = [d[0] for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    return read


def database_counts(db: Database) -> Counts | None:
    """What ``db`` holds; None when it has no agentpost tables yet (a new, empty database)."""
    try:
        return read_counts(db.read)
    except Exception as exc:
        if _no_such_table(exc):
            return None
        raise


def database_created_at(db: Database) -> int | None:
    """When the database was created (epoch ms: its first schema version), or None when unknown."""
    try:
        found = db.read_scalar(q.CREATED_AT)
    except Exception as exc:
        if _no_such_table(exc):
            return None
        raise
    return None if found is None else int(found)


def _no_such_table(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "no such table" in text or ("relation" in text and "does not exist" in text)


@dataclass(frozen=True)
class BackupResult:
    """A finished backup: the file, its size, what it holds and how long it took."""

    path: Path
    size: int
    counts: Counts
    seconds: float


def check_destination(dest: Path, *, force: bool) -> Path:
    """``dest`` as an absolute path when a backup may be written there, else a :class:`BackupError` that
    says what to do (an existing file is replaced only with ``force``)."""
    dest = dest.expanduser().absolute()
    if dest.is_dir():
        raise BackupError(f"{dest} is a folder; give the backup a file name inside it")
    if dest.exists() and not force:
        raise BackupError(f"{dest} exists already; choose another name, or add --force to replace it")
    folder = dest.parent
    if not folder.is_dir():
        raise BackupError(f"the folder {folder} does not exist; create it first (mkdir -p {folder})")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BackupError(f"cannot write in the folder {folder}; choose a folder this user may write to")
    return dest


def take_backup(
    db: Database,
    dest: Path,
    *,
    force: bool = False,
    progress: ProgressFn | None = None,
    step_pages: int = STEP_PAGES,
) -> BackupResult:
    """Copy ``db`` to the file ``dest`` while other processes keep reading and writing it.

    Raises :class:`BackupError` when the destination is refused, the disk is full, pg_dump is missing or
    fails; the destination is then as it was before."""
    dest = check_destination(dest, force=force)
    report = progress or (lambda _p: None)
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    started = time.monotonic()
    try:
        if db.dialect.is_sqlite:
            counts = _sqlite_copy(db, partial, report, step_pages)
        else:
            counts = _pg_dump(db, partial, report)
        os.chmod(partial, 0o600)  # every chat's content: for agentpost's user only, wherever it is put
        _sync(partial)
        os.replace(partial, dest)
        _sync(dest.parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        full = _disk_full(exc, dest.parent)
        if full is not None:
            raise full from None
        if isinstance(exc, OSError):
            raise BackupError(f"cannot write {dest}: {exc.strerror or exc}") from None
        raise
    return BackupResult(dest, dest.stat().st_size, counts, time.monotonic() - started)


def _sqlite_copy(db: Database, partial: Path, report: ProgressFn, step_pages: int) -> Counts:
    target = sqlite3.connect(partial, isolation_level=None)
    try:
        with db.transaction(write=False) as tx:
            # The read that starts the snapshot every step of the copy then reads from.
            tx.scalar(q.SCHEMA_VERSION)

            def step(_status: int, remaining: int, total: int) -> None:
                report(Progress(total - remaining, total, "pages"))

            db.connection().backup(target, pages=step_pages, progress=step)
        target.execute(q.SINGLE_FILE).fetchall()
        return read_counts(sqlite_reader(target))
    finally:
        target.close()


def pg_tool(name: str) -> str:
    """The path of a PostgreSQL client program, or a :class:`BackupError` naming the package."""
    found = shutil.which(name)
    if found is None:
        raise BackupError(f"{name} is not on PATH: {PG_CLIENT_PACKAGES}")
    return found


def pg_tool_target(url: str) -> tuple[str, dict[str, str]]:
    """The connection string for a client program's ``-d`` and its environment: the password goes in
    ``PGPASSWORD``, never on the command line (which every user of the machine can read)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = {k: str(v) for k, v in conninfo_to_dict(libpq_url(url)).items()}
    env = dict(os.environ)
    password = params.pop("password", None)
    if password:
        env["PGPASSWORD"] = password
    return make_conninfo(**params), env


def _pg_dump(db: Database, partial: Path, report: ProgressFn) -> Counts:
    binary = pg_tool("pg_dump")
    conninfo, env = pg_tool_target(db.url)
    with db.transaction(write=False) as tx:
        if db.dialect.snapshot_sql is not None:
            tx.execute(db.dialect.snapshot_sql)
        tx.execute(q.NO_IDLE_LIMIT)
        snapshot = str(tx.scalar(q.EXPORT_SNAPSHOT))
        counts = read_counts(tx.rows)
        command = [binary, "-Fc", "--verbose", "--no-password", f"--snapshot={snapshot}", "-f", str(partial)]
        run_pg_tool([*command, "-d", conninfo], env, report, "dumping contents of table", "pg_dump")
    return counts


def run_pg_tool(command: list[str], env: dict[str, str], report: ProgressFn, marker: str, name: str) -> None:
    """Run a PostgreSQL client program, reporting each line of its ``--verbose`` output that contains
    ``marker`` as one table done; a failure raises :class:`BackupError` with what it said."""
    from shared.storage.models import TABLE_NAMES  # SQLAlchemy's models: only when a tool runs

    tables = len(TABLE_NAMES)
    done = 0
    tail: list[str] = []
    with subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            text = line.strip()
            if marker in text:
                done += 1
                report(Progress(min(done, tables), tables, "tables", text.split(marker, 1)[1].strip()))
            elif text:
                tail = [*tail[-19:], text]
        code = proc.wait()
    if code != 0:
        said = " / ".join(t for t in tail if "error" in t.lower() or "fatal" in t.lower()) or " / ".join(
            tail[-3:]
        )
        if "no space left on device" in said.lower():
            raise OSError(errno.ENOSPC, said)
        raise BackupError(f"{name} failed (exit {code}): {said}")


def _disk_full(exc: BaseException, folder: Path) -> BackupError | None:
    full = (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or (
        isinstance(exc, sqlite3.Error) and "disk is full" in str(exc)
    )
    if not full:
        return None
    try:
        free = _size(shutil.disk_usage(folder).free)
    except OSError:
        free = "unknown"
    return BackupError(
        f"the disk holding {folder} is full ({free} free): no backup was written; "
        "free some space or write the backup to another disk"
    )


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def human_size(n: int) -> str:
    """A byte count for people: ``12.3 MiB``."""
    return _size(float(n))


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
