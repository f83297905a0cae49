"""Enqueue: a new ``messages`` row as ``pending``, the dedupe look-ups around it and the debounce of a burst
(:mod:`shared.queue.enqueue`)."""

from __future__ import annotations

from shared.storage.queries.common import PENDING

MESSAGE_COLUMNS = (
    "message_id, channel, sender, sender_id, message, agent, from_agent, status, retry_count, "
    "created_at, updated_at, conversation, metadata, available_at, hops, external_id"
)
#: A duplicate (same message id, or same platform id on the channel) inserts nothing.
INSERT_MESSAGE = (
    f"INSERT INTO messages ({MESSAGE_COLUMNS}) VALUES (:message_id, :channel, :sender, :sender_id, "
    f":message, :agent, :from_agent, {PENDING}, 0, :now, :now, :conversation, :metadata, :available_at, "
    ":hops, :external_id) ON CONFLICT DO NOTHING"
)
#: The same INSERT as the head of the one-statement enqueue (shared.storage.dialect.Dialect.enqueue_statement).
INSERT_MESSAGE_RETURNING = INSERT_MESSAGE + " RETURNING id, message_id"

#: Whether the platform id is queued already (an insert that met it is a duplicate, not a clash of ids).
PLATFORM_ID_QUEUED = "SELECT 1 FROM messages WHERE channel = :c AND external_id = :e"
#: The queued message an enqueue that inserted nothing duplicates (same message id, or same platform id).
DUPLICATE_OF = (
    "SELECT id, message_id, agent FROM messages WHERE message_id = :m OR (channel = :c AND external_id = :e)"
)

#: The debounce: another message of the same chat still waiting for the same agent.
OTHER_WAITING = (
    f"SELECT 1 FROM messages WHERE status = {PENDING} AND agent = :agent AND channel = :channel "
    "AND conversation = :conversation AND id <> :id LIMIT 1"
)
#: ... and the burst's sliding window: every waiting message of the chat moves to the window's end.
SLIDE_WAITING = (
    f"UPDATE messages SET available_at = :at WHERE status = {PENDING} AND agent = :agent "
    "AND channel = :channel AND conversation = :conversation AND available_at < :at"
)
