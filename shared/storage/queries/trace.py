"""One message's story for ``agentpost trace``: its events, its row, its replies and its agent's pause
(:mod:`shared.reads.trace`)."""

from __future__ import annotations

#: The events naming message ``:m``. Group events (claims, completions) list every member in their payload;
#: the LIKE (``:pattern``, the quoted id between ``%``) finds those too.
#: Only events after id ``:after`` are read: those before the message was received cannot name it, and
#: the log is in time order, so a trace reads what happened since the message, not the whole log.
EVENTS_OF_MESSAGE = (
    "SELECT * FROM events WHERE id > :after AND (message_id = :m OR payload LIKE :pattern) ORDER BY id"
)
AGENT_PAUSED_UNTIL = "SELECT paused_until FROM agent_leases WHERE agent = :a"
MESSAGE = "SELECT * FROM messages WHERE message_id = :m"
RESPONSES_OF_MESSAGE = "SELECT * FROM responses WHERE message_id = :m ORDER BY id"
