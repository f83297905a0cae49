"""Pick the event log driver named by ``events.driver``: ``sql`` (default), ``memory`` or ``redis``.

With ``redis`` the SQL log stays the system of record: queue operations append their events in the same
transaction as the change they report, and only a database transaction can promise that. A relay copies
committed SQL events into the Redis streams in cursor order, each with its SQL id as entry id (``<id>-0``), so
cursors are identical in both and a client can move between them. Readers (the web adapter's streams, other
hosts) read Redis; before each read the relay catches up with SQL, so a reader never sees less than what had
committed when it asked. Several relays (one per web process) may run at once: Redis refuses an id it already
has, so nothing is copied twice. If SQL cleanup removed events before they were copied, the relay records a
watermark and readers behind it get an explicit reset, never a silent gap.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

from shared.events.entries import CursorExpired, EventEntry, EventLog, Handler, Unsubscribe
from shared.events.log import SqlEventLog
from shared.events.memory import MemoryEventLog
from shared.events.redis_driver import RedisEventLog
from shared.settings.model import Settings
from shared.storage.db import Database

RELAY_PAGE = 1000


class SqlToRedisRelay:
    """Copies committed SQL events into a :class:`RedisEventLog`, in cursor order."""

    def __init__(self, sql: SqlEventLog, target: RedisEventLog) -> None:
        self.sql = sql
        self.target = target
        self._lock = threading.Lock()

    def pump(self, max_events: int = 100_000) -> int:
        """Copy what SQL has beyond Redis's newest cursor (up to ``max_events``); returns how many."""
        copied = 0
        with self._lock:
            position = self.target.last_cursor()
            while copied < max_events:
                try:
                    batch = self.sql.read(None, position, RELAY_PAGE)
                except CursorExpired as exc:
                    self.target.mark_pruned_through(exc.retained_after)
                    position = exc.retained_after
                    continue
                if not batch:
                    break
                copied += self.target.copy(batch)
                position = batch[-1].cursor
                if len(batch) < RELAY_PAGE:
                    break
        return copied

    def behind(self) -> bool:
        """True when SQL has events Redis does not (a cheap probe before taking the relay lock)."""
        return int(self.sql.last_cursor()) > int(self.target.last_cursor())


class RelayedEventLog:
    """The ``redis`` driver as agentpost runs it: writes and acks go to SQL (and acks to Redis too), reads
    come from Redis after the relay caught up."""

    def __init__(
        self, sql: SqlEventLog, target: RedisEventLog, wait: Callable[[float], None] | None = None
    ) -> None:
        self.sql = sql
        self.redis = target
        self.relay = SqlToRedisRelay(sql, target)
        self._wait = wait
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> RelayedEventLog:
        """Relay in the background too, so Redis-only readers elsewhere stay current."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="events-relay", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.catch_up()
            except Exception:  # Redis or the database briefly away: try again after the next wait
                self._stop.wait(0.5)
            if self._wait is not None:
                self._wait(1.0)
            else:
                self._stop.wait(0.05)

    def catch_up(self) -> int:
        """Copy everything SQL has that Redis lacks; returns how many events were copied."""
        copied = 0
        while self.relay.behind():
            n = self.relay.pump()
            copied += n
            if n == 0:
                break
        return copied

    def append(self, topic: str, type: str, payload: dict[str, Any], *, message_id: str | None = None) -> str:
        cursor = self.sql.append(topic, type, payload, message_id=message_id)
        self.catch_up()
        self.redis._deliver_local()  # this process's subscribers have it before append returns
        return cursor

    def read(self, topic: str | None, after: str | None = None, limit: int = 100) -> list[EventEntry]:
        self.catch_up()
        return self.redis.read(topic, after, limit)

    def ack(self, consumer: str, topic: str, cursor: str) -> None:
        self.sql.ack(consumer, topic, cursor)
        self.redis.ack(consumer, topic, cursor)

    def consumer_cursor(self, consumer: str, topic: str) -> str | None:
        return self.sql.consumer_cursor(consumer, topic)

    def consumer_ack(self, consumer: str, topic: str) -> tuple[str, int] | None:
        return self.sql.consumer_ack(consumer, topic)

    def latest_cursor(self, topic: str | None) -> str | None:
        self.catch_up()
        return self.redis.latest_cursor(topic)

    def subscribe(self, topic: str | None, handler: Handler, *, after: str | None = None) -> Unsubscribe:
        self.catch_up()
        self.start()
        return self.redis.subscribe(topic, handler, after=after)

    def cleanup(self, *, ttl_ms: int, max_per_topic: int) -> int:
        self.catch_up()
        removed = self.sql.cleanup(ttl_ms=ttl_ms, max_per_topic=max_per_topic)
        self.redis.cleanup(ttl_ms=ttl_ms, max_per_topic=max_per_topic)
        return removed

    def last_cursor(self) -> str:
        self.catch_up()
        return self.redis.last_cursor()

    def stop(self) -> None:
        """Stop the background relay (reads still catch up on their own)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)
            self._thread = None

    def close(self) -> None:
        self.stop()
        self.redis.close()


def redis_prefix(settings: Settings) -> str:
    """The key prefix of this installation: ``AGENTPOST_REDIS_PREFIX``, else one derived from the database
    URL, so installations sharing a Redis server never mix their events."""
    explicit = settings.env.get("AGENTPOST_REDIS_PREFIX")
    if explicit:
        return explicit
    digest = hashlib.blake2b(settings.database_url.encode(), digest_size=6).hexdigest()
    return f"agentpost:{digest}"


def open_event_log(
    settings: Settings, db: Database, *, wait: Callable[[float], None] | None = None
) -> EventLog:
    """The event log ``events.driver`` names, over ``db``. ``wait(timeout)`` blocks until the database may
    have changed (pass ``runtime.waker.wait_for_change``). ``memory`` is only useful inside one process."""
    driver = settings.events.driver
    if driver == "memory":
        return MemoryEventLog()
    sql = SqlEventLog(db, wait)
    if driver == "sql":
        return sql
    target = RedisEventLog.from_url(settings.events.redis_url, redis_prefix(settings))
    return RelayedEventLog(sql, target, wait).start()
