"""Copying agentpost's tables from one database to another (``agentpost migrate``), and the reads that decide
whether a copy is safe and whether it is complete.

Every table named in :data:`shared.storage.models.TABLE_NAMES` is copied row by row with its ids kept; the caller
holds one transaction on each side (see :mod:`scheduler.migrate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Integer

from shared.clock import now_ms
from shared.storage import schema
from shared.storage.db import Database, Row, Tx
from shared.storage.models import TABLE_NAMES, metadata
from shared.storage.statuses import MessageStatus, ResponseStatus

#: Tables whose rows carry a status worth comparing one by one.
STATUS_TABLES = ("messages", "responses", "pairings")


def _q(name: str) -> str:
    return '"' + name + '"'


def _columns(table: str) -> list[str]:
    return [c.name for c in metadata().tables[table].columns]


def _order(table: str) -> str:
    keys = [c.name for c in metadata().tables[table].primary_key.columns]
    return ", ".join(_q(k) for k in keys)


def table_counts(run: Callable[[str], list[Row]]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
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
        f"UNION SELECT claimed_by AS w FROM messages WHERE status = '{MessageStatus.PROCESSING}' AND lease_until > :now "
        f"UNION SELECT claimed_by AS w FROM responses WHERE status = '{ResponseStatus.DELIVERING}' AND lease_until > :now",
        {"now": now},
    )
    return sorted(str(r["w"]) for r in rows if r["w"])


def nonempty_tables(db: Database) -> dict[str, int]:
    """agentpost tables of ``db`` that hold rows (tables that do not exist count as empty)."""
    existing = set(schema.table_names(db))
    found = {}
    for table in TABLE_NAMES:
        if table in existing:
            n = int(db.read_scalar(f"SELECT COUNT(*) FROM {_q(table)}") or 0)
            if n:
                found[table] = n
    return found


def begin_snapshot(src: Tx, db: Database) -> None:
    """Make the transaction ``src`` of ``db`` read one consistent snapshot of every table (PostgreSQL's
    default isolation would let each statement see later commits; SQLite's transaction already does)."""
    if db.dialect.snapshot_sql is not None:
        src.execute(db.dialect.snapshot_sql)


def copy_table(src: Tx, dst: Tx, table: str, chunk: int) -> int:
    """Copy every row of ``table`` from ``src`` to ``dst``, ids kept, ``chunk`` rows at a time; returns the
    number copied."""
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


def reset_sequences(dst: Tx) -> None:
    """On PostgreSQL, move each copied table's id sequence past its highest id (rows were inserted with
    their ids, which does not advance a sequence)."""
    for table in TABLE_NAMES:
        col = metadata().tables[table].columns.get("id")
        # Only integer ids have a sequence (an approval's id is text; its column's autoincrement reads "auto").
        if (
            col is None
            or not col.primary_key
            or not isinstance(col.type, Integer)
            or col.autoincrement is False
        ):
            continue
        dst.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE(MAX(id), 1), MAX(id) IS NOT NULL) "
            f"FROM {_q(table)}"
        )
