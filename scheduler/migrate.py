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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from shared.settings.model import Settings
from shared.storage import schema
from shared.storage.copy_db import (
    begin_snapshot,
    copy_table,
    live_holders,
    nonempty_tables,
    reset_sequences,
    table_counts,
)
from shared.storage.db import Database
from shared.storage.models import TABLE_NAMES, metadata


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
        missing = [t for t in TABLE_NAMES if t not in set(schema.table_names(source))]
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
            begin_snapshot(src, source)
            src_counts, src_status = table_counts(src.rows)
            for table in TABLE_NAMES:
                copy_table(src, dst, table, chunk)
            if target.dialect.id_sequences:
                reset_sequences(dst)
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
