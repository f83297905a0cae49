"""Putting a backup (:mod:`shared.storage.backup`) back: checking the copy first — its kind, its integrity
and the agentpost schema it was written with — then replacing the target database's content with it and
upgrading an older copy in place (:func:`shared.storage.schema.create_schema`).

What may be restored where (an empty target, or one with data only when the operator agreed, with no
process running against it) is decided by the command (``agentpost restore``); this module does the checks
and the copy.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from shared.storage import schema
from shared.storage.backup import (
    STEP_PAGES,
    BackupError,
    Counts,
    Progress,
    ProgressFn,
    pg_tool,
    pg_tool_target,
    read_counts,
    run_pg_tool,
    sqlite_reader,
)
from shared.storage.db import SCHEMA_VERSION, Database
from shared.storage.queries import backup as q

CopyKind = Literal["sqlite", "postgresql"]

_SQLITE_MAGIC = b"SQLite format 3\x00"
_PG_MAGIC = b"PGDMP"
#: A table entry of ``pg_restore --list``: ``123; 1259 16390 TABLE public messages postgres``.
_LISTED_TABLE = re.compile(r"^\d+;\s+\d+\s+\d+\s+TABLE\s+\S+\s+(\S+)\s")


@dataclass(frozen=True)
class CopyInfo:
    """A backup file that passed its checks: its kind, the schema version it records, and (SQLite) what
    it holds; a pg_dump's tables."""

    path: Path
    kind: CopyKind
    schema_version: int
    counts: Counts | None = None
    tables: tuple[str, ...] = ()

    @property
    def newer(self) -> bool:
        """Written by a newer agentpost than this one (such a copy is refused)."""
        return self.schema_version > SCHEMA_VERSION

    @property
    def older(self) -> bool:
        """Written by an older agentpost: restored, then upgraded in place."""
        return self.schema_version < SCHEMA_VERSION


def inspect_copy(path: Path) -> CopyInfo:
    """Check a backup file: a SQLite database that passes ``PRAGMA integrity_check`` or a pg_dump
    custom-format file ``pg_restore --list`` reads, with an agentpost schema version. Raises
    :class:`BackupError` saying what is wrong."""
    path = path.expanduser().absolute()
    if not path.is_file():
        raise BackupError(f"there is no file {path}")
    with open(path, "rb") as f:
        head = f.read(len(_SQLITE_MAGIC))
    if head.startswith(_SQLITE_MAGIC):
        return _inspect_sqlite(path)
    if head.startswith(_PG_MAGIC):
        return _inspect_pg_dump(path)
    raise BackupError(
        f"{path} is neither a SQLite database nor a pg_dump custom-format file; is it an agentpost backup?"
    )


def _open_read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)


def _inspect_sqlite(path: Path) -> CopyInfo:
    try:
        conn = _open_read_only(path)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot open {path}: {exc}") from None
    try:
        try:
            problems = [str(r[0]) for r in conn.execute(q.INTEGRITY_CHECK).fetchall()]
        except sqlite3.Error as exc:
            raise BackupError(f"{path} is damaged and cannot be restored: {exc}") from None
        if problems != ["ok"]:
            shown = "; ".join(problems[:3])
            raise BackupError(f"{path} is damaged and cannot be restored (integrity check: {shown})")
        try:
            version = conn.execute(q.SCHEMA_VERSION).fetchone()
            counts = read_counts(sqlite_reader(conn))
        except sqlite3.Error:
            raise BackupError(
                f"{path} is a SQLite database, but not agentpost's (it has no queue tables)"
            ) from None
    finally:
        conn.close()
    if version is None or version[0] is None:
        raise BackupError(
            f"{path} records no agentpost schema version; it is not a complete agentpost backup"
        )
    return CopyInfo(path, "sqlite", int(version[0]), counts)


