"""How big each table is, for ``agentpost doctor`` (:mod:`shared.reads.table_sizes`)."""

from __future__ import annotations

from shared.storage.models import TABLE_NAMES


def count_rows(table: str) -> str:
    """How many rows ``table`` holds (one of :data:`shared.storage.models.TABLE_NAMES`)."""
    if table not in TABLE_NAMES:
        raise ValueError(f"unknown table {table!r}")
    return f"SELECT COUNT(*) FROM {table}"


#: Bytes on disk of table ``:t`` with its indexes and TOAST data (PostgreSQL only).
PG_TABLE_BYTES = "SELECT pg_total_relation_size(CAST(:t AS regclass))"
