"""The tables, declared once with SQLModel. Timestamps are epoch milliseconds; JSON columns hold text.

Indexes follow the queries, and are partial wherever a query looks at one status: claims read only the index
of pending rows, so a million finished rows cost a claim nothing, and an enqueue writes few index pages.
Queries that should use a partial index must repeat its condition verbatim (SQLite matches terms exactly).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, Index, Integer, MetaData, Text, text
from sqlmodel import Field, SQLModel

from shared.storage.queries.common import CHAT_KEY
from shared.storage.statuses import ApprovalStatus, MessageStatus, PairingStatus, ResponseStatus

SCHEMA_VERSION = 2


def _big(nullable: bool = False, default: int | None = 0) -> Column[int]:
    return Column(
        BigInteger, nullable=nullable, server_default=None if default is None else text(str(default))
    )


class Message(SQLModel, table=True):
    """An incoming message: ``pending → processing → completed | dead``."""

    __tablename__ = "messages"
    __table_args__ = (
        Index(
            "ix_messages_pending",
            "agent",
            "available_at",
            "id",
            sqlite_where=text(f"status = '{MessageStatus.PENDING}'"),
            postgresql_where=text(f"status = '{MessageStatus.PENDING}'"),
        ),
        Index(
            "ix_messages_processing",
            "lease_until",
            sqlite_where=text(f"status = '{MessageStatus.PROCESSING}'"),
            postgresql_where=text(f"status = '{MessageStatus.PROCESSING}'"),
        ),
        # Open messages by chat: typing indicators, /status, debounce. Finished rows leave this index.
        Index(
            "ix_messages_open",
            "channel",
            "conversation",
            sqlite_where=text(f"status IN ('{MessageStatus.PENDING}', '{MessageStatus.PROCESSING}')"),
            postgresql_where=text(f"status IN ('{MessageStatus.PENDING}', '{MessageStatus.PROCESSING}')"),
        ),
        Index(
            "ix_messages_completed",
            "updated_at",
            sqlite_where=text(f"status = '{MessageStatus.COMPLETED}'"),
            postgresql_where=text(f"status = '{MessageStatus.COMPLETED}'"),
        ),
        Index(
            "ix_messages_dead",
            "updated_at",
            sqlite_where=text(f"status = '{MessageStatus.DEAD}'"),
            postgresql_where=text(f"status = '{MessageStatus.DEAD}'"),
        ),
        # One chat's messages by time: its history page by page, its newest message for the chat list.
        # The chat is an expression (CHAT_KEY); queries that want this index repeat it verbatim. The chat
        # before the channel: an index led by the channel would tempt SQLite to walk all of it for any
        # GROUP BY channel (to spare a sort), reading every message ever kept.
        Index("ix_messages_chat", text(CHAT_KEY), "channel", "created_at"),
        Index(
            "ux_messages_external",
            "channel",
            "external_id",
            unique=True,
            sqlite_where=text("external_id IS NOT NULL"),
            postgresql_where=text("external_id IS NOT NULL"),
        ),
    )

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    message_id: str = Field(sa_column=Column(Text, nullable=False, unique=True))
    channel: str = Field(sa_column=Column(Text, nullable=False))
    sender: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    sender_id: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    message: str = Field(sa_column=Column(Text, nullable=False))
    agent: str = Field(sa_column=Column(Text, nullable=False))
    from_agent: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    status: str = Field(
        default=MessageStatus.PENDING.value,
        sa_column=Column(Text, nullable=False, server_default=MessageStatus.PENDING.value),
    )
    retry_count: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    manual_retries: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: int = Field(sa_column=_big())
    updated_at: int = Field(sa_column=_big())
    conversation: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    meta: str = Field(default="{}", sa_column=Column("metadata", Text, nullable=False, server_default="{}"))
    available_at: int = Field(default=0, sa_column=_big())
    claimed_by: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    lease_until: int | None = Field(default=None, sa_column=_big(nullable=True, default=None))
    hops: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    external_id: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    # +When a run containing this message started (NULL while it is merely claimed): a crash charges an
    # attempt only to messages whose run had started.
    run_started_at: int | None = Field(default=None, sa_column=_big(nullable=True, default=None))
    # +Runs of this message cut short by a processor that died (kill -9, OOM): its own budget, so a
    # message that crashes the processor every time still ends as a dead letter.
    interruptions: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))


class Response(SQLModel, table=True):
    """An outgoing reply: ``pending → delivering → acked``; ``delivered`` counts chunks already sent."""

    __tablename__ = "responses"
    __table_args__ = (
        Index(
            "ix_responses_open",
            "channel",
            "id",
            sqlite_where=text(f"status <> '{ResponseStatus.ACKED}'"),
            postgresql_where=text(f"status <> '{ResponseStatus.ACKED}'"),
        ),
        Index(
            "ix_responses_acked",
            "acked_at",
            sqlite_where=text(f"status = '{ResponseStatus.ACKED}'"),
            postgresql_where=text(f"status = '{ResponseStatus.ACKED}'"),
        ),
        # One chat's replies by time: its history, its last reply for the chat list (the conversation
        # first, as for ix_messages_chat: not an index a GROUP BY channel would walk whole).
        Index("ix_responses_chat", "conversation", "channel", "created_at"),
        # A message's replies (trace, delivery notices): otherwise a scan of every reply ever kept.
        Index("ix_responses_message", "message_id"),
    )

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    message_id: str = Field(sa_column=Column(Text, nullable=False))
    channel: str = Field(sa_column=Column(Text, nullable=False))
    sender: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    sender_id: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    message: str = Field(sa_column=Column(Text, nullable=False))
    original_message: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    agent: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    files: str = Field(default="[]", sa_column=Column(Text, nullable=False, server_default="[]"))
    meta: str = Field(default="{}", sa_column=Column("metadata", Text, nullable=False, server_default="{}"))
    status: str = Field(
        default=ResponseStatus.PENDING.value,
        sa_column=Column(Text, nullable=False, server_default=ResponseStatus.PENDING.value),
    )
    created_at: int = Field(sa_column=_big())
    updated_at: int = Field(sa_column=_big())
    acked_at: int | None = Field(default=None, sa_column=_big(nullable=True, default=None))
    conversation: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    claimed_by: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    lease_until: int | None = Field(default=None, sa_column=_big(nullable=True, default=None))
    delivered: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    # +Why delivery failed for good (status ``failed``): the platform's own reason.
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class ChatMessage(SQLModel, table=True):
    """A post in a team's chat room (append-only)."""

    __tablename__ = "chat_messages"
    __table_args__ = (Index("ix_chat_messages_team", "team_id", "id"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    team_id: str = Field(sa_column=Column(Text, nullable=False))
    from_agent: str = Field(sa_column=Column(Text, nullable=False))
    message: str = Field(sa_column=Column(Text, nullable=False))
    created_at: int = Field(sa_column=_big())


class AgentMessage(SQLModel, table=True):
    """One user or assistant turn of an agent (append-only history)."""

    __tablename__ = "agent_messages"
    __table_args__ = (Index("ix_agent_messages_agent", "agent_id", "id"),)

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    agent_id: str = Field(sa_column=Column(Text, nullable=False))
    role: str = Field(sa_column=Column(Text, nullable=False))
    channel: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    sender: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    message_id: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    content: str = Field(sa_column=Column(Text, nullable=False))
    created_at: int = Field(sa_column=_big())


class Event(SQLModel, table=True):
    """The durable event log (seed 001): ``id`` is the cursor; a reader never skips an event that commits
    after it read (how, per engine: :class:`shared.storage.dialect.Dialect`)."""

    __tablename__ = "events"
    __table_args__ = (
        # Only a topic index, and only for the quieter topics: every index is one more page written per
        # event, and the busy "queue" topic (every enqueue, claim and completion) is most of the table, so
        # its readers go by id (the primary key) and its events write no index page. A query that wants
        # this index repeats its condition (see shared.storage.queries.events.topic_filter). Trace and TTL cleanup find
        # their rows by scanning or by id, which grows with time.
        Index(
            "ix_events_quiet_topics",
            "topic",
            "id",
            sqlite_where=text("topic <> 'queue'"),
            postgresql_where=text("topic <> 'queue'"),
        ),
        # No AUTOINCREMENT (it costs a sqlite_sequence write per event): SQLite then takes max(id) + 1, and
        # cleanup never deletes the newest event, so an id is never handed out twice.
    )

    # 64 bits on PostgreSQL, where an id carries its transaction's id (older databases are widened when the
    # schema is brought up to date); SQLite's INTEGER PRIMARY KEY is the 64-bit rowid already.
    id: int | None = Field(
        default=None,
        sa_column=Column(
            BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
        ),
    )
    topic: str = Field(sa_column=Column(Text, nullable=False))
    type: str = Field(sa_column=Column(Text, nullable=False))
    message_id: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    payload: str = Field(default="{}", sa_column=Column(Text, nullable=False, server_default="{}"))
    created_at: int = Field(sa_column=_big())


#: Indexes of earlier schemas that the current one replaced (table -> names), dropped when the schema is
#: brought up to date: ``ix_events_topic`` indexed every event's topic (now ``ix_events_quiet_topics``).
RETIRED_INDEXES: dict[str, tuple[str, ...]] = {"events": ("ix_events_topic",)}


class EventConsumer(SQLModel, table=True):
    """A durable consumer's acknowledged cursor per topic."""

    __tablename__ = "event_consumers"

    consumer: str = Field(sa_column=Column(Text, primary_key=True))
    topic: str = Field(sa_column=Column(Text, primary_key=True))
    cursor: int = Field(sa_column=_big())
    updated_at: int = Field(sa_column=_big())


class AgentLease(SQLModel, table=True):
    """Who runs an agent right now; ``stop_requested`` and ``paused_until`` steer it through the database."""

    __tablename__ = "agent_leases"

    agent: str = Field(sa_column=Column(Text, primary_key=True))
    holder: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    lease_until: int = Field(default=0, sa_column=_big())
    acquired_at: int = Field(default=0, sa_column=_big())
    paused_until: int = Field(default=0, sa_column=_big())
    stop_requested: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    note: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))


