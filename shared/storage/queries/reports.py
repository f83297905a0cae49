"""Read-only statistics over the queue and the event log (:mod:`shared.queue.reports`): how busy an agent
is, what traffic the event log recorded, whether any processor runs."""

from __future__ import annotations

from shared.storage.queries.common import OPEN, PENDING
from shared.storage.queries.events import topic_filter

#: An hour in epoch ms: the event counts are grouped by ``created_at / HOUR_MS``.
HOUR_MS = 3_600_000

#: Messages of ``:a`` waiting or running, counted through the index of open messages.
OPEN_OF_AGENT_COUNT = f"SELECT COUNT(*) FROM messages WHERE agent = :a AND status IN {OPEN}"


def hourly_event_counts(types: int) -> str:
    """Events of each of ``types`` types (``:t0``, ``:t1``, …) per hour, from ``:since`` on."""
    marks = ", ".join(f":t{i}" for i in range(types))
    return (
        f"SELECT created_at / {HOUR_MS} AS h, type, COUNT(*) AS n FROM events WHERE type IN ({marks}) "
        f"AND created_at >= :since GROUP BY created_at / {HOUR_MS}, type"
    )


#: The events that report completions (their payloads name every message of the group), from ``:since`` on.
COMPLETIONS_SINCE = (
    "SELECT created_at, payload FROM events WHERE type IN ('response_ready', 'message_completed') "
    "AND created_at >= :since"
)
#: The second with the most received messages from ``:since`` on; the earliest of equals.
BUSIEST_SECOND = (
    "SELECT created_at / 1000 AS s, COUNT(*) AS n FROM events WHERE type = 'message_received' "
    "AND created_at >= :since GROUP BY created_at / 1000 ORDER BY COUNT(*) DESC, created_at / 1000 LIMIT 1"
)
BUSIEST_MINUTE_COUNT = (
    "SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM events WHERE type = 'message_received' "
    "AND created_at >= :since GROUP BY created_at / 60000) AS per_minute"
)
OLDEST_EVENT_AT = "SELECT MIN(created_at) FROM events"
OLDEST_PENDING_AT = f"SELECT MIN(created_at) FROM messages WHERE status = {PENDING}"
MESSAGE_METADATA = "SELECT metadata FROM messages WHERE message_id = :m"
#: The newest ``:n`` processor start and stop events (``:topic`` is ``processor``). The topic term is
#: :func:`~shared.storage.queries.events.topic_filter`'s: it repeats the condition of the topic's partial
#: index, which the planners use only when the query states it.
PROCESSOR_EVENTS = (
    f"SELECT type, payload FROM events WHERE {topic_filter('processor')} "
    "AND type IN ('processor_start', 'processor_stop') ORDER BY id DESC LIMIT :n"
)
#: The holders of agent leases that have not run out by ``:now``.
LIVE_LEASE_HOLDERS = "SELECT holder FROM agent_leases WHERE holder IS NOT NULL AND lease_until >= :now"
