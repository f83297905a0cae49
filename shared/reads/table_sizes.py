"""How big each table of the database is: rows, and on PostgreSQL bytes on disk (SQLite keeps every table
in one file and tells no size per table without a build option most copies lack). ``agentpost doctor``
shows it, so an operator sees which history grows and whether ``[retention]`` keeps up.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.storage.db import Database
from shared.storage.models import TABLE_NAMES
from shared.storage.queries import table_sizes as q


@dataclass(frozen=True)
class TableSize:
    """One table: its name, how many rows it holds, and its bytes on disk where the engine tells them."""

    table: str
    rows: int
    bytes: int | None


def table_sizes(db: Database) -> list[TableSize]:
    """Every agentpost table's size, in the order of :data:`shared.storage.models.TABLE_NAMES`."""
    sizes = []
    for table in TABLE_NAMES:
        rows = int(db.read_scalar(q.count_rows(table)) or 0)
        size = None if db.dialect.is_sqlite else int(db.read_scalar(q.PG_TABLE_BYTES, {"t": table}) or 0)
        sizes.append(TableSize(table, rows, size))
    return sizes