class Pairing(SQLModel, table=True):
    """A chat sender's pairing with a channel: a one-time code an operator approves."""

    __tablename__ = "pairings"
    __table_args__ = (
        Index("ux_pairings_sender", "channel", "sender_id", unique=True),
        Index("ix_pairings_code", "code"),
    )

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    channel: str = Field(sa_column=Column(Text, nullable=False))
    sender_id: str = Field(sa_column=Column(Text, nullable=False))
    sender: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    code: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(
        default=PairingStatus.PENDING.value,
        sa_column=Column(Text, nullable=False, server_default=PairingStatus.PENDING.value),
    )
    created_at: int = Field(sa_column=_big())
    approved_at: int | None = Field(default=None, sa_column=_big(nullable=True, default=None))


class AgentSession(SQLModel, table=True):
    """The provider's session id for one agent's conversation (``session_scope = conversation``)."""

    __tablename__ = "sessions"

    agent: str = Field(sa_column=Column(Text, primary_key=True))
    conversation: str = Field(sa_column=Column(Text, primary_key=True))
    session_id: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    updated_at: int = Field(sa_column=_big())


class KeyValue(SQLModel, table=True):
    """Small durable state of a process kind: a chat's sticky agent, a channel's offset, a busy policy."""

    __tablename__ = "kv"

    scope: str = Field(sa_column=Column(Text, primary_key=True))
    key: str = Field(sa_column=Column(Text, primary_key=True))
    value: str = Field(sa_column=Column(Text, nullable=False))
    updated_at: int = Field(sa_column=_big())


