"""The event log's interface (seed 001): what a reader sees (:class:`EventEntry`), the :class:`EventLog`
protocol every driver implements, and cursors.

Cursors are strings to clients and integers inside (:func:`parse_cursor`): the SQL driver's cursor is the
event row id, the Redis driver's its stream id. The drivers are :mod:`shared.events.log` (SQL),
:mod:`shared.events.memory` and :mod:`shared.events.redis_driver`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

ALL_TOPICS = "*"


@dataclass(frozen=True)
class EventEntry:
    """One event as a reader sees it."""

    cursor: str
    topic: str
    type: str
    payload: dict[str, Any]
    created_at: int
    message_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "topic": self.topic,
            "type": self.type,
            "payload": self.payload,
            "created_at": self.created_at,
            "message_id": self.message_id,
        }


class CursorExpired(Exception):
    """The reader's cursor is older than the retained log: events after it were cleaned up."""

    def __init__(self, cursor: str, retained_after: str) -> None:
        super().__init__(
            f"cursor {cursor} is older than the retained log (events up to {retained_after} removed)"
        )
        self.cursor = cursor
        self.retained_after = retained_after


Handler = Callable[[EventEntry], None]
Unsubscribe = Callable[[], None]


class EventLog(Protocol):
    """A durable event queue with cursors (seed 001's ``EventQueue``)."""

    def append(self, topic: str, type: str, payload: dict[str, Any], *, message_id: str | None = None) -> str:
        """Append one event; returns its cursor."""
        ...

    def read(self, topic: str | None, after: str | None = None, limit: int = 100) -> list[EventEntry]:
        """Events of ``topic`` (``None``: every topic) after ``after``, oldest first.

        Raises :class:`CursorExpired` when events after ``after`` have been cleaned up.
        """
        ...

    def ack(self, consumer: str, topic: str, cursor: str) -> None:
        """Record that ``consumer`` has processed ``topic`` up to ``cursor`` (never moves backwards)."""
        ...

    def subscribe(self, topic: str | None, handler: Handler, *, after: str | None = None) -> Unsubscribe:
        """Call ``handler`` for each event after ``after`` (default: from now on), in order."""
        ...

    def cleanup(self, *, ttl_ms: int, max_per_topic: int) -> int:
        """Drop events past their TTL, or past the per-topic cap once every durable consumer has acked
        them. Returns how many were removed."""
        ...

    def last_cursor(self) -> str:
        """The newest cursor (``"0"`` for an empty log)."""
        ...

    def latest_cursor(self, topic: str | None) -> str | None:
        """The newest cursor of ``topic`` (``None``: of any topic), ``None`` when it has no events."""
        ...

    def consumer_ack(self, consumer: str, topic: str) -> tuple[str, int] | None:
        """``consumer``'s acknowledged cursor on ``topic`` and when it last acked (epoch ms), if ever."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class AckedEntry:
    """An event with its acknowledgement state for one consumer (seed 001's ``acknowledged`` flags): an
    ack of cursor N acknowledges every event of the topic up to N."""

    entry: EventEntry
    acknowledged: bool
    acknowledged_at: int | None


def read_with_acks(
    log: EventLog, topic: str, consumer: str, after: str | None = None, limit: int = 100
) -> list[AckedEntry]:
    """:meth:`EventLog.read` of one topic, each event flagged acknowledged or not by ``consumer``."""
    state = log.consumer_ack(consumer, topic)
    upto, at = (int(state[0]), state[1]) if state is not None else (0, None)
    return [
        AckedEntry(e, int(e.cursor) <= upto, at if int(e.cursor) <= upto else None)
        for e in log.read(topic, after, limit)
    ]


#: The largest cursor: event ids are signed 64-bit integers in SQLite, PostgreSQL and Redis stream ids.
MAX_CURSOR = 2**63 - 1


def parse_cursor(cursor: str) -> int:
    """The integer behind a client's cursor string, or :class:`ValueError` saying what is wrong with it.

    Only plain decimal digits within the id range are accepted: anything else could never have been handed
    out by this log, and a number past 64 bits would fail deep inside the database driver instead."""
    if not cursor.isascii() or not cursor.isdigit():
        raise ValueError(
            f"invalid cursor {cursor[:40]!r}: a cursor is a whole number from 0 to {MAX_CURSOR}, "
            "as this server hands out"
        )
    if len(cursor) > 19 or int(cursor) > MAX_CURSOR:
        raise ValueError(f"invalid cursor {cursor[:40]!r}: cursors go up to {MAX_CURSOR}")
    return int(cursor)


def cursor_int(cursor: str | None) -> int:
    """:func:`parse_cursor` of a cursor that may be absent (``None`` or empty: 0, before every event)."""
    if cursor is None or cursor == "":
        return 0
    return parse_cursor(str(cursor))


def entries_by_type(entries: Iterable[EventEntry]) -> dict[str, list[EventEntry]]:
    """Group events by type (handy for trace views and tests)."""
    out: dict[str, list[EventEntry]] = {}
    for e in entries:
        out.setdefault(e.type, []).append(e)
    return out
