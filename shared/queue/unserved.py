"""Replies nobody will deliver: responses on channels no adapter serves (heartbeat, schedule), acknowledged
so they stop counting as waiting, with their text kept in the event log.
"""

from __future__ import annotations

from typing import Any

from shared.events.log import PendingEvent, append_events
from shared.storage.db import Database
from shared.storage.statuses import ResponseStatus


def ack_unserved_responses(db: Database, channels: list[str], *, created_before: int, now: int) -> list[int]:
    """Acknowledge the replies on ``channels`` created at or before ``created_before`` (epoch ms) and not
    being delivered right now (pending, or their delivery lease lapsed), appending one
    ``response_unserved`` event with each reply's text, in one transaction. Returns their ids, sorted.

    A read-only probe comes first, so the usual case (nothing to do) takes no write lock."""
    if not channels:
        return []
    keys = [f"c{i}" for i in range(len(channels))]
    clause = ", ".join(":" + k for k in keys)
    params: dict[str, Any] = {"cut": created_before, "now": now, **dict(zip(keys, channels, strict=True))}
    where = (
        f"channel IN ({clause}) AND status <> '{ResponseStatus.ACKED}' AND created_at <= :cut "
        f"AND (status = '{ResponseStatus.PENDING}' OR lease_until IS NULL OR lease_until < :now)"
    )
    if db.read_scalar(f"SELECT 1 FROM responses WHERE {where} LIMIT 1", params) is None:
        return []
    with db.transaction() as tx:
        rows = tx.rows(
            f"UPDATE responses SET status = '{ResponseStatus.ACKED}', acked_at = :now, updated_at = :now, lease_until = NULL, "
            f"claimed_by = 'scheduler' WHERE {where} RETURNING id, message_id, channel, agent, message",
            params,
        )
        append_events(
            tx,
            [
                PendingEvent(
                    "response_unserved",
                    {
                        "response_id": r["id"],
                        "channel": r["channel"],
                        "agent": r["agent"],
                        "reply": str(r["message"])[:4000],
                    },
                    r["message_id"],
                )
                for r in rows
            ],
            now,
        )
    return sorted(int(r["id"]) for r in rows)
