"""Operator views and repairs (:mod:`shared.queue.admin`): dead letters, counts per status and agent,
pruning; and the statements of the dead-letter archive (:mod:`scheduler.dlq`)."""

from __future__ import annotations

from shared.storage.queries.common import OPEN, PENDING, PROCESSING
from shared.storage.statuses import MessageStatus, ResponseStatus

_DEAD = f"'{MessageStatus.DEAD}'"

# -- dead letters ------------------------------------------------------------------------------------------
#: Dead letters, newest first.
LIST_DEAD = (
    f"SELECT * FROM messages WHERE status = {_DEAD} ORDER BY updated_at DESC, id DESC LIMIT :l OFFSET :o"
)
#: The dead letter with row id ``:ref``, locked (PostgreSQL) so that a retry racing this one waits, then
#: finds the row no longer dead; SQLite's write transaction already excludes it.
DEAD_BY_ID_LOCKED = f"SELECT * FROM messages WHERE status = {_DEAD} AND id = :ref{{lock_rows}}"
#: :data:`DEAD_BY_ID_LOCKED` by message id.
DEAD_BY_MESSAGE_ID_LOCKED = (
    f"SELECT * FROM messages WHERE status = {_DEAD} AND message_id = :ref{{lock_rows}}"
)
#: A dead letter back to pending with fresh attempts, one manual retry more.
RETRY_DEAD = (
    f"UPDATE messages SET status = {PENDING}, retry_count = 0, manual_retries = manual_retries + 1, "
    "available_at = :now, updated_at = :now, claimed_by = NULL, lease_until = NULL WHERE id = :id "
    f"AND status = {_DEAD} RETURNING *"
)
#: Dead letters that died before ``:cut``, locked (PostgreSQL; SQLite's write transaction excludes every
#: other writer): a hand retry or delete racing this waits for it, and another scheduler passes these rows by.
DEAD_BEFORE_LOCKED = (
    f"SELECT id, message_id FROM messages WHERE status = {_DEAD} AND updated_at < :cut "
    "ORDER BY updated_at, id LIMIT :l{skip_locked}"
)
#: A dead letter back to pending by the automatic retry (the manual budget untouched).
RETRY_DEAD_AUTOMATICALLY = (
    f"UPDATE messages SET status = {PENDING}, retry_count = 0, available_at = :now, "
    f"updated_at = :now, claimed_by = NULL, lease_until = NULL WHERE id = :id AND status = {_DEAD}"
)
DEAD_COUNT = f"SELECT COUNT(*) FROM messages WHERE status = {_DEAD}"
#: The most recent dead letter of a chat (``:c``, ``:conv``). A chain's handoffs share the internal
#: conversation named after the chat it started from (``:chain``, see workers/teams.py), which a chat
#: without a conversation id names by its sender.
LAST_DEAD_OF_CHAT = (
    f"SELECT message_id FROM messages WHERE status = {_DEAD} AND ((channel = :c AND conversation = :conv) "
    "OR (channel = 'internal' AND conversation = :chain)) ORDER BY updated_at DESC, id DESC LIMIT 1"
)
DELETE_DEAD_BY_ID = f"DELETE FROM messages WHERE status = {_DEAD} AND id = :ref RETURNING *"
DELETE_DEAD_BY_MESSAGE_ID = f"DELETE FROM messages WHERE status = {_DEAD} AND message_id = :ref RETURNING *"


# -- views ---------------------------------------------------------------------------------------------------
def count_with_status(status: MessageStatus) -> str:
    """How many messages are in ``status`` (each count reads a partial index, which the planner matches only
    against the same literal); completed ones only since ``:since`` (they are history: counting all of
    them would cost as much as the history is long)."""
    since = " AND updated_at >= :since" if status == MessageStatus.COMPLETED else ""
    return f"SELECT COUNT(*) FROM messages WHERE status = '{status}'{since}"


