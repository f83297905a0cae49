"""The durable event log in the shared database (seed 001): append, read from a cursor, ack, subscribe,
cleanup. Its interface, what a reader sees and cursors are in :mod:`shared.events.entries`; the in-process
subscribers it shares with the Redis driver in :mod:`shared.events.subscriptions`.

Cursors are strings to clients and integers inside: the SQL driver's cursor is the event row id. A reader
never skips an event: an event that commits after a reader has passed cursor N always gets an id above N.
SQLite has one writer at a time, so ids taken as ``max + 1`` follow commit order. PostgreSQL writers append
side by side without waiting for each other: an id there is its transaction's xid and the event's place in it,
and readers see only ids below the oldest transaction of the database still running (see :class:`shared.storage.dialect.Dialect`), so
an id becomes readable once nothing can commit below it. Queue operations append their events with
:func:`append_events` inside the transaction of the state change they report.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.clock import now_ms
from shared.events.entries import ALL_TOPICS, CursorExpired, EventEntry, Handler, Unsubscribe, cursor_int
from shared.events.subscriptions import LocalSubscriptions
from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope
from shared.storage.queries import events as q

# The term for one topic's events: where it lives now, kept importable here for the code that reads the log
# by topic.


@dataclass
class PendingEvent:
    """An event to append inside a queue transaction."""

    type: str
    payload: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    topic: str = "queue"


#: One compact encoder for every payload (``json.dumps`` with options builds a new encoder per call).
encode_payload = json.JSONEncoder(separators=(",", ":"), default=str).encode


def append_events(tx: Tx, events: Sequence[PendingEvent], created_at: int | None = None) -> None:
    """Append events in the caller's transaction, so they commit (or vanish) with the change they report."""
    if not events:
        return
    params = _event_params(tx, events, created_at)
    insert = tx.dialect.event_insert_driver
    if len(params) == 1:
        tx.execute_raw(insert, params[0])
    else:
        tx.executemany_raw(insert, params)
    tx.signal("events")


def _event_params(tx: Tx, events: Sequence[PendingEvent], created_at: int | None) -> list[dict[str, Any]]:
    first = tx.event_ordinals(len(events))
    ts = now_ms() if created_at is None else created_at
    return [
        {
            "ordinal": first + i,
            "topic": e.topic,
            "type": e.type,
            "message_id": e.message_id,
            "payload": encode_payload(e.payload),
            "created_at": ts,
        }
        for i, e in enumerate(events)
    ]


def entry_from_row(row: dict[str, Any]) -> EventEntry:
    """An :class:`EventEntry` from an ``events`` row."""
    return EventEntry(
        cursor=str(row["id"]),
        topic=row["topic"],
        type=row["type"],
        payload=json.loads(row["payload"]),
        created_at=int(row["created_at"]),
        message_id=row["message_id"],
    )


