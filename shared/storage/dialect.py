"""Every difference between SQLite and PostgreSQL that the queue cares about, in one place.

Queue operations are written once, as SQL with ``:name`` parameters; a :class:`Dialect` turns that into what
the driver wants and supplies the few clauses that differ (row locking, change signals, event ids and
which of them a reader may see yet).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Literal

NOTIFY_CHANNEL = "agentpost"

#: PostgreSQL event ids: the appending transaction's id (xid8) shifted left by this many bits, plus the event's
#: ordinal within that transaction (so at most 2**20 events per transaction, and 2**43 transactions before
#: the id reaches 2**63: at 10,000 transactions a second, some 27,000 years).
EVENT_ORDINAL_BITS = 20
#: How many events one transaction may append on PostgreSQL.
EVENTS_PER_TRANSACTION = 1 << EVENT_ORDINAL_BITS
# The id of an event appended now by this transaction (its ordinal added by the caller); and the first id a
# reader may not see yet: the oldest transaction of this database still running in the reading statement's
# own snapshot may yet commit events with ids from there on, while every older one has ended.
_PG_TX_EVENT_BASE = f"(CAST(CAST(pg_current_xact_id() AS text) AS bigint) << {EVENT_ORDINAL_BITS})"
#
# Transaction ids are server-wide, so the oldest running transaction may belong to another database on the same
# server (another application's long batch job): it cannot write this database's events, and waiting for it
# would hold every reader back. So the bound is the smallest running xid of the reading statement's snapshot
# (pg_snapshot_xip) that is not known to be another database's: pg_stat_activity names the xid each session
# holds. An xid it does not name (its transaction ended after the snapshot, or a prepared transaction) counts
# as this database's, so a doubt only delays readers, never lets one skip. 4294967296 = 2**32: backend_xid is
# the 32-bit form of the xid8.
_PG_VISIBLE_EVENT_BOUND = (
    "(SELECT CAST(CAST(COALESCE((SELECT MIN(x) FROM pg_snapshot_xip(s.snap) AS x WHERE CAST(CAST(x AS text) "
    "AS bigint) % 4294967296 NOT IN (SELECT CAST(CAST(a.backend_xid AS text) AS bigint) FROM pg_stat_activity "
    "AS a WHERE a.backend_xid IS NOT NULL AND a.datname IS DISTINCT FROM current_database())), "
    f"pg_snapshot_xmax(s.snap)) AS text) AS bigint) << {EVENT_ORDINAL_BITS} "
    "FROM (SELECT pg_current_snapshot() AS snap) AS s)"
)

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
    #: The id of a new event where :attr:`tx_event_id` is None (SQLite). SQLite without AUTOINCREMENT (which
    #: costs a sqlite_sequence write per insert) would reuse ids once cleanup emptied the table, so it
    #: continues from the newest row or from the highest id cleanup ever removed, whichever is larger.
    next_event_id: str = "DEFAULT"
    #: How an INSERT reports its new row's id: SQLite's driver has it after the statement (``lastrowid``,
    #: with ``rowcount`` 0 when ON CONFLICT skipped the row), which costs less than a RETURNING clause;
    #: PostgreSQL's driver only has what the statement returns.
    id_by_returning: bool = True
    #: Whether a commit is announced to other processes (PostgreSQL's LISTEN/NOTIFY); where it is not
    #: (SQLite), a waiter watches the database file for changes instead.
    notifies_changes: bool = True
    #: Whether a write that is a whole transaction can be sent as one statement (PostgreSQL: autocommit and
    #: data-modifying CTEs, see :meth:`enqueue_statement`); SQLite writes go through a transaction.
    single_statement_writes: bool = True
    #: Run first in a read transaction that must see one snapshot of every table, or None where every
    #: transaction already does (SQLite); PostgreSQL's default isolation lets each statement see later commits.
    snapshot_sql: str | None = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"
    #: Whether ids come from sequences that rows inserted with explicit ids (a copy) do not advance, so
    #: the copy must move them past the highest id (PostgreSQL); SQLite continues from the largest id.
    id_sequences: bool = True

    #: Event cursors that never skip a late commit. SQLite has one writer at a time, so ids taken as
    #: ``max + 1`` are already in commit order. PostgreSQL writers run side by side, so a transaction that
    #: took a smaller id may commit after one that took a larger id; a reader that had moved past the larger
    #: would never see the smaller. Instead of making appends wait for each other (an advisory lock held
    #: until commit, which serialised every enqueue, claim and completion), an event's id there is its
    #: transaction's id (xid8) shifted left, plus its ordinal within that transaction, and readers see only
    #: ids below the oldest transaction of this database still running in their own snapshot: every such
    #: transaction with a smaller xid has ended, so nothing can still appear below that bound. Cursor order is
    #: then the order in which transactions began writing, exposed only once it is final.
    #:
    #: The highest id (exclusive) a reader may see, as an SQL expression; None where every committed id is
    #: final (SQLite).
    visible_event_bound: str | None = None
    #: The id of an event the current transaction appends, with ``:ordinal`` its place among that
    #: transaction's events; None where :attr:`next_event_id` serves (SQLite).
    tx_event_id: str | None = None
    #: A query for the smallest id the next transaction could give an event (PostgreSQL), so a database
    #: whose events were numbered otherwise (an older schema, a copy from SQLite) can be moved past them.
    event_id_floor: str | None = None
    #: Statements widening ``events.id`` to 64 bits (PostgreSQL tables created as ``integer``).
    widen_event_ids: tuple[str, ...] = ()
    #: A query, run after a commit, for a bound above every event id that commit wrote (PostgreSQL: the
    #: next transaction id, shifted); and one for whether readers see everything below ``:target`` now.
    event_read_after: str | None = None
    event_readable: str | None = None
    #: The names of the indexes in this database (column ``name``): which ones a schema upgrade must add.
    index_names: str = "SELECT name FROM sqlite_master WHERE type = 'index'"

    @cached_property
    def event_insert(self) -> str:
        """The INSERT of one event (``:ordinal``: its place among the transaction's events, counted by
        :meth:`shared.db.Tx.event_ordinals`), with ``:name`` parameters like every statement before
        :meth:`sql`."""
        columns = "topic, type, message_id, payload, created_at"
        values = ":topic, :type, :message_id, :payload, :created_at"
        event_id = self.next_event_id if self.tx_event_id is None else self.tx_event_id
        return f"INSERT INTO events (id, {columns}) VALUES ({event_id}, {values})"

    @cached_property
    def event_insert_driver(self) -> str:
        """:attr:`event_insert` in the driver's parameter style (:meth:`sql`), built once: every enqueue and
        completion appends events."""
        return self.sql(self.event_insert)

    def visible_events(self, joiner: Literal["AND", "WHERE"] = "AND") -> str:
        """A term (`` AND …`` or, for a query without other conditions, `` WHERE …``) keeping a read of
        ``events`` to the ids no later commit can precede; empty where every committed id is final (SQLite,
        whose queries then stay exactly as they were, planner shortcuts for ``MAX(id)`` included)."""
        if self.visible_event_bound is None:
            return ""
        return f" {joiner} id < {self.visible_event_bound}"

    def enqueue_statement(self, insert_message: str, events: int) -> str:
        """The whole enqueue as one statement (PostgreSQL: the message row, its ``events`` rows with their
        transaction-ordered ids, and the NOTIFYs, in data-modifying CTEs); ``:name`` parameters like every statement
        before :meth:`sql`. ``insert_message`` must end in
        ``RETURNING id, message_id``; event ``i`` takes ``:ev_topic<i>``, ``:ev_type<i>``, ``:ev_payload<i>``,
        all ``:now``. Returns the new row's ``id``, or no row when the message was a duplicate (then nothing
        was written and nobody is woken). Only where :attr:`single_statement_writes`."""
        if not self.single_statement_writes:
            raise ValueError(f"{self.name} has no one-statement enqueue")
        rows = ", ".join(f"({i}, :ev_topic{i}, :ev_type{i}, :ev_payload{i})" for i in range(events))
        # The statement is its own transaction: its events are that transaction's ordinals 0, 1, ...
        return (
            f"WITH m AS ({insert_message}), "
            "e AS (INSERT INTO events (id, topic, type, message_id, payload, created_at) "
            f"SELECT {_PG_TX_EVENT_BASE} + v.n, v.topic, v.type, m.message_id, v.payload, CAST(:now AS BIGINT) "
            f"FROM m, (VALUES {rows}) AS v(n, topic, type, payload) ORDER BY v.n RETURNING id), "
            f"woken AS (SELECT pg_notify('{NOTIFY_CHANNEL}', 'events'), pg_notify('{NOTIFY_CHANNEL}', 'messages') "
            "FROM m) "
            "SELECT m.id, (SELECT COUNT(*) FROM e) AS events, (SELECT COUNT(*) FROM woken) AS woken FROM m"
        )

    def write_with_events(self, ctes: str, events: str, signals: Sequence[str], result: str) -> str:
        """A write that is a whole transaction as one statement (PostgreSQL: one round trip instead of one per
        statement plus BEGIN and COMMIT): the data-modifying CTEs ``ctes``, the events that the SELECT
        ``events`` yields (columns: ordinal within the statement, topic, type, message id, payload text), with
        their transaction-ordered ids, and, when it yields any, the NOTIFYs of ``signals``. The statement's
        rows are those of the SELECT ``result`` (which may read the CTEs), after a first column ``_woken``.
        ``:name`` parameters like every statement before :meth:`sql`; ``:now`` is the events' time. Only
        where :attr:`single_statement_writes`."""
        if not self.single_statement_writes:
            raise ValueError(f"{self.name} has no one-statement writes")
        notes = ", ".join(f"pg_notify('{NOTIFY_CHANNEL}', '{kind}')" for kind in sorted(signals))
        return (
            f"WITH {ctes}, "
            "_ev AS (INSERT INTO events (id, topic, type, message_id, payload, created_at) "
            f"SELECT {_PG_TX_EVENT_BASE} + v.n, v.topic, v.type, v.message_id, v.payload, CAST(:now AS BIGINT) "
            f"FROM ({events}) AS v(n, topic, type, message_id, payload) ORDER BY v.n RETURNING id), "
            # Referenced below, or it would not run; once per statement, and only when it appended events.
            f"_woken AS (SELECT {notes} FROM (SELECT 1 FROM _ev LIMIT 1) AS w) "
            f"SELECT (SELECT COUNT(*) FROM _woken) AS _woken, r.* FROM ({result}) AS r"
        )

    def commit_sql(self, signals: set[str]) -> str:
        """COMMIT, preceded on PostgreSQL by the NOTIFYs of the transaction in the same round trip (they
        are delivered at commit and dropped on rollback, exactly like the change they report)."""
        if self.is_sqlite or not signals:
            return "COMMIT"
        notes = ", ".join(f"pg_notify('{NOTIFY_CHANNEL}', '{kind}')" for kind in sorted(signals))
        return f"SELECT {notes}; COMMIT"

    def sql(self, text: str) -> str:
        """The statement as the driver takes it: the clause placeholders of a named query
        (:data:`PLACEHOLDERS`) filled for this engine, and ``:name`` parameters in the driver's style (cached)."""
        if "{" in text:
            text = _filled(self, text)
        return text if self.name == "sqlite" else _to_pyformat(text)

    @property
    def is_sqlite(self) -> bool:
        return self.name == "sqlite"