class SchemaVersion(SQLModel, table=True):
    """Which schema version this database has, so later releases can migrate it."""

    __tablename__ = "schema_version"

    version: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    applied_at: int = Field(sa_column=_big())


class RunUsage(SQLModel, table=True):
    """What one run of an agent cost, as its CLI reported it (:mod:`shared.reads.usage`): written with the run's
    outcome. ``sender`` is the person who started the chain (a handoff's origin), empty for heartbeats and
    schedules, which count to their agent."""

    __tablename__ = "run_usage"
    __table_args__ = (
        Index("ix_run_usage_created", "created_at"),
        Index("ix_run_usage_sender", "sender", "created_at"),
        Index("ix_run_usage_agent", "agent", "created_at"),
    )

    id: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True, autoincrement=True))
    run_id: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    message_id: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    agent: str = Field(sa_column=Column(Text, nullable=False))
    channel: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    conversation: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    sender: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    sender_name: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    model: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    ok: int = Field(default=1, sa_column=Column(Integer, nullable=False, server_default="1"))
    input_tokens: int = Field(default=0, sa_column=_big())
    output_tokens: int = Field(default=0, sa_column=_big())
    cache_read_tokens: int = Field(default=0, sa_column=_big())
    cache_write_tokens: int = Field(default=0, sa_column=_big())
    cost_usd: float = Field(default=0.0, sa_column=Column(Float, nullable=False, server_default="0"))
    duration_ms: int = Field(default=0, sa_column=_big())
    created_at: int = Field(sa_column=_big())


