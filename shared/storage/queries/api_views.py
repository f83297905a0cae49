"""What the web API reads and writes beyond the queue itself: agent history, team chat rooms, the replies
waiting in one chat, busy conversations, a database ping, where a user's chat is and the heartbeats
(:mod:`shared.reads.api_views`)."""

from __future__ import annotations

from shared.storage.queries.common import PROCESSING
from shared.storage.statuses import ResponseStatus

#: An agent's turns (``agent_messages``) with id above ``:s``, newest first.
AGENT_TURNS = "SELECT * FROM agent_messages WHERE agent_id = :a AND id > :s ORDER BY id DESC LIMIT :l"
#: A team chat room's posts with id above ``:s``, newest first.
CHAT_ROOM_POSTS = "SELECT * FROM chat_messages WHERE team_id = :t AND id > :s ORDER BY id DESC LIMIT :l"
ADD_CHAT_ROOM_POST = (
    "INSERT INTO chat_messages (team_id, from_agent, message, created_at) "
    "VALUES (:t, :f, :m, :now) RETURNING id"
)
#: The replies to one chat still to deliver, oldest first. ``status <> 'acked'`` repeats
#: ix_responses_open's condition, so SQLite uses that partial index.
PENDING_CHAT_REPLIES = (
    f"SELECT * FROM responses WHERE status <> '{ResponseStatus.ACKED}' AND channel = :c AND conversation = :v "
    f"AND status IN ('{ResponseStatus.PENDING}', '{ResponseStatus.DELIVERING}') ORDER BY id LIMIT :l"
)
#: One round trip to the database.
PING = "SELECT 1"
#: How many chats have a message being processed now.
ACTIVE_CONVERSATIONS = (
    "SELECT COUNT(*) FROM (SELECT DISTINCT agent, channel, conversation FROM messages "
    f"WHERE status = {PROCESSING}) AS busy"
)
PROCESSING_MESSAGE = f"SELECT * FROM messages WHERE id = :i AND status = {PROCESSING}"
#: The chats a user last wrote in on a channel, newest first.
SENDER_RECENT_CHATS = (
    "SELECT conversation, metadata FROM messages WHERE channel = :c AND sender_id = :s "
    "AND conversation <> '' ORDER BY id DESC LIMIT 50"
)
#: The chat a user was last answered in on a channel.
SENDER_LAST_ANSWERED_CHAT = (
    "SELECT conversation FROM responses WHERE channel = :c AND sender_id = :s AND conversation <> '' "
    "ORDER BY id DESC LIMIT 1"
)
#: When each agent's latest heartbeat message was queued.
LAST_HEARTBEATS = (
    "SELECT agent, MAX(created_at) AS at FROM messages WHERE channel = 'heartbeat' GROUP BY agent"
)
