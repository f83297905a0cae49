"""Every difference between SQLite and PostgreSQL that the queue cares about, in one place.

Queue operations are written once, as SQL with ``:name`` parameters; a :class:`Dialect` turns that into what
the driver wants and supplies the few clauses that differ (row locking, change signals, event ordering).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Literal

# One advisory-lock key for all event appends on PostgreSQL: holding it until commit makes the order in
# which transactions take event ids the order in which they commit, so cursors never skip a late commit.
EVENT_APPEND_LOCK_KEY = 0x61676E74  # "agnt"
NOTIFY_CHANNEL = "agentpost"

_PARAM_RE = re.compile(r"(?<![:\w]):([A-Za-z_][A-Za-z0-9_]*)")


@lru_cache(maxsize=512)
def _to_pyformat(sql: str) -> str:
    return _PARAM_RE.sub(r"%(\1)s", sql.replace("%", "%%"))


@dataclass(frozen=True)
class Dialect:
    """What one database engine needs that the other does not."""

    name: Literal["sqlite", "postgresql"]
    #: Appended to the ``SELECT`` inside a claim, so concurrent claimers skip each other's rows.
    skip_locked: str = field(default="")
    #: Appended to a ``SELECT`` whose rows the transaction then updates on what it read: PostgreSQL locks
    #: them (and, under READ COMMITTED, re-reads a row another transaction changed meanwhile), so nobody
    #: changes them in between. SQLite needs nothing: its write transaction already excludes every writer.
    lock_rows: str = field(default="")
    #: How a write transaction starts: SQLite takes the write lock up front so no reader upgrades later.
    begin_write: str = "BEGIN"
    #: The id of a new event. PostgreSQL's sequence never repeats. SQLite without AUTOINCREMENT (which costs
    #: a sqlite_sequence write per insert) would reuse ids once cleanup emptied the table, so it continues
    #: from the newest row or from the highest id cleanup ever removed, whichever is larger.
    next_event_id: str = "DEFAULT"
    #: How an INSERT reports its new row's id: SQLite's driver has it after the statement (``lastrowid``,
    #: with ``rowcount`` 0 when ON CONFLICT skipped the row), which costs less than a RETURNING clause;
    #: PostgreSQL's driver only has what the statement returns.
    id_by_returning: bool = True

    def insert_event_sql(self, *, take_order_lock: bool) -> str:
        """The INSERT of one event. On PostgreSQL the first event of a transaction takes the
        event-order advisory lock inside the same statement (one round trip instead of two)."""
        return self._event_inserts[take_order_lock]

    @cached_property
    def _event_inserts(self) -> dict[bool, str]:
        # Built once per dialect: every enqueue and completion appends events.
        return {first: self._build_event_insert(first) for first in (False, True)}

    def _build_event_insert(self, take_order_lock: bool) -> str:
        columns = "topic, type, message_id, payload, created_at"
        values = ":topic, :type, :message_id, :payload, :created_at"
        if self.is_sqlite:
            return self.sql(f"INSERT INTO events (id, {columns}) VALUES ({self.next_event_id}, {values})")
        if take_order_lock:
            return self.sql(
                f"INSERT INTO events ({columns}) SELECT {values} "
                f"FROM (SELECT pg_advisory_xact_lock({EVENT_APPEND_LOCK_KEY})) AS commit_order"
            )
        return self.sql(f"INSERT INTO events ({columns}) VALUES ({values})")

    def enqueue_statement(self, insert_message: str, events: int) -> str | None:
        """The whole enqueue as one statement (PostgreSQL: the message row, its ``events`` rows under the
        commit-order lock, and the NOTIFYs, in data-modifying CTEs), or None where the engine has no such
        statements (SQLite, which enqueues in a transaction); ``:name`` parameters like every statement
        before :meth:`sql`. ``insert_message`` must end in
        ``RETURNING id, message_id``; event ``i`` takes ``:ev_topic<i>``, ``:ev_type<i>``, ``:ev_payload<i>``,
        all ``:now``. Returns the new row's ``id``, or no row when the message was a duplicate (then nothing
        was written and nobody is woken)."""
        if self.is_sqlite:
            return None
        rows = ", ".join(f"({i}, :ev_topic{i}, :ev_type{i}, :ev_payload{i})" for i in range(events))
        return (
            f"WITH m AS ({insert_message}), "
            f"commit_order AS (SELECT pg_advisory_xact_lock({EVENT_APPEND_LOCK_KEY}) AS held FROM m), "
            "e AS (INSERT INTO events (topic, type, message_id, payload, created_at) "
            "SELECT v.topic, v.type, m.message_id, v.payload, CAST(:now AS BIGINT) FROM m, commit_order, "
            f"(VALUES {rows}) AS v(n, topic, type, payload) ORDER BY v.n RETURNING id), "
            f"woken AS (SELECT pg_notify('{NOTIFY_CHANNEL}', 'events'), pg_notify('{NOTIFY_CHANNEL}', 'messages') "
            "FROM m) "
            "SELECT m.id, (SELECT COUNT(*) FROM e) AS events, (SELECT COUNT(*) FROM woken) AS woken FROM m"
        )

    def commit_sql(self, signals: set[str]) -> str:
        """COMMIT, preceded on PostgreSQL by the NOTIFYs of the transaction in the same round trip (they
        are delivered at commit and dropped on rollback, exactly like the change they report)."""
        if self.is_sqlite or not signals:
            return "COMMIT"
        notes = ", ".join(f"pg_notify('{NOTIFY_CHANNEL}', '{kind}')" for kind in sorted(signals))
        return f"SELECT {notes}; COMMIT"

    def sql(self, text: str) -> str:
        """Translate ``:name`` parameters to the driver's style (cached)."""
        return text if self.name == "sqlite" else _to_pyformat(text)

    @property
    def is_sqlite(self) -> bool:
        return self.name == "sqlite"


SQLITE = Dialect(
    name="sqlite",
    skip_locked="",
    begin_write="BEGIN IMMEDIATE",
    id_by_returning=False,
    next_event_id=(
        "(SELECT MAX(COALESCE((SELECT MAX(id) FROM events), 0), COALESCE((SELECT CAST(value AS INTEGER) "
        "FROM kv WHERE scope = 'events.pruned' AND key = '*'), 0)) + 1)"
    ),
)
POSTGRESQL = Dialect(
    name="postgresql", skip_locked=" FOR UPDATE SKIP LOCKED", lock_rows=" FOR UPDATE", begin_write="BEGIN"
)


def dialect_for_url(url: str) -> Dialect:
    """The dialect of a database URL (``sqlite:///path`` or ``postgresql://...``)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme.startswith("sqlite"):
        return SQLITE
    if scheme.startswith(("postgresql", "postgres")):
        return POSTGRESQL
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://...")


def sqlalchemy_url(url: str) -> str:
    """The URL SQLAlchemy needs: PostgreSQL through psycopg 3."""
    scheme, rest = url.split("://", 1)
    if scheme in ("postgresql", "postgres"):
        return "postgresql+psycopg://" + rest
    return url


def libpq_url(url: str) -> str:
    """The URL psycopg needs (no SQLAlchemy driver suffix)."""
    scheme, rest = url.split("://", 1)
    return "postgresql://" + rest if scheme.startswith("postgres") else url


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///`` URL (``:memory:`` is refused: processes must share a file)."""
    if not url.startswith("sqlite:///"):
        raise ValueError(f"SQLite URL must look like sqlite:///path/to/file.db, got {url!r}")
    path = url[len("sqlite:///") :]
    if not path or path == ":memory:":
        raise ValueError("SQLite needs a file: several processes share it")
    return path
