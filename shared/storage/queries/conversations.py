"""Read views of chats and agents for the dashboard and ``/status``: the chats across channels, one chat's
history, each agent's queue depth, last error and pause, and a run's live messages
(:mod:`shared.reads.conversations`, :mod:`shared.reads.conversation_status`)."""

from __future__ import annotations

from shared.storage.queries.common import CHAT_KEY, OPEN, PENDING, PROCESSING, chat_key_of
from shared.storage.statuses import MessageStatus

_DEAD = f"'{MessageStatus.DEAD}'"


def recent_chats(hidden: int) -> str:
    """A page of chats, most recent first: each chat's newest message (the chat list shows it) whose row id
    is below ``:before``, at most ``:l``, leaving out the ``hidden`` channels ``:h0``, ``:h1``, …; with the
    chat's count of messages (``n``) and the id of its newest reply (``reply_id``).

    A chat's place is the id of its newest message, so a page is a walk down the primary key that keeps
    the rows which are their chat's newest (one lookup in ``ix_messages_chat`` each): it reads about as
    many rows as the page shows, however long the history, and the id of its last chat is the cursor of
    the next page (no chat is on two pages, none is skipped). The count reads the chat's own rows only,
    and only for the chats on the page."""
    marks = ", ".join(f":h{n}" for n in range(hidden))
    mine = f"channel = m.channel AND {CHAT_KEY} = {chat_key_of('m')}"
    return (
        f"SELECT m.id, m.channel, {chat_key_of('m')} AS chat, m.sender, m.sender_id, m.agent, m.message, "
        f"m.status, m.created_at, (SELECT COUNT(*) FROM messages WHERE {mine}) AS n, "
        f"(SELECT r.id FROM responses AS r WHERE r.channel = m.channel AND r.conversation = {chat_key_of('m')} "
        "ORDER BY r.created_at DESC, r.id DESC LIMIT 1) AS reply_id "
        f"FROM messages AS m WHERE m.id < :before AND m.channel NOT IN ({marks}) "
        f"AND m.id = (SELECT id FROM messages WHERE {mine} ORDER BY created_at DESC, id DESC LIMIT 1) "
        "ORDER BY m.id DESC LIMIT :l"
    )


#: Chats with messages processing (``busy``) or pending (``waiting``), and how many: read from the small
#: partial index of open messages (materialized first: to spare the grouping a sort, SQLite would rather
#: scan every message in ``ix_messages_chat`` order).
OPEN_CHATS = (
    f"WITH o AS MATERIALIZED (SELECT channel, {CHAT_KEY} AS chat, status FROM messages WHERE status IN {OPEN}) "
    f"SELECT channel, chat, SUM(CASE WHEN status = {PROCESSING} THEN 1 ELSE 0 END) AS busy, "
    f"SUM(CASE WHEN status = {PENDING} THEN 1 ELSE 0 END) AS waiting FROM o GROUP BY channel, chat"
)


def replies_by_id(count: int) -> str:
    """The replies ``:r0`` … ``:r{count-1}`` (by row id): the text, agent and time of each."""
    marks = ", ".join(f":r{n}" for n in range(count))
    return f"SELECT id, message, agent, created_at FROM responses WHERE id IN ({marks})"


# One chat's history, a page before the time ``:b``: the newest ``:l`` items before it, and every item at it.
MESSAGES_BEFORE = (
    "SELECT id, message_id, sender, sender_id, message, agent, status, retry_count, manual_retries, "
    "last_error, created_at, updated_at FROM messages "
    f"WHERE channel = :c AND {CHAT_KEY} = :v AND created_at < :b ORDER BY created_at DESC, id DESC "
    "LIMIT :l"
)
MESSAGES_AT = (
    "SELECT id, message_id, sender, sender_id, message, agent, status, retry_count, manual_retries, "
    f"last_error, created_at, updated_at FROM messages WHERE channel = :c AND {CHAT_KEY} = :v "
    "AND created_at = :b"
)
REPLIES_BEFORE = (
    "SELECT id, message_id, message, agent, metadata, status, files, created_at FROM responses "
    "WHERE channel = :c AND conversation = :v AND created_at < :b ORDER BY created_at DESC, id DESC LIMIT :l"
)
REPLIES_AT = (
    "SELECT id, message_id, message, agent, metadata, status, files, created_at FROM responses "
    "WHERE channel = :c AND conversation = :v AND created_at = :b"
)

#: An agent's messages pending, processing and dead.
AGENT_DEPTH = (
    f"SELECT SUM(CASE WHEN status = {PENDING} THEN 1 ELSE 0 END) AS pending, "
    f"SUM(CASE WHEN status = {PROCESSING} THEN 1 ELSE 0 END) AS processing, "
    f"SUM(CASE WHEN status = {_DEAD} THEN 1 ELSE 0 END) AS dead FROM messages WHERE agent = :a"
)
AGENT_LAST_ERROR = (
    "SELECT last_error, updated_at FROM messages WHERE agent = :a AND last_error IS NOT NULL "
    "AND last_error <> '' ORDER BY updated_at DESC LIMIT 1"
)
#: The agent's pause, when it lasts beyond ``:now``.
AGENT_PAUSE = "SELECT paused_until, note FROM agent_leases WHERE agent = :a AND paused_until > :now"


def live_in_run(count: int) -> str:
    """How many of the messages ``:m0`` … ``:m{count-1}`` (by message id) are processing under a lease
    unexpired at ``:now``."""
    marks = ", ".join(f":m{n}" for n in range(count))
    return (
        f"SELECT COUNT(*) FROM messages WHERE message_id IN ({marks}) AND status = {PROCESSING} "
        "AND lease_until >= :now"
    )


def open_in_chat(of_agent: bool) -> str:
    """The chat's messages still to answer (``:channel``, ``:conv``), oldest first; for the agent ``:agent``
    only when ``of_agent``."""
    agent_clause = " AND agent = :agent" if of_agent else ""
    return (
        "SELECT message_id, agent, status FROM messages WHERE channel = :channel AND "
        f"{CHAT_KEY} = :conv AND status IN {OPEN}{agent_clause} ORDER BY id"
    )