def _inspect_pg_dump(path: Path) -> CopyInfo:
    binary = pg_tool("pg_restore")
    listed = subprocess.run([binary, "--list", str(path)], capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        said = " ".join(listed.stderr.split())
        raise BackupError(f"{path} is damaged or not a complete pg_dump, and cannot be restored: {said}")
    tables = tuple(m.group(1) for m in map(_LISTED_TABLE.match, listed.stdout.splitlines()) if m)
    if "schema_version" not in tables:
        raise BackupError(f"{path} is a pg_dump, but not of agentpost's database (it has no queue tables)")
    data = subprocess.run(
        [binary, "--data-only", "--table=schema_version", "-f", "-", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    version = _copied_max_version(data.stdout) if data.returncode == 0 else None
    if version is None:
        raise BackupError(
            f"{path} records no agentpost schema version; it is not a complete agentpost backup"
        )
    return CopyInfo(path, "postgresql", version, tables=tables)


def _copied_max_version(script: str) -> int | None:
    """The largest version in the ``COPY … schema_version … FROM stdin`` block of a data-only script."""
    versions: list[int] = []
    inside = False
    for line in script.splitlines():
        if line.startswith("COPY ") and "schema_version" in line:
            inside = True
        elif inside and line == "\\.":
            inside = False
        elif inside and line:
            first = line.split("\t", 1)[0]
            if first.isdigit():
                versions.append(int(first))
    return max(versions) if versions else None


def check_fits(info: CopyInfo, db: Database) -> None:
    """Refuse (:class:`BackupError`) a copy written by a newer agentpost, or of the other database kind."""
    if info.newer:
        raise BackupError(
            f"{info.path} was written by a newer agentpost (schema version {info.schema_version}; this one "
            f"knows {SCHEMA_VERSION}): upgrade agentpost, then restore it"
        )
    target: CopyKind = "sqlite" if db.dialect.is_sqlite else "postgresql"
    if info.kind != target:
        raise BackupError(
            f"{info.path} is a {_kind_name(info.kind)} backup, but this home's database is "
            f"{_kind_name(target)}: restore it into a home that uses {_kind_name(info.kind)} "
            "(then `agentpost migrate --to URL` moves it across)"
        )


def restore_copy(info: CopyInfo, db: Database, *, progress: ProgressFn | None = None) -> int:
    """Replace what ``db`` holds with the checked copy ``info``, then upgrade it to this agentpost's schema.
    Returns the schema version the copy had. The caller made sure nothing else uses ``db``."""
    check_fits(info, db)
    report = progress or (lambda _p: None)
    if info.kind == "sqlite":
        _restore_sqlite(info.path, db, report)
    else:
        _restore_pg_dump(info, db, report)
    schema.create_schema(db)
    return info.schema_version


def _kind_name(kind: CopyKind) -> str:
    return "SQLite" if kind == "sqlite" else "PostgreSQL"


def _restore_sqlite(path: Path, db: Database, report: ProgressFn) -> None:
    source = _open_read_only(path)
    try:
        target = db.connection()
        # A rollback journal while the pages are replaced: a WAL database refuses a copy whose page size
        # differs. Nothing else has the file open (the command checked), so the mode can change.
        target.execute(q.SINGLE_FILE).fetchall()

        def step(_status: int, remaining: int, total: int) -> None:
            report(Progress(total - remaining, total, "pages"))

        source.backup(target, pages=STEP_PAGES, progress=step)
        target.execute(q.BACK_TO_WAL).fetchall()
    finally:
        source.close()


def _restore_pg_dump(info: CopyInfo, db: Database, report: ProgressFn) -> None:
    binary = pg_tool("pg_restore")
    conninfo, env = pg_tool_target(db.url)
    command = [
        binary,
        "--clean",
        "--if-exists",
        "--no-owner",
        "--no-privileges",
        "--single-transaction",
        "--exit-on-error",
        "--verbose",
        "--no-password",
        "-d",
        conninfo,
        str(info.path),
    ]
    run_pg_tool(command, env, report, "processing data for table", "pg_restore")
    # Tables of a newer schema than the copy's were not in it: they held no rows when it was taken.
    present = set(schema.table_names(db))
    from shared.storage.models import TABLE_NAMES

    extra = [t for t in TABLE_NAMES if t in present and t not in info.tables]
    if extra:
        with db.transaction() as tx:
            for table in extra:
                tx.execute(q.empty_table(table))