class SqlEventLog(LocalSubscriptions):
    """The event log in the shared database (SQLite or PostgreSQL)."""

    def __init__(self, db: Database, wait: Callable[[float], None] | None = None) -> None:
        """``wait(timeout)`` blocks until the database may have changed (see :mod:`shared.events.wake`)."""
        self.db = db
        self._wait = wait
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def append_many(self, events: Sequence[PendingEvent]) -> None:
        """Append several events in one transaction, in order (a run's batched progress, say)."""
        if not events:
            return
        with self.db.transaction() as tx:
            append_events(tx, events)
        self._await_visible()
        self._deliver_local()

    def append(self, topic: str, type: str, payload: dict[str, Any], *, message_id: str | None = None) -> str:
        with self.db.transaction() as tx:
            event = PendingEvent(type=type, payload=payload, message_id=message_id, topic=topic)
            cursor = tx.insert(tx.dialect.event_insert, _event_params(tx, [event], None)[0])
            tx.signal("events")
        self._await_visible()
        self._deliver_local()
        return str(cursor)

    #: How long an append waits for older transactions to end before it returns without having delivered its
    #: events to this process's subscribers (their follower then delivers them once they are readable).
    VISIBLE_WAIT_S = 5.0

    def _await_visible(self) -> None:
        """Before delivering to this process's subscribers (seed 001: a subscriber has an event once its
        append returned): on PostgreSQL an event is readable only once every transaction that began
        writing before it has ended, which for agentpost's own short transactions is a few milliseconds."""
        read_after, readable = self.db.dialect.event_read_after, self.db.dialect.event_readable
        if read_after is None or readable is None or not self._local_subs():
            return
        target = self.db.read_scalar(read_after)
        deadline = time.monotonic() + self.VISIBLE_WAIT_S
        pause = 0.0005
        while not self.db.read_scalar(readable, {"target": target}):
            if time.monotonic() > deadline:
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def pruned_through(self, topic: str | None) -> int:
        """The highest cursor removed by cleanup for ``topic`` (or any topic)."""
        value = kv.get(self.db, Scope.EVENTS_PRUNED, topic or ALL_TOPICS)
        return int(value) if value else 0

    def read(self, topic: str | None, after: str | None = None, limit: int = 100) -> list[EventEntry]:
        after_id = cursor_int(after)
        limit = max(1, min(int(limit), 10_000))
        if after is not None and after_id < self.pruned_through(topic):
            raise CursorExpired(str(after_id), str(self.pruned_through(topic)))
        if topic is None:
            rows = self.db.read(q.READ_AFTER, {"after": after_id, "limit": limit})
        else:
            rows = self.db.read(
                q.read_topic_after(topic), {"topic": topic, "after": after_id, "limit": limit}
            )
        return [entry_from_row(r) for r in rows]

    def ack(self, consumer: str, topic: str, cursor: str) -> None:
        value = cursor_int(cursor)
        now = now_ms()
        with self.db.transaction() as tx:
            tx.execute(q.ACK, {"c": consumer, "t": topic, "v": value, "now": now})

    def consumer_cursor(self, consumer: str, topic: str) -> str | None:
        value = self.db.read_scalar(q.CONSUMER_CURSOR, {"c": consumer, "t": topic})
        return None if value is None else str(value)

    def consumer_ack(self, consumer: str, topic: str) -> tuple[str, int] | None:
        rows = self.db.read(q.CONSUMER_ACK, {"c": consumer, "t": topic})
        return (str(rows[0]["cursor"]), int(rows[0]["updated_at"])) if rows else None

    def last_cursor(self) -> str:
        return str(self.db.read_scalar(q.LAST_CURSOR))

    def latest_cursor(self, topic: str | None) -> str | None:
        if topic is None:
            value = self.db.read_scalar(q.LATEST_ID)
        else:
            value = self.db.read_scalar(q.latest_id_of_topic(topic), {"topic": topic})
        return None if value is None else str(value)

    def subscribe(self, topic: str | None, handler: Handler, *, after: str | None = None) -> Unsubscribe:
        start = cursor_int(after) if after is not None else int(self.last_cursor())
        sub = self._add_subscription(topic, handler, start)
        if after is not None:
            while self._pump(sub) >= self.PAGE:  # the backlog, before subscribe returns
                pass

        def loop() -> None:
            while not sub.stopped.is_set() and not self._stop.is_set():
                try:
                    n = self._pump(sub)
                except Exception:  # the database briefly away: try again after the next wait
                    n = 0
                if n < self.PAGE and not sub.stopped.is_set():
                    if self._wait is not None:
                        self._wait(0.5)
                    else:
                        sub.stopped.wait(0.05)

        thread = threading.Thread(target=loop, name=f"events-subscribe-{topic}", daemon=True)
        thread.start()
        self._threads.append(thread)

        def unsubscribe() -> None:
            self._drop_subscription(sub)

        return unsubscribe

    def cleanup(
        self, *, ttl_ms: int, max_per_topic: int, batch: int = 500, pause_seconds: float = 0.02
    ) -> int:
        """Drop events past ``ttl_ms`` (in batches of ``batch`` events, one short transaction each and
        ``pause_seconds`` apart, so an append never waits long) and past ``max_per_topic``."""
        now = now_ms()
        with self.db.transaction(write=False) as tx:
            ttl_max = last_id_before(tx, now - ttl_ms)
        removed = 0
        while ttl_max is not None:
            with self.db.transaction() as tx:
                # TTL wins over unacked consumers: an abandoned consumer must not keep the log forever.
                # Each batch marks what it removes in its own transaction: a reader never skips silently.
                end = tx.scalar(q.BATCH_END, {"b": ttl_max, "n": batch})
                if end is None:
                    break
                for t in tx.rows(q.TOPIC_MAX_THROUGH, {"b": int(end)}):
                    _record_pruned(tx, t["topic"], int(t["m"]), now)
                _record_pruned(tx, ALL_TOPICS, int(end), now)
                n = int(tx.execute(q.DELETE_THROUGH, {"b": int(end)}).rowcount)
            removed += n
            if n < batch or int(end) >= ttl_max:
                break
            time.sleep(pause_seconds)
        over_cap: list[tuple[str, int]] = []
        with self.db.transaction(write=False) as tx:
            for t in tx.rows(q.TOPICS_OVER_CAP, {"cap": max_per_topic}):
                topic = t["topic"]
                excess = int(t["n"]) - max_per_topic
                boundary = tx.scalar(q.topic_cap_boundary(topic), {"topic": topic, "o": excess - 1})
                floor = tx.scalar(q.SLOWEST_CONSUMER, {"t": topic})
                if floor is not None:
                    boundary = min(int(boundary), int(floor))
                if boundary is not None and int(boundary) > 0:
                    over_cap.append((str(topic), int(boundary)))
        for topic, boundary in over_cap:
            removed += _delete_topic_through(self.db, topic, boundary, now, batch, pause_seconds)
        return removed

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self._threads.clear()


