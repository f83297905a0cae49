"""The event log in this process's memory, for tests and single-process tools."""

from __future__ import annotations

import threading
from typing import Any

from shared.clock import now_ms
from shared.events.entries import ALL_TOPICS, CursorExpired, EventEntry, Handler, Unsubscribe, cursor_int


class MemoryEventLog:
    """An in-process event log with the same semantics, for tests and single-process tools."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[EventEntry] = []
        self._next = 1
        self._acks: dict[tuple[str, str], int] = {}
        self._ack_times: dict[tuple[str, str], int] = {}
        self._pruned: dict[str, int] = {}
        self._subs: list[tuple[str | None, Handler]] = []

    def append(self, topic: str, type: str, payload: dict[str, Any], *, message_id: str | None = None) -> str:
        with self._lock:
            entry = EventEntry(str(self._next), topic, type, dict(payload), now_ms(), message_id)
            self._next += 1
            self._events.append(entry)
            subs = [h for t, h in self._subs if t is None or t == topic]
        for handler in subs:
            handler(entry)
        return entry.cursor

    def read(self, topic: str | None, after: str | None = None, limit: int = 100) -> list[EventEntry]:
        after_id = cursor_int(after)
        limit = max(1, min(int(limit), 10_000))
        with self._lock:
            pruned = self._pruned.get(topic or ALL_TOPICS, 0)
            if after is not None and after_id < pruned:
                raise CursorExpired(str(after_id), str(pruned))
            found = [
                e for e in self._events if int(e.cursor) > after_id and (topic is None or e.topic == topic)
            ]
        return found[:limit]

    def ack(self, consumer: str, topic: str, cursor: str) -> None:
        value = cursor_int(cursor)
        with self._lock:
            key = (consumer, topic)
            self._acks[key] = max(self._acks.get(key, 0), value)
            self._ack_times[key] = now_ms()

    def consumer_ack(self, consumer: str, topic: str) -> tuple[str, int] | None:
        with self._lock:
            key = (consumer, topic)
            if key not in self._acks:
                return None
            return str(self._acks[key]), self._ack_times[key]

    def latest_cursor(self, topic: str | None) -> str | None:
        with self._lock:
            found = [e.cursor for e in self._events if topic is None or e.topic == topic]
        return found[-1] if found else None

    def consumer_cursor(self, consumer: str, topic: str) -> str | None:
        with self._lock:
            value = self._acks.get((consumer, topic))
        return None if value is None else str(value)

    def last_cursor(self) -> str:
        with self._lock:
            return str(self._next - 1)

    def subscribe(self, topic: str | None, handler: Handler, *, after: str | None = None) -> Unsubscribe:
        backlog = self.read(topic, after, 10_000) if after is not None else []
        for entry in backlog:
            handler(entry)
        item = (topic, handler)
        with self._lock:
            self._subs.append(item)

        def unsubscribe() -> None:
            with self._lock:
                if item in self._subs:
                    self._subs.remove(item)

        return unsubscribe

    def cleanup(self, *, ttl_ms: int, max_per_topic: int) -> int:
        cutoff = now_ms() - ttl_ms
        with self._lock:
            before = len(self._events)
            dropped = [e for e in self._events if e.created_at < cutoff]
            keep = [e for e in self._events if e.created_at >= cutoff]
            by_topic: dict[str, list[EventEntry]] = {}
            for e in keep:
                by_topic.setdefault(e.topic, []).append(e)
            for topic, entries in by_topic.items():
                excess = len(entries) - max_per_topic
                if excess <= 0:
                    continue
                boundary = int(entries[excess - 1].cursor)
                floors = [v for (_, t), v in self._acks.items() if t == topic]
                if floors:
                    boundary = min(boundary, min(floors))
                dropped.extend(e for e in entries if int(e.cursor) <= boundary)
            gone = {e.cursor for e in dropped}
            self._events = [e for e in self._events if e.cursor not in gone]
            for e in dropped:
                self._pruned[e.topic] = max(self._pruned.get(e.topic, 0), int(e.cursor))
                self._pruned[ALL_TOPICS] = max(self._pruned.get(ALL_TOPICS, 0), int(e.cursor))
            return before - len(self._events)

    def close(self) -> None:
        with self._lock:
            self._subs.clear()
