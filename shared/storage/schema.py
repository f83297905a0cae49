"""The schema: creating the tables and indexes, upgrading an older database in place, and opening a database
ready for use (:func:`open_database`).

Separate from the connection seam (:mod:`shared.storage.db`): a process opens a database once, while every
operation goes through the connection. The version this code writes is :data:`shared.storage.db.SCHEMA_VERSION`,
kept there so a current database is recognised without importing SQLAlchemy; the upgrades here only add
(columns with defaults, wider event ids) or drop what a newer schema replaced (retired indexes).
"""

from __future__ import annotations

import time
from pathlib import Path

from shared.backoff import Backoff
from shared.clock import now_ms
from shared.private_files import sqlite_files, tighten
from shared.storage import kv
from shared.storage.db import SCHEMA_VERSION, Database
from shared.storage.dialect import sqlite_path

# Processes starting together race to create the schema; a short wait, then try again.
_SCHEMA_RACE_BACKOFF = Backoff(0.05, 2.0)


def open_database(
    url: str, *, busy_timeout_ms: int = 30_000, create: bool = True, quick: bool = False
) -> Database:
    """Open (and by default create the schema of) the database at ``url``; ``quick``: see
    :func:`create_schema`."""
    db = Database(url, busy_timeout_ms=busy_timeout_ms)
    if create:
        create_schema(db, quick=quick)
    return db


def create_schema(db: Database, *, quick: bool = False) -> int:
    """Create every table and index that is missing, and record the schema version. Idempotent.

    Returns the schema version now recorded. Refuses a database written by a newer agentpost. With
    ``quick`` (short commands a person waits for), a database that already records this version is only
    checked (one read, no SQLAlchemy); every long-running process does the full work at its start, so
    columns added within a version still reach older databases.
    """
    if quick and _recorded_version(db) == SCHEMA_VERSION:
        if db.dialect.is_sqlite:
            tighten(sqlite_files(Path(sqlite_path(db.url))))
        return SCHEMA_VERSION
    # SQLAlchemy and the models only here: a current database is opened without them (quick commands).
    from shared.storage.models import SCHEMA_VERSION as MODELS_VERSION
    from shared.storage.models import metadata

    if MODELS_VERSION != SCHEMA_VERSION:
        raise RuntimeError(
            f"shared.storage.db.SCHEMA_VERSION ({SCHEMA_VERSION}) differs from shared.storage.models ({MODELS_VERSION})"
        )
    for attempt in range(10):
        try:
            metadata().create_all(db.engine)
            break
        except Exception as exc:
            # Processes starting together race here: another one created the same table between our
            # check and our create, or (SQLite) our read transaction could not become a write one while
            # theirs was writing — SQLite answers that "locked" at once, without the busy timeout.
            text = str(exc)
            if ("already exists" not in text and "database is locked" not in text) or attempt == 9:
                raise
            time.sleep(_SCHEMA_RACE_BACKOFF.delay(attempt + 1))
    _add_missing_columns(db)
    _add_missing_indexes(db)
    _drop_retired_indexes(db)
    _event_ids_ahead(db)
    if db.dialect.is_sqlite:
        # All chat content lives here: created 0600 under agentpost's umask; older files tightened.
        tighten(sqlite_files(Path(sqlite_path(db.url))))
    # Read first: a current schema needs no write lock, so a process (or a CLI command) can start while
    # another program holds the database's write lock.
    if db.read_scalar("SELECT MAX(version) FROM schema_version") == SCHEMA_VERSION:
        return SCHEMA_VERSION
    with db.transaction() as tx:
        current = tx.scalar("SELECT MAX(version) FROM schema_version")
        if current is not None and int(current) > SCHEMA_VERSION:
            raise RuntimeError(
                f"the database has schema version {current}, newer than this agentpost "
                f"({SCHEMA_VERSION}); upgrade agentpost"
            )
        if current is None or int(current) < SCHEMA_VERSION:
            tx.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (:v, :t)",
                {"v": SCHEMA_VERSION, "t": now_ms()},
            )
    return SCHEMA_VERSION