def last_id_before(tx: Tx, cutoff: int) -> int | None:
    """The newest event id created before ``cutoff``, found by binary search over the primary key.

    Ids grow with the order in which transactions append and so, up to a few milliseconds, with
    ``created_at``: a search over ids costs a few
    primary-key lookups and spares every append the upkeep of an index on ``created_at``.
    """
    lo, hi = tx.rows(q.ID_RANGE)[0].values()
    if lo is None:
        return None
    found: int | None = None
    lo, hi = int(lo), int(hi)
    while lo <= hi:
        mid = (lo + hi) // 2
        row = tx.one(q.FIRST_FROM, {"i": mid})
        if row is None:
            hi = mid - 1
        elif int(row["created_at"]) < cutoff:
            found = int(row["id"])
            lo = int(row["id"]) + 1
        else:
            hi = mid - 1
    return found


def _delete_topic_through(db: Database, topic: str, boundary: int, now: int, batch: int, pause: float) -> int:
    """Remove ``topic``'s events through id ``boundary``, ``batch`` at a time, each batch a transaction of its
    own that marks what it removed; returns how many went."""
    removed = 0
    while True:
        with db.transaction() as tx:
            end = tx.scalar(q.topic_batch_end(topic), {"topic": topic, "b": boundary, "n": batch})
            if end is None:
                return removed
            n = int(tx.execute(q.delete_topic_through(topic), {"topic": topic, "b": int(end)}).rowcount)
            if n:
                _record_pruned(tx, topic, int(end), now)
                _record_pruned(tx, ALL_TOPICS, int(end), now)
        removed += n
        if n < batch or int(end) >= boundary:
            return removed
        time.sleep(pause)


def _record_pruned(tx: Tx, topic: str, cursor: int, now: int) -> None:
    # Compared as numbers: two cleanups committing out of order must not move the mark back.
    kv.put_max(tx, Scope.EVENTS_PRUNED, topic, str(cursor), now, numeric=True)
