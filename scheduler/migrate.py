"""`agentpost migrate --to URL`: copy the whole database to another one (normally SQLite → PostgreSQL),
verify it, and only then switch ``database.url`` in settings.toml.

Safety, in order: refuse while processes hold live leases (stop them first), refuse a target whose agentpost
tables hold any row, copy every table in ONE target transaction from ONE consistent source snapshot
(keeping every id), reset PostgreSQL's id sequences, compare row counts per table and per status inside
that transaction (a mismatch rolls everything back), and switch the settings file only after the commit.
The source is only read: its file is left exactly as it was, so going back is editing one line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from shared.clock import now_ms
from shared.db import Database, Tx
from shared.models import TABLE_NAMES, metadata
from shared.settings import Settings

#: Tables whose rows carry a status worth comparing one by one.
STATUS_TABLES = ("messages", "responses", "pairings")


class MigrationError(Exception):
    """The migration was refused or failed; the target was left unchanged and settings were not switched."""


@dataclass
class MigrationReport:
    source: str
    target: str
    tables: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    switched: bool = False
    settings_path: str = ""
    env_override: bool = False


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for printing)."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def _q(name: str) -> str:
    return '"' + name + '"'


def _columns(table: str) -> list[str]:
    return [c.name for c in metadata().tables[table].columns]


def _order(table: str) -> str:
    keys = [c.name for c in metadata().tables[table].primary_key.columns]
    return ", ".join(_q(k) for k in keys)


def table_counts(
    run: Callable[[str], list[dict[str, Any]]],
) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Rows per table and per status, read through ``run(sql)`` (a transaction's or a database's reader)."""
    counts = {t: int(run(f"SELECT COUNT(*) AS n FROM {_q(t)}")[0]["n"]) for t in TABLE_NAMES}
    statuses = {
        t: {
            str(r["status"]): int(r["n"])
            for r in run(f"SELECT status, COUNT(*) AS n FROM {_q(t)} GROUP BY status")
        }
        for t in STATUS_TABLES
    }
    return counts, statuses


def live_holders(db: Database, now: int | None = None) -> list[str]:
    """Workers that hold a lease right now (their process is presumably running)."""
    now = now_ms() if now is None else now
    rows = db.read(
        "SELECT holder AS w FROM agent_leases WHERE holder IS NOT NULL AND lease_until > :now "
        "UNION SELECT claimed_by AS w FROM messages WHERE status = 'processing' AND lease_until > :now "
        "UNION SELECT claimed_by AS w FROM responses WHERE status = 'delivering' AND lease_until > :now",
        {"now": now},
    )
    return sorted(str(r["w"]) for r in rows if r["w"])


def nonempty_tables(db: Database) -> dict[str, int]:
    """agentpost tables of ``db`` that hold rows (tables that do not exist count as empty)."""
    existing = set(db.table_names())
    found = {}
    for table in TABLE_NAMES:
        if table in existing:
            n = int(db.read_scalar(f"SELECT COUNT(*) FROM {_q(table)}") or 0)
            if n:
                found[table] = n
    return found


def _copy_table(src: Tx, dst: Tx, table: str, chunk: int) -> int:
    cols = _columns(table)
    names = ", ".join(_q(c) for c in cols)
    params = ", ".join(f":c{i}" for i in range(len(cols)))
    insert = f"INSERT INTO {_q(table)} ({names}) VALUES ({params})"
    cur: Any = src.execute(f"SELECT {names} FROM {_q(table)} ORDER BY {_order(table)}")
    copied = 0
    while True:
        rows = cur.fetchmany(chunk)
        if not rows:
            return copied
        dst.executemany(insert, [{f"c{i}": v for i, v in enumerate(row)} for row in rows])
        copied += len(rows)


def _reset_sequences(dst: Tx) -> None:
    for table in TABLE_NAMES:
        col = metadata().tables[table].columns.get("id")
        if col is None or not col.autoincrement or not col.primary_key:
            continue
        dst.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE(MAX(id), 1), MAX(id) IS NOT NULL) "
            f"FROM {_q(table)}"
        )


def migrate(
    settings: Settings,
    target_url: str,
    *,
    switch: bool = True,
    allow_live: bool = False,
    chunk: int = 1000,
) -> MigrationReport:
    """Copy the database of ``settings`` to ``target_url``, verify, then switch settings.toml to it.

    Raises :class:`MigrationError` (target unchanged, settings untouched) when processes look alive, the
    target is not empty, or the counts differ.
    """
    source_url = settings.database_url
    if target_url.rstrip("/") == source_url.rstrip("/"):
        raise MigrationError("the target is the database in use already")
    report = MigrationReport(source=mask_url(source_url), target=mask_url(target_url))
    report.env_override = bool(settings.env.get("AGENTPOST_DATABASE_URL"))
    source = Database(source_url, busy_timeout_ms=settings.file.database.busy_timeout_ms)
    try:
        target = Database(target_url)
    except ValueError as exc:
        source.close()
        raise MigrationError(str(exc)) from None
    try:
        missing = [t for t in TABLE_NAMES if t not in set(source.table_names())]
        if missing:
            raise MigrationError(f"the source database has no table {', '.join(missing)}; is it agentpost's?")
        holders = live_holders(source)
        if holders and not allow_live:
            raise MigrationError(
                f"processes are still running (live leases of {', '.join(holders)}); stop them first "
                "(agentpost down, or systemctl stop agentpost.target)"
            )
        try:
            full = nonempty_tables(target)
        except Exception as exc:
            raise MigrationError(f"cannot open the target database: {exc}") from None
        if full:
            listed = ", ".join(f"{t} ({n} rows)" for t, n in full.items())
            raise MigrationError(
                f"the target database is not empty: {listed}; migrate only into an empty one"
            )
        metadata().create_all(target.engine)
        with source.transaction(write=False) as src, target.transaction() as dst:
            # One snapshot of the source and one transaction on the target: all or nothing.
            if not source.dialect.is_sqlite:
                src.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            src_counts, src_status = table_counts(src.rows)
            for table in TABLE_NAMES:
                _copy_table(src, dst, table, chunk)
            if not target.dialect.is_sqlite:
                _reset_sequences(dst)
            dst_counts, dst_status = table_counts(dst.rows)
            if (src_counts, src_status) != (dst_counts, dst_status):
                raise MigrationError(
                    f"verification failed, nothing was kept: source {src_counts} {src_status}, "
                    f"target {dst_counts} {dst_status}"
                )
        after = table_counts(target.read)
        if after != (src_counts, src_status):
            raise MigrationError(f"verification after commit failed: {after} vs {(src_counts, src_status)}")
        report.tables, report.statuses = src_counts, src_status
    finally:
        source.close()
        target.close()
    if switch:
        set_database_url(settings.path, target_url)
        report.switched = True
        report.settings_path = str(settings.path)
    return report


def set_database_url(path: Path, url: str) -> None:
    """Set ``database.url`` in settings.toml, keeping every comment and other key (tomlkit), atomically."""
    doc = tomlkit.parse(path.read_text(encoding="utf-8")) if path.exists() else tomlkit.document()
    if "database" not in doc:
        doc["database"] = tomlkit.table()
    database: Any = doc["database"]
    database["url"] = url
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(tomlkit.dumps(doc))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
