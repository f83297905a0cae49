"""One conformance suite for every event log driver: memory, SQL on SQLite, SQL on PostgreSQL, Redis Streams
(standalone) and the Redis driver as agentpost runs it (SQL system of record relayed into Redis).

Redis tests use a unique key prefix per test and delete every key of it afterwards."""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.drivers import RelayedEventLog, open_event_log, redis_prefix
from shared.events.entries import CursorExpired, EventEntry, EventLog, read_with_acks
from shared.events.log import SqlEventLog
from shared.events.memory import MemoryEventLog
from shared.events.redis_driver import RedisEventLog
from shared.storage.schema import open_database
from tests.probes import service_unavailable
from tests.web_support import make_home, runtime_for, wait_until

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("AGENTPOST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_client() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        service_unavailable("Redis", exc)
    return client


@pytest.fixture
def redis_log() -> Iterator[RedisEventLog]:
    log = RedisEventLog(redis_client(), prefix=f"agentpost-test-{secrets.token_hex(6)}")
    yield log
    log.destroy()
    assert log.keys() == []
    log.close()


DRIVERS = [
    "memory",
    "sql-sqlite",
    pytest.param("sql-postgresql", marks=pytest.mark.postgres),
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-relayed", marks=pytest.mark.redis),
]


@pytest.fixture(params=DRIVERS)
def events(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventLog]:
    kind = request.param
    if kind == "memory":
        log: EventLog = MemoryEventLog()
        yield log
        log.close()
        return
    if kind == "redis":
        yield request.getfixturevalue("redis_log")
        return
    url = request.getfixturevalue("pg_url") if kind == "sql-postgresql" else f"sqlite:///{tmp_path / 'ev.db'}"
    db = open_database(url)
    if kind == "redis-relayed":
        target: RedisEventLog = request.getfixturevalue("redis_log")
        relayed = RelayedEventLog(SqlEventLog(db), target)
        yield relayed
        relayed.stop()
    else:
        sql = SqlEventLog(db)
        yield sql
        sql.close()
    db.close()


def types(entries: list[EventEntry]) -> list[str]:
    return [e.type for e in entries]


def test_append_read_in_order_with_cursors(events: EventLog) -> None:
    assert events.last_cursor() == "0"
    assert events.read(None) == []
    cursors = [events.append("queue", f"e{i}", {"i": i}, message_id=f"api_0000000{i}") for i in range(5)]
    assert [int(c) for c in cursors] == sorted(int(c) for c in cursors)
    assert len(set(cursors)) == 5
    assert events.last_cursor() == cursors[-1]
    everything = events.read(None)
    assert types(everything) == ["e0", "e1", "e2", "e3", "e4"]
    assert [e.cursor for e in everything] == cursors
    assert everything[2].payload == {"i": 2} and everything[2].message_id == "api_00000002"
    assert everything[0].created_at <= now_ms()
    assert types(events.read(None, cursors[1])) == ["e2", "e3", "e4"]
    assert types(events.read(None, cursors[1], limit=2)) == ["e2", "e3"]
    assert events.read(None, cursors[-1]) == []
    assert types(events.read(None, "0")) == types(everything)


def test_topics_filter(events: EventLog) -> None:
    a1 = events.append("a", "a1", {})
    events.append("b", "b1", {})
    events.append("a", "a2", {"nested": {"x": [1, 2]}})
    assert types(events.read("a")) == ["a1", "a2"]
    assert types(events.read("b")) == ["b1"]
    assert types(events.read("a", a1)) == ["a2"]
    assert events.read("a", a1)[0].payload == {"nested": {"x": [1, 2]}}
    assert events.read("none") == []
    assert types(events.read(None)) == ["a1", "b1", "a2"]


def test_invalid_cursor_is_rejected(events: EventLog) -> None:
    events.append("queue", "x", {})
    for bad in ("abc", "-1", "1.5"):
        with pytest.raises(ValueError):
            events.read(None, bad)


def test_ack_never_moves_backwards(events: EventLog) -> None:
    cursors = [events.append("queue", "e", {}) for _ in range(3)]
    events.ack("dash", "queue", cursors[2])
    events.ack("dash", "queue", cursors[0])
    assert events.consumer_cursor("dash", "queue") == cursors[2]  # type: ignore[attr-defined]
    assert events.consumer_cursor("other", "queue") is None  # type: ignore[attr-defined]


def _age_everything(events: EventLog) -> None:
    # Deterministic instead of sleeping: wait until the clock has moved past the newest event.
    newest = max(e.created_at for e in events.read(None, None, 10_000))
    wait_until(lambda: now_ms() > newest, 2, "the clock to pass the newest event")


def test_ttl_cleanup_then_old_cursor_expires(events: EventLog) -> None:
    cursors = [events.append("queue", f"e{i}", {}) for i in range(4)]
    _age_everything(events)
    assert events.cleanup(ttl_ms=0, max_per_topic=1000) == 4
    with pytest.raises(CursorExpired) as info:
        events.read(None, cursors[1])
    assert info.value.retained_after == cursors[-1]
    with pytest.raises(CursorExpired):
        events.read("queue", "0")
    assert events.read(None, cursors[-1]) == []
    after = events.append("queue", "fresh", {})
    assert types(events.read(None, cursors[-1])) == ["fresh"]
    assert int(after) > int(cursors[-1])  # cursors are never reused


def test_cap_per_topic_respects_unacked_consumers(events: EventLog) -> None:
    a = [events.append("a", f"a{i}", {}) for i in range(10)]
    b = [events.append("b", f"b{i}", {}) for i in range(2)]
    events.ack("slow", "a", a[3])
    removed = events.cleanup(ttl_ms=3_600_000, max_per_topic=3)
    # Cap 3 would drop a0..a6, but consumer "slow" has only acked up to a3: a4.. are kept for it.
    assert removed == 4
    assert types(events.read("a", a[3])) == [f"a{i}" for i in range(4, 10)]
    with pytest.raises(CursorExpired):
        events.read("a", a[2])
    assert types(events.read("b")) == ["b0", "b1"]
    assert types(events.read("b", b[0])) == ["b1"]  # topic b was never pruned

    events.ack("slow", "a", a[9])
    assert events.cleanup(ttl_ms=3_600_000, max_per_topic=3) == 3
    assert types(events.read("a", a[6])) == ["a7", "a8", "a9"]


def test_subscribe_replays_then_follows_in_order(events: EventLog) -> None:
    first = events.append("queue", "before", {})
    got: list[EventEntry] = []
    lock = threading.Lock()

    def handler(entry: EventEntry) -> None:
        with lock:
            got.append(entry)

    stop = events.subscribe("queue", handler, after="0" if first == "1" else str(int(first) - 1))
    try:
        events.append("other", "ignored", {})
        for i in range(20):
            events.append("queue", f"live{i}", {})
        wait_until(lambda: len(got) >= 21, 10, "21 events through the subscription")
    finally:
        stop()
    with lock:
        assert types(got) == ["before"] + [f"live{i}" for i in range(20)]
        assert [int(e.cursor) for e in got] == sorted(int(e.cursor) for e in got)


def test_concurrent_appends_get_unique_cursors_in_read_order(events: EventLog) -> None:
    def writer(n: int) -> None:
        for i in range(25):
            events.append("queue", f"w{n}", {"i": i})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = events.read(None, None, 1000)
    assert len(everything) == 100
    assert len({e.cursor for e in everything}) == 100
    assert [int(e.cursor) for e in everything] == sorted(int(e.cursor) for e in everything)
    for n in range(4):
        assert [e.payload["i"] for e in everything if e.type == f"w{n}"] == list(range(25))


# -- the relay, as agentpost runs the redis driver -------------------------------------------------------
@pytest.mark.redis
def test_relay_copies_queue_events_with_identical_cursors(tmp_path: Path, redis_log: RedisEventLog) -> None:
    rt = runtime_for(make_home(tmp_path))
    try:
        relayed = RelayedEventLog(rt.events, redis_log)
        ids = [
            rt.queue.intake.enqueue_message(ChatAddress("web", "ann"), f"hello {i}").message_id
            for i in range(3)
        ]
        from_redis = relayed.read(None, "0")
        from_sql = rt.events.read(None, "0")
        assert [(e.cursor, e.type, e.message_id) for e in from_redis] == [
            (e.cursor, e.type, e.message_id) for e in from_sql
        ]
        assert [e.message_id for e in from_redis] == ids
        # A second relay (another web process) copies nothing twice.
        assert RelayedEventLog(rt.events, redis_log).catch_up() == 0
        assert redis_log.copy(from_sql) == 0
        # Events cleaned up in SQL before they were relayed become an explicit reset, not a gap.
        more = [
            rt.queue.intake.enqueue_message(ChatAddress("web", "ann"), f"later {i}").message_id
            for i in range(2)
        ]
        assert more
        with rt.db.transaction() as tx:
            tx.execute("UPDATE events SET created_at = 0")
        rt.events.cleanup(ttl_ms=1000, max_per_topic=1000)
        fresh = rt.events.append("queue", "after_cleanup", {})
        with pytest.raises(CursorExpired):
            relayed.read(None, from_redis[-1].cursor)
        assert [e.cursor for e in relayed.read(None, str(int(fresh) - 1))] == [fresh]
    finally:
        rt.close()


@pytest.mark.redis
def test_open_event_log_picks_the_configured_driver(tmp_path: Path) -> None:
    redis_client()
    home = make_home(tmp_path, extra='\n[events]\ndriver = "redis"\n')
    prefix = f"agentpost-test-{secrets.token_hex(6)}"
    rt = runtime_for(home, AGENTPOST_REDIS_URL=REDIS_URL, AGENTPOST_REDIS_PREFIX=prefix)
    log = open_event_log(rt.settings, rt.db)
    assert isinstance(log, RelayedEventLog)
    try:
        assert redis_prefix(rt.settings) == prefix and log.redis.prefix == prefix
        rt.queue.intake.enqueue_message(ChatAddress("web", "ann"), "via redis")
        wait_until(lambda: log.redis.last_cursor() != "0", 5, "the background relay")
        assert [e.type for e in log.redis.read(None, "0")] == ["message_received"]
    finally:
        log.redis.destroy()
        log.close()
        rt.close()
    sql_home = make_home(tmp_path / "sql")
    rt = runtime_for(sql_home)
    try:
        assert isinstance(open_event_log(rt.settings, rt.db), SqlEventLog)
    finally:
        rt.close()


# -- AgentX's event-queue unit tests (its first queue package, 7 cases), restated over our drivers ------------
# Facts recorded from AgentX's tests: an entry carries its topic, cursor, event and timestamp; reading after a
# cursor returns only later entries; an entry reads as acknowledged (with a time) once acked; a subscriber has
# an appended event by the time append returned and nothing after it unsubscribed; the latest cursor of a topic
# is null when empty, else the topic's newest; topics are isolated; cleanup drops acknowledged old entries.
# Differences, stated: an ack is a consumer's (AgentX acks per topic only: we name the consumer) and covers
# every entry up to its cursor; our event is (type, payload) rather than one opaque object.


def test_agentx_append_and_read(events: EventLog) -> None:
    c1 = events.append("session-123", "text_delta", {"text": "Hello"})
    c2 = events.append("session-123", "text_delta", {"text": "World"})
    assert c1 and c2 and c1 != c2
    entries = events.read("session-123")
    assert [(e.type, e.payload) for e in entries] == [
        ("text_delta", {"text": "Hello"}),
        ("text_delta", {"text": "World"}),
    ]
    assert all(e.topic == "session-123" and isinstance(e.created_at, int) for e in entries)


def test_agentx_read_after_cursor(events: EventLog) -> None:
    c1 = events.append("session-456", "seq", {"seq": 1})
    c2 = events.append("session-456", "seq", {"seq": 2})
    events.append("session-456", "seq", {"seq": 3})
    assert [e.payload["seq"] for e in events.read("session-456", c1)] == [2, 3]
    assert [e.payload["seq"] for e in events.read("session-456", c2)] == [3]


def test_agentx_acknowledge_entries(events: EventLog) -> None:
    cursor = events.append("session-789", "data", {"data": "test"})
    before = read_with_acks(events, "session-789", "client-1")
    assert [(a.acknowledged, a.acknowledged_at) for a in before] == [(False, None)]
    events.ack("client-1", "session-789", cursor)
    after = read_with_acks(events, "session-789", "client-1")
    assert after[0].acknowledged is True and isinstance(after[0].acknowledged_at, int)
    # Per consumer: another client has not acknowledged it.
    assert read_with_acks(events, "session-789", "client-2")[0].acknowledged is False


def test_agentx_subscribe_receives_new_events_synchronously(events: EventLog) -> None:
    received: list[str] = []
    unsubscribe = events.subscribe("session-sub", lambda e: received.append(e.payload["msg"]))
    try:
        events.append("session-sub", "m", {"msg": "first"})
        events.append("session-sub", "m", {"msg": "second"})
        assert received == ["first", "second"]  # already there when append returned: no waiting
    finally:
        unsubscribe()
    events.append("session-sub", "m", {"msg": "third"})
    time.sleep(0.3)  # a background follower that missed the unsubscribe would deliver within this
    assert received == ["first", "second"]


def test_agentx_latest_cursor_per_topic(events: EventLog) -> None:
    assert events.latest_cursor("session-cursor") is None
    events.append("session-cursor", "seq", {"seq": 1})
    c2 = events.append("session-cursor", "seq", {"seq": 2})
    events.append("another-topic", "seq", {"seq": 3})
    assert events.latest_cursor("session-cursor") == c2
    assert events.latest_cursor(None) == events.last_cursor()


def test_agentx_topics_are_isolated(events: EventLog) -> None:
    events.append("topic-a", "from", {"from": "a"})
    events.append("topic-b", "from", {"from": "b"})
    assert [e.payload["from"] for e in events.read("topic-a")] == ["a"]
    assert [e.payload["from"] for e in events.read("topic-b")] == ["b"]


def test_agentx_cleanup_removes_old_acknowledged_entries(events: EventLog) -> None:
    cursor = events.append("session-cleanup", "data", {"data": "old"})
    events.ack("client-1", "session-cleanup", cursor)
    time.sleep(0.01)
    assert events.cleanup(ttl_ms=1, max_per_topic=1000) == 1
    assert events.read("session-cleanup") == []
