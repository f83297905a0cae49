"""Replies nobody will deliver: ``responses`` rows on channels no adapter serves, acknowledged in bulk
(:mod:`shared.queue.unserved`). The channels are ``:c0``, ``:c1``, … (one per channel asked about)."""

from __future__ import annotations

from functools import lru_cache

from shared.storage.statuses import ResponseStatus


def _unserved(channels: int) -> str:
    """The replies on the channels created at or before ``:cut`` and not being delivered at ``:now``
    (pending, or their delivery lease lapsed)."""
    names = ", ".join(f":c{i}" for i in range(channels))
    return (
        f"channel IN ({names}) AND status <> '{ResponseStatus.ACKED}' AND created_at <= :cut "
        f"AND (status = '{ResponseStatus.PENDING}' OR lease_until IS NULL OR lease_until < :now)"
    )


@lru_cache(maxsize=16)
def any_unserved(channels: int) -> str:
    """Whether such a reply exists (the read-only probe before the write)."""
    return f"SELECT 1 FROM responses WHERE {_unserved(channels)} LIMIT 1"


@lru_cache(maxsize=16)
def ack_unserved(channels: int) -> str:
    """Acknowledge them on behalf of the scheduler, returning what their ``response_unserved`` events keep."""
    return (
        f"UPDATE responses SET status = '{ResponseStatus.ACKED}', acked_at = :now, updated_at = :now, "
        f"lease_until = NULL, claimed_by = 'scheduler' WHERE {_unserved(channels)} "
        "RETURNING id, message_id, channel, agent, message"
    )
