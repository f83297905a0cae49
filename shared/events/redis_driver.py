"""The event log on Redis Streams (seed 001's distributed driver): same cursors, same semantics.

Layout, all under one hash tag so a Redis Cluster keeps them in one slot (scripts touch several keys):

- ``{prefix}:seq`` — the newest cursor;
- ``{prefix}:all`` — every event; ``{prefix}:topic:<topic>`` — the events of one topic. An event has the
  same entry id ``<cursor>-0`` in both, so cursors are the plain integers the SQL log uses;
- ``{prefix}:topics`` — the set of topics; ``{prefix}:pruned`` — per-topic (and ``*``) cleanup watermarks;
- ``{prefix}:acks:<topic>`` — durable consumers' cursors.

Appends and cleanups run as Lua scripts, so the two streams, the sequence and the watermark change together.
A read takes its entries first and checks the watermark after: a cleanup that removed entries the reader
needed has recorded its watermark by then, so the reader gets :class:`~shared.events.entries.CursorExpired`, never a
silent gap.

Two ways to fill it:

- standalone: :meth:`RedisEventLog.append` numbers events itself (``INCR``) — what the conformance tests use;
- relayed (how agentpost runs with ``events.driver = "redis"``): the SQL log stays the system of record,
  because queue operations append their events inside their own transactions; :meth:`RedisEventLog.copy`
  adds committed SQL events in cursor order with the SQL id as entry id, refusing ids it already has. See
  :mod:`shared.events.drivers`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from typing import Any, cast

import redis

from shared.clock import now_ms
from shared.events.entries import ALL_TOPICS, CursorExpired, EventEntry, Handler, Unsubscribe, cursor_int
from shared.events.subscriptions import LocalSubscriptions

# KEYS: seq, all, topic stream, topics set. ARGV: topic, type, message id, payload, created_at.
_APPEND = """
local id = redis.call('INCR', KEYS[1])
local sid = id .. '-0'
redis.call('XADD', KEYS[2], sid, 't', ARGV[1], 'y', ARGV[2], 'm', ARGV[3], 'p', ARGV[4], 'c', ARGV[5])
redis.call('XADD', KEYS[3], sid, 't', ARGV[1], 'y', ARGV[2], 'm', ARGV[3], 'p', ARGV[4], 'c', ARGV[5])
redis.call('SADD', KEYS[4], ARGV[1])
return id
"""

# Same keys; ARGV[6] is the id to use. Returns 0 (and changes nothing) for an id at or below the newest.
_COPY = """
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local id = tonumber(ARGV[6])
if id <= last then return 0 end
redis.call('SET', KEYS[1], ARGV[6])
local sid = ARGV[6] .. '-0'
redis.call('XADD', KEYS[2], sid, 't', ARGV[1], 'y', ARGV[2], 'm', ARGV[3], 'p', ARGV[4], 'c', ARGV[5])
redis.call('XADD', KEYS[3], sid, 't', ARGV[1], 'y', ARGV[2], 'm', ARGV[3], 'p', ARGV[4], 'c', ARGV[5])
redis.call('SADD', KEYS[4], ARGV[1])
return 1
"""

# KEYS: topic stream, all stream, pruned hash. ARGV: topic, watermark, ids...
_DROP = """
local n = 0
for i = 3, #ARGV do
  n = n + redis.call('XDEL', KEYS[1], ARGV[i])
  redis.call('XDEL', KEYS[2], ARGV[i])
end
local w = tonumber(ARGV[2])
for _, field in ipairs({ARGV[1], '*'}) do
  local cur = tonumber(redis.call('HGET', KEYS[3], field) or '0')
  if w > cur then redis.call('HSET', KEYS[3], field, ARGV[2]) end