#: The clauses a named query (:mod:`shared.storage.queries`) writes as a placeholder because the engines
#: differ there; :meth:`Dialect.sql` fills them in, so no caller splices dialect text into a statement.
PLACEHOLDERS = ("{lock_rows}", "{skip_locked}", "{and_visible_events}", "{where_visible_events}")
_PLACEHOLDER_RE = re.compile(r"\{[a-z_]+\}")


@lru_cache(maxsize=512)
def _filled(dialect: Dialect, text: str) -> str:
    clauses = {
        "{lock_rows}": dialect.lock_rows,
        "{skip_locked}": dialect.skip_locked,
        "{and_visible_events}": dialect.visible_events("AND"),
        "{where_visible_events}": dialect.visible_events("WHERE"),
    }
    filled = _PLACEHOLDER_RE.sub(lambda m: clauses.get(m.group(0), m.group(0)), text)
    unknown = _PLACEHOLDER_RE.search(filled)
    if unknown is not None:  # a misspelt placeholder would otherwise reach the server as text
        raise ValueError(f"unknown clause placeholder {unknown.group(0)} in {text[:80]!r}")
    return filled


SQLITE = Dialect(
    name="sqlite",
    skip_locked="",
    begin_write="BEGIN IMMEDIATE",
    id_by_returning=False,
    notifies_changes=False,
    single_statement_writes=False,
    snapshot_sql=None,
    id_sequences=False,
    next_event_id=(
        "(SELECT MAX(COALESCE((SELECT MAX(id) FROM events), 0), COALESCE((SELECT CAST(value AS INTEGER) "
        "FROM kv WHERE scope = 'events.pruned' AND key = '*'), 0)) + 1)"
    ),
)
POSTGRESQL = Dialect(
    name="postgresql",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    lock_rows=" FOR UPDATE",
    begin_write="BEGIN",
    visible_event_bound=_PG_VISIBLE_EVENT_BOUND,
    tx_event_id=f"{_PG_TX_EVENT_BASE} + :ordinal",
    event_id_floor=f"SELECT {_PG_TX_EVENT_BASE}",
    event_read_after=(
        f"SELECT CAST(CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text) AS bigint) << {EVENT_ORDINAL_BITS}"
    ),
    event_readable=f"SELECT CAST(:target AS bigint) <= {_PG_VISIBLE_EVENT_BOUND}",
    widen_event_ids=(
        "ALTER TABLE events ALTER COLUMN id TYPE bigint",
        "ALTER SEQUENCE IF EXISTS events_id_seq AS bigint",
    ),
    index_names="SELECT indexname AS name FROM pg_indexes WHERE schemaname = current_schema()",
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


#: What every PostgreSQL session asks of the server. A client cut off by the network in the middle of a
#: transaction (a partition: no FIN, no RST) leaves its server session "idle in transaction" until the
#: server's TCP gives up, hours later by default: it keeps its row locks, and, since events are readable only
#: below the oldest running transaction (``visible_event_bound``), every reader of every host stops seeing
#: new events. The server ends such a transaction after 5 s (agentpost's transactions take milliseconds),
#: and probes idle clients (keepalives) so a vanished one frees its session.
PG_SESSION_OPTIONS = (
    "-c idle_in_transaction_session_timeout=5000 "
    "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3"
)
#: The client side of the same: a call to a server that the network cut off fails within seconds instead of
#: hanging for TCP's retransmission timeout (about 15 minutes), so a process notices and reconnects.
PG_CLIENT_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}


def pg_connect_args(url: str) -> dict[str, object]:
    """``psycopg.connect(**pg_connect_args(url), autocommit=True)``: ``url`` with :data:`PG_SESSION_OPTIONS`
    (in front of any ``options`` the URL has, so the operator's own win) and :data:`PG_CLIENT_KEEPALIVES`
    (unless the URL sets them)."""
    from psycopg.conninfo import conninfo_to_dict  # only here: SQLite processes never load psycopg

    params: dict[str, object] = {**PG_CLIENT_KEEPALIVES, **conninfo_to_dict(libpq_url(url))}
    params["options"] = f"{PG_SESSION_OPTIONS} {params.get('options') or ''}".strip()
    return params


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///`` URL (``:memory:`` is refused: processes must share a file)."""
    if not url.startswith("sqlite:///"):
        raise ValueError(f"SQLite URL must look like sqlite:///path/to/file.db, got {url!r}")
    path = url[len("sqlite:///") :]
    if not path or path == ":memory:":
        raise ValueError("SQLite needs a file: several processes share it")
    return path