def recorded_schema_version(db: Database) -> int | None:
    """The schema version the database records (None: none yet); a missing table raises."""
    found = db.read_scalar("SELECT MAX(version) FROM schema_version")
    return None if found is None else int(found)


def _recorded_version(db: Database) -> int | None:
    """The schema version the database records, or None (no schema yet, or not readable now)."""
    try:
        return recorded_schema_version(db)
    except Exception:  # no such table yet; anything real shows again on the full path
        return None


def _add_missing_columns(db: Database) -> None:
    """Columns added by a newer schema version: ``ALTER TABLE … ADD COLUMN`` with their defaults, so an
    older database keeps its rows (every added column is nullable or has a server default)."""
    from sqlalchemy import inspect

    from shared.storage.models import metadata

    inspector = inspect(db.engine)
    for table in metadata().sorted_tables:
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            kind = column.type.compile(dialect=db.engine.dialect)
            arg = getattr(column.server_default, "arg", None)
            value = getattr(arg, "text", arg)
            clause = f" DEFAULT {value}" if value is not None else ""
            null = "" if column.nullable else " NOT NULL"
            with db.transaction() as tx:
                try:
                    tx.execute(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}{clause}{null}")
                except Exception as exc:  # another process added it between our look and our ALTER
                    if "duplicate" not in str(exc).lower() and "already exists" not in str(exc):
                        raise


def _add_missing_indexes(db: Database) -> None:
    """Indexes added by a newer schema to tables an older one created (``create_all`` makes indexes only
    with new tables). Looked up by name first, so a current database takes no write lock here; building
    one on a large table takes a while, once, at the first start after the upgrade."""
    from shared.storage.models import metadata

    present = {str(r["name"]) for r in db.read(db.dialect.index_names)}
    for table in metadata().sorted_tables:
        for index in table.indexes:
            if index.name in present:
                continue
            try:
                index.create(db.engine, checkfirst=True)
            except Exception as exc:  # another process starting at the same time made it first
                if "already exists" not in str(exc):
                    raise


def _event_ids_ahead(db: Database) -> None:
    """PostgreSQL: widen ``events.id`` to 64 bits if an older schema made it ``integer``, and make sure
    the next transaction's event ids lie above every id already in the table or removed by cleanup
    (ids written by an older version, or copied from SQLite, counted from 1): each transaction id used
    up here moves the next event id up by 2**20, so at most 2,048 short statements, once."""
    floor_sql = db.dialect.event_id_floor
    if floor_sql is None:
        return
    kind = db.read_scalar(
        "SELECT data_type FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'events' AND column_name = 'id'"
    )
    if kind == "integer":
        with db.transaction() as tx:
            for statement in db.dialect.widen_event_ids:
                tx.execute(statement)
    pruned = kv.get(db, kv.Scope.EVENTS_PRUNED, "*")
    top = max(int(db.read_scalar("SELECT COALESCE(MAX(id), 0) FROM events")), int(pruned or 0))
    # Autocommit: each read below is a transaction of its own and uses up one transaction id.
    while int(db.read_scalar(floor_sql)) <= top:
        pass


def _drop_retired_indexes(db: Database) -> None:
    """Indexes a newer schema replaced (:data:`shared.storage.models.RETIRED_INDEXES`): each one only costs
    writes, so it goes; looked up first, so a current database takes no write lock here."""
    from sqlalchemy import inspect

    from shared.storage.models import RETIRED_INDEXES

    inspector = inspect(db.engine)
    for table, names in RETIRED_INDEXES.items():
        present = {ix["name"] for ix in inspector.get_indexes(table)}
        for name in names:
            if name in present:
                with db.transaction() as tx:
                    tx.execute(f"DROP INDEX IF EXISTS {name}")


def table_names(db: Database) -> list[str]:
    from sqlalchemy import inspect

    return sorted(inspect(db.engine).get_table_names())