#: Undelivered responses per status, CLI replies apart.
UNDELIVERED_BY_STATUS = (
    f"SELECT status, channel = 'cli' AS cli, COUNT(*) AS n FROM responses WHERE status <> '{ResponseStatus.ACKED}' "
    "GROUP BY status, channel = 'cli'"
)
#: Pending and processing counts per agent.
OPEN_BY_AGENT = (
    f"SELECT agent, status, COUNT(*) AS n FROM messages WHERE status IN {OPEN} GROUP BY agent, status"
)
#: The messages waiting for ``:a`` (pending or being processed), oldest first.
WAITING_FOR_AGENT = f"SELECT * FROM messages WHERE agent = :a AND status IN {OPEN} ORDER BY id"
PROCESSING_MESSAGES = f"SELECT * FROM messages WHERE status = {PROCESSING} ORDER BY id"


def list_responses(*, channel: bool, pending_only: bool) -> str:
    """Up to ``:l`` responses, of ``:channel`` when ``channel``; with ``pending_only`` only those waiting,
    oldest first, else newest first."""
    where = []
    if channel:
        where.append("channel = :channel")
    if pending_only:
        where.append(
            f"status IN ('{ResponseStatus.PENDING}', '{ResponseStatus.DELIVERING}')"
        )  # failed replies are not waiting
    clause = ("WHERE " + " AND ".join(where)) if where else ""
    order = "ASC" if pending_only else "DESC"
    return f"SELECT * FROM responses {clause} ORDER BY id {order} LIMIT :l"


#: Replies waiting to be read in a chat (``:c``, ``:v``) on a channel read on demand, oldest first.
CHAT_RESPONSES = (
    f"SELECT * FROM responses WHERE status = '{ResponseStatus.PENDING}' AND channel = :c AND conversation = :v "
    "ORDER BY id LIMIT :l"
)
MESSAGE = "SELECT * FROM messages WHERE message_id = :m"

# -- the dead-letter archive ---------------------------------------------------------------------------------
#: How many dead letters, how many died before ``:cut``, and when the oldest died, in one read.
DEAD_LETTER_STATS = (
    "SELECT COUNT(*) AS n, MIN(updated_at) AS oldest, "
    f"SUM(CASE WHEN updated_at < :cut THEN 1 ELSE 0 END) AS due FROM messages WHERE status = {_DEAD}"
)
#: When the newest dead letter beyond the newest ``:n`` died.
DEAD_LETTER_CUT_KEEPING = (
    f"SELECT updated_at FROM messages WHERE status = {_DEAD} ORDER BY updated_at DESC, id DESC "
    "LIMIT 1 OFFSET :n"
)
ANY_DEAD_BEFORE = f"SELECT 1 FROM messages WHERE status = {_DEAD} AND updated_at < :cut LIMIT 1"
#: Whole rows of up to ``:n`` dead letters that died before ``:cut``, by row id. On PostgreSQL they stay
#: locked until the transaction ends and rows another transaction holds are skipped, so two archivers never
#: take the same row (SQLite has one writer at a time anyway).
DEAD_LETTERS_BEFORE_LOCKED = (
    f"SELECT * FROM messages WHERE status = {_DEAD} AND updated_at < :cut ORDER BY id LIMIT :n{{skip_locked}}"
)


def delete_dead_letters(count: int) -> str:
    """Delete the dead letters with ``count`` row ids (``:i0``, ``:i1``, …); a row no longer dead is left
    alone."""
    marks = ", ".join(f":i{i}" for i in range(count))
    return f"DELETE FROM messages WHERE status = {_DEAD} AND id IN ({marks})"


#: An archived message queued again as pending, due at ``:now``, with its original message id; no row when
#: a message with that id (or platform id) is in the queue already.
INSERT_RESTORED = (
    "INSERT INTO messages (message_id, channel, sender, sender_id, message, agent, from_agent, status, "
    "retry_count, manual_retries, last_error, created_at, updated_at, conversation, metadata, available_at, "
    "hops, external_id) VALUES (:message_id, :channel, :sender, :sender_id, :message, :agent, :from_agent, "
    f"{PENDING}, 0, :manual_retries, :last_error, :created_at, :now, :conversation, :metadata, :now, :hops, "
    ":external_id) ON CONFLICT DO NOTHING RETURNING id"
)
