"""Replies nobody will deliver: responses on channels no adapter serves (heartbeat, schedule), acknowledged
so they stop counting as waiting, with their text kept in the event log.
"""

from __future__ import annotations

from typing import Any

from shared.events.log import PendingEvent, append_events
from shared.storage.db import Database
from shared.storage.queries import unserved as q


def ack_unserved_responses(db: Database, channels: list[str], *, created_before: int, now: int) -> list[int]:
    """Acknowledge the replies on ``channels`` created at or before ``created_before`` (epoch ms) and not
    being delivered right now (pending, or their delivery lease lapsed), appending one
    ``response_unserved`` event with each reply's text, in one transaction. Returns their ids, sorted.

    A read-only probe comes first, so the usual case (nothing to do) takes no write lock."""
    if not channels:
        return []
    params: dict[str, Any] = {"cut": created_before, "now": now}
    params.update((f"c{i}", channel) for i, channel in enumerate(channels))
    if db.read_scalar(q.any_unserved(len(channels)), params) is None:
        return []
    with db.transaction() as tx:
        rows = tx.rows(q.ack_unserved(len(channels)), params)
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