class Approval(SQLModel, table=True):
    """A tool use a run asks a person about before it happens (``permission_mode = "ask"``,
    :mod:`shared.chat.approvals`): who may answer, what exactly, until when, and what became of it."""

    __tablename__ = "approvals"
    __table_args__ = (
        Index(
            "ix_approvals_pending",
            "created_at",
            sqlite_where=text(f"status = '{ApprovalStatus.PENDING}'"),
            postgresql_where=text(f"status = '{ApprovalStatus.PENDING}'"),
        ),
        Index("ix_approvals_message", "message_id"),
    )

    id: str = Field(sa_column=Column(Text, primary_key=True))
    message_id: str = Field(sa_column=Column(Text, nullable=False))
    run_id: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    agent: str = Field(sa_column=Column(Text, nullable=False))
    #: The chat asked (the chat a teammate's chain started from), and the person who may answer there.
    channel: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    conversation: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    sender_id: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    sender: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    tool: str = Field(sa_column=Column(Text, nullable=False))
    #: What exactly, in a person's words (the command; the file and a short diff), as the chat shows it.
    summary: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    #: The tool's input as JSON (bounded), and the pattern "Allow for this chat" remembers.
    detail: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    pattern: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    status: str = Field(
        default=ApprovalStatus.PENDING.value,
        sa_column=Column(Text, nullable=False, server_default=ApprovalStatus.PENDING.value),
    )
    #: Who answered ("telegram:123", "operator") and how ("chat", "cli", "api", "timeout", "stop", ...).
    decided_by: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    decided_via: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    #: "Allow for this chat": later uses of the same tool and pattern in this chat are allowed unasked.
    for_chat: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    #: The platform's id of the message that shows the question (its buttons), once sent.
    shown_id: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    created_at: int = Field(sa_column=_big())
    expires_at: int = Field(sa_column=_big())
    decided_at: int = Field(default=0, sa_column=_big())


def metadata() -> MetaData:
    """The metadata that holds every agentpost table."""
    return SQLModel.metadata


TABLE_NAMES = (
    "messages",
    "responses",
    "chat_messages",
    "agent_messages",
    "events",
    "event_consumers",
    "agent_leases",
    "pairings",
    "sessions",
    "kv",
    "schema_version",
    "run_usage",
    "approvals",
)