end
return n
"""

# KEYS: pruned hash, seq. ARGV: watermark. Marks everything up to it as gone (relay fell behind SQL cleanup).
_MARK_PRUNED = """
local w = tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', KEYS[1], '*') or '0')
if w > cur then redis.call('HSET', KEYS[1], '*', ARGV[1]) end
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if w > last then redis.call('SET', KEYS[2], ARGV[1]) end
return 1
"""

# KEYS: acks hash. ARGV: consumer, cursor. Never moves backwards.
_ACK = """
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
if tonumber(ARGV[2]) > cur then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return 1
"""

_DROP_CHUNK = 500


def _entry(entry_id: str, fields: dict[str, str]) -> EventEntry:
    return EventEntry(
        cursor=entry_id.split("-", 1)[0],
        topic=fields["t"],
        type=fields["y"],
        payload=json.loads(fields["p"]),
        created_at=int(fields["c"]),
        message_id=fields["m"] or None,
    )


class RedisEventLog(LocalSubscriptions):
    """An :class:`~shared.events.entries.EventLog` on Redis Streams."""

    def __init__(self, client: redis.Redis, prefix: str = "agentpost") -> None:
        """``client`` must decode responses (``decode_responses=True``); ``prefix`` separates installations."""
        self.client = client
        self.prefix = prefix
        tag = "{" + prefix + "}"
        self._seq = f"{tag}:seq"
        self._all = f"{tag}:all"
        self._topics = f"{tag}:topics"
        self._pruned = f"{tag}:pruned"
        self._topic_prefix = f"{tag}:topic:"
        self._acks_prefix = f"{tag}:acks:"
        self._append = client.register_script(_APPEND)
        self._copy = client.register_script(_COPY)
        self._drop = client.register_script(_DROP)
        self._mark = client.register_script(_MARK_PRUNED)
        self._ack = client.register_script(_ACK)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_url(cls, url: str, prefix: str = "agentpost") -> RedisEventLog:
        """Connect to ``url`` (``redis://host:port/db``)."""
        return cls(redis.Redis.from_url(url, decode_responses=True, health_check_interval=30), prefix)

    def keys(self) -> list[str]:
        """Every key this log uses (for cleanup of test prefixes)."""
        found = cast(list[str], self.client.keys("{" + self.prefix + "}:*"))
        return sorted(found)

    def destroy(self) -> None:
        """Delete every key of this prefix (tests, and ``agentpost`` tooling resetting a relay)."""
        keys = self.keys()
        if keys:
            self.client.delete(*keys)

    def _topic_key(self, topic: str) -> str:
        return self._topic_prefix + topic

    @staticmethod
    def _args(
        topic: str, type: str, payload: dict[str, Any], message_id: str | None, created_at: int
    ) -> list[Any]:
        body = json.dumps(payload, separators=(",", ":"), default=str)
        return [topic, type, message_id or "", body, created_at]

    # -- writing ------------------------------------------------------------------------------------------
    def append(self, topic: str, type: str, payload: dict[str, Any], *, message_id: str | None = None) -> str:
        keys = [self._seq, self._all, self._topic_key(topic), self._topics]
        cursor = self._append(keys=keys, args=self._args(topic, type, payload, message_id, now_ms()))
        self._deliver_local()
        return str(cursor)

    def copy(self, entries: Sequence[EventEntry]) -> int:
        """Add events that already have cursors (from the SQL log), in order; ids at or below the newest one
        here are skipped, so concurrent or repeated relays never duplicate. Returns how many were added."""
        if not entries:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for e in entries:
            args = [*self._args(e.topic, e.type, e.payload, e.message_id, e.created_at), str(int(e.cursor))]
            self._copy(
                keys=[self._seq, self._all, self._topic_key(e.topic), self._topics], args=args, client=pipe
            )
        return sum(int(r) for r in pipe.execute())

    def mark_pruned_through(self, cursor: str) -> None:
        """Record that every event up to ``cursor`` is gone (the relay found them cleaned up in SQL)."""
        self._mark(keys=[self._pruned, self._seq], args=[str(cursor_int(cursor))])

    # -- reading ------------------------------------------------------------------------------------------
    def pruned_through(self, topic: str | None) -> int:
        value = self.client.hget(self._pruned, topic or ALL_TOPICS)
        return int(cast(str, value)) if value else 0

    def read(self, topic: str | None, after: str | None = None, limit: int = 100) -> list[EventEntry]:
        after_id = cursor_int(after)
        limit = max(1, min(int(limit), 10_000))
        key = self._all if topic is None else self._topic_key(topic)
        raw = cast(
            list[tuple[str, dict[str, str]]], self.client.xrange(key, f"{after_id + 1}-0", "+", count=limit)
        )
        if after is not None:
            # Checked after the read: a cleanup records its watermark together with its deletions.
            pruned = self.pruned_through(topic)
            if after_id < pruned:
                raise CursorExpired(str(after_id), str(pruned))
        return [_entry(i, f) for i, f in raw]

    def last_cursor(self) -> str:
        value = self.client.get(self._seq)
        return str(int(cast(str, value))) if value else "0"

    def latest_cursor(self, topic: str | None) -> str | None:
        key = self._all if topic is None else self._topic_key(topic)
        found = cast(list[tuple[str, dict[str, str]]], self.client.xrevrange(key, "+", "-", count=1))
        return str(found[0][0]).split("-", 1)[0] if found else None

    def ack(self, consumer: str, topic: str, cursor: str) -> None:
        self._ack(keys=[self._acks_prefix + topic], args=[consumer, str(cursor_int(cursor))])
        self.client.hset(self._acks_prefix + topic + ":at", consumer, str(now_ms()))

    def consumer_cursor(self, consumer: str, topic: str) -> str | None:
        value = self.client.hget(self._acks_prefix + topic, consumer)
        return None if value is None else str(value)

    def consumer_ack(self, consumer: str, topic: str) -> tuple[str, int] | None:
        cursor = self.consumer_cursor(consumer, topic)
        if cursor is None:
            return None
        at = self.client.hget(self._acks_prefix + topic + ":at", consumer)
        return cursor, int(cast(str, at)) if at else 0

    def subscribe(self, topic: str | None, handler: Handler, *, after: str | None = None) -> Unsubscribe:
        start = cursor_int(after) if after is not None else int(self.last_cursor())
        sub = self._add_subscription(topic, handler, start)
        if after is not None:
            while self._pump(sub) >= self.PAGE:  # the backlog, before subscribe returns
                pass
        key = self._all if topic is None else self._topic_key(topic)
        # A blocking XREAD holds its connection: give the subscriber its own. It only waits for news; the
        # events are delivered by the same pump as appends of this process, so none is delivered twice.
        conn = redis.Redis(
            connection_pool=redis.ConnectionPool(**self.client.connection_pool.connection_kwargs)
        )

        def loop() -> None:
            try:
                while not sub.stopped.is_set() and not self._stop.is_set():
                    try:
                        conn.xread({key: f"{sub.position}-0"}, count=1, block=200)
                        self._pump(sub)
                    except redis.ConnectionError:
                        sub.stopped.wait(0.2)
            finally:
                with contextlib.suppress(Exception):
                    conn.close()

        thread = threading.Thread(target=loop, name=f"redis-events-{topic}", daemon=True)
        thread.start()
        self._threads.append(thread)

        def unsubscribe() -> None:
            self._drop_subscription(sub)

        return unsubscribe

    # -- cleanup ------------------------------------------------------------------------------------------
    def _drop_ids(self, topic: str, ids: list[int]) -> int:
        removed = 0
        for start in range(0, len(ids), _DROP_CHUNK):
            chunk = ids[start : start + _DROP_CHUNK]
            args: list[Any] = [topic, str(max(chunk)), *(f"{i}-0" for i in chunk)]
            removed += int(self._drop(keys=[self._topic_key(topic), self._all, self._pruned], args=args))
        return removed

    def cleanup(self, *, ttl_ms: int, max_per_topic: int) -> int:
        cutoff = now_ms() - ttl_ms
        removed = 0
        # TTL: events are appended in time order (give or take clock steps), so expired ones are a prefix.
        expired: dict[str, list[int]] = {}
        start = "-"
        done = False
        while not done:
            page = cast(
                list[tuple[str, dict[str, str]]], self.client.xrange(self._all, start, "+", count=1000)
            )
            if not page:
                break
            for entry_id, fields in page:
                if int(fields["c"]) >= cutoff:
                    done = True
                    break
                expired.setdefault(fields["t"], []).append(int(entry_id.split("-", 1)[0]))
            start = "(" + page[-1][0]
            if len(page) < 1000:
                break
        for topic, ids in expired.items():
            removed += self._drop_ids(topic, ids)
        # Per-topic cap, but never past what a durable consumer has not acked yet.
        for topic in sorted(cast(set[str], self.client.smembers(self._topics))):
            key = self._topic_key(topic)
            excess = int(self.client.xlen(key)) - max_per_topic
            if excess <= 0:
                continue
            head = cast(list[tuple[str, dict[str, str]]], self.client.xrange(key, "-", "+", count=excess))
            boundary = int(head[-1][0].split("-", 1)[0])
            floors = [
                int(v) for v in cast(dict[str, str], self.client.hgetall(self._acks_prefix + topic)).values()
            ]
            if floors:
                boundary = min(boundary, min(floors))
            ids = [int(i.split("-", 1)[0]) for i, _ in head if int(i.split("-", 1)[0]) <= boundary]
            if ids:
                removed += self._drop_ids(topic, ids)
        return removed

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self._threads.clear()
        with contextlib.suppress(Exception):
            self.client.close()
