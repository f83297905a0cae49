"""``agent_leases``: one row per agent, holding its run lease, its pause and a stop request
(:mod:`shared.queue.control`, :mod:`shared.queue.leases`)."""

from __future__ import annotations

from shared.storage.queries.common import CHAT_KEY, PENDING

ENSURE_ROW = (
    "INSERT INTO agent_leases (agent, holder, lease_until, acquired_at, paused_until, stop_requested, note) "
    "VALUES (:agent, NULL, 0, 0, 0, '', '') ON CONFLICT (agent) DO NOTHING"
)
#: Never shortens a pause already longer.
PAUSE = "UPDATE agent_leases SET paused_until = :until, note = :reason WHERE agent = :agent AND paused_until < :until"
RESUME = "UPDATE agent_leases SET paused_until = 0, note = '' WHERE agent = :agent"
ROW = "SELECT * FROM agent_leases WHERE agent = :a"
REQUEST_STOP = "UPDATE agent_leases SET stop_requested = :c WHERE agent = :agent"
STOP_REQUEST_OF_HOLDER = "SELECT stop_requested FROM agent_leases WHERE agent = :agent AND holder = :worker"
STOP_REQUEST_OF_HOLDER_LOCKED = (
    "SELECT stop_requested FROM agent_leases WHERE agent = :agent AND holder = :worker "
    "AND stop_requested <> ''{lock_rows}"
)
CLEAR_STOP_REQUEST = "UPDATE agent_leases SET stop_requested = '' WHERE agent = :agent"

#: Whether a message for the agent waits in a chat, available by ``:now`` (it interrupts that chat's run).
ARRIVAL_IN_CHAT = (
    f"SELECT 1 FROM messages WHERE status = {PENDING} AND agent = :a AND channel = :c "
    f"AND {CHAT_KEY} = :conv AND available_at <= :now LIMIT 1"
)
#: Messages waiting for the first time behind the agent's run, oldest first.
FIRST_WAITING = (
    "SELECT message_id, channel, sender, sender_id, conversation FROM messages "
    f"WHERE status = {PENDING} AND agent = :a AND retry_count = 0 ORDER BY id LIMIT :n"
)
