"""Writing what the processor observes — events and run status records — so that a failure to write them
never fails the run they describe (they are observability; the queue's own writes are not written here).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ParamSpec

from shared.aio import call
from shared.events.log import PendingEvent, SqlEventLog

log = logging.getLogger("agentpost.processor")

P = ParamSpec("P")


async def record_event(
    events: SqlEventLog, topic: str, type_: str, payload: dict[str, Any], message_id: str | None = None
) -> None:
    """Append one event; a failure is logged, not raised."""
    try:
        await call(events.append, topic, type_, payload, message_id=message_id)
    except Exception as exc:
        log.warning("could not append event %s: %s", type_, exc)


async def record_events(events: SqlEventLog, batch: list[PendingEvent]) -> None:
    """Append ``batch`` in one transaction; a failure is logged, not raised."""
    try:
        await call(events.append_many, batch)
    except Exception as exc:
        log.warning("could not append %d events: %s", len(batch), exc)


async def quietly(write: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs) -> None:
    """``write(*args, **kwargs)`` on a worker thread for a run status record; a failure is logged, not
    raised."""
    try:
        await call(write, *args, **kwargs)
    except Exception as exc:
        log.warning("could not update the run record: %s", exc)
