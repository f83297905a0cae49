"""PostgreSQL event cursors with writers that do not wait for each other: an event that commits after a
reader has moved on, but was appended first (the smaller id), must still reach that reader.

Two writers: A appends and stays open, B appends after A and commits at once. B must not wait for A (appends
are not serialised), B's event gets the larger id, and a reader may not move past A's id before A ends: it
sees nothing of B while A is open, and after A commits it reads A's event, then B's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from shared.chat.address import ChatAddress
from shared.events.entries import EventEntry
from shared.events.log import PendingEvent, SqlEventLog, append_events
from shared.queue.core import Directory, Queue
from shared.settings.model import QueueSettings
from shared.storage import schema
from shared.storage.db import Database, Tx
from shared.storage.dialect import EVENT_ORDINAL_BITS
from shared.storage.schema import open_database
from tests.web_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


@pytest.fixture
def dbs(pg_url: str) -> Iterator[list[Database]]:
    """Three connections' worth of the same database: writer A, writer B, the reader."""
    opened = [open_database(pg_url) for _ in range(3)]
    yield opened
    for db in opened:
        db.close()


def in_thread(work: Any) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_a_reader_never_skips_an_event_that_commits_later_with_a_smaller_id(dbs: list[Database]) -> None:
    db_a, db_b, db_r = dbs
    reader = SqlEventLog(db_r)
    subscribed: list[EventEntry] = []
    a_open = db_a.transaction()
    tx_a = a_open.__enter__()
    try:
        append_events(tx_a, [PendingEvent("slow", {"writer": "A"})])
        id_a = int(tx_a.scalar("SELECT id FROM events WHERE type = 'slow'"))
        b_cursor: list[str] = []
        writer_b = in_thread(
            lambda: b_cursor.append(SqlEventLog(db_b).append("queue", "fast", {"writer": "B"}))
        )
        wait_until(lambda: not writer_b.is_alive(), 10, "B's append to commit while A is still open")
        id_b = int(b_cursor[0])
        assert id_a < id_b, "A appended first, so its event must sort first"
        # B has committed, but a reader must not get past A's id while A may still commit.
        assert reader.read(None) == []
        assert int(reader.last_cursor()) < id_a
        assert reader.latest_cursor("queue") is None
        unsubscribe = reader.subscribe(None, subscribed.append)  # "from now on": must still get A and B
    except BaseException as exc:
        a_open.__exit__(type(exc), exc, exc.__traceback__)
        raise
    a_open.__exit__(None, None, None)  # A commits: its event has the smaller id
    try:
        entries = reader.read(None, "0")
        assert [(e.type, int(e.cursor)) for e in entries] == [("slow", id_a), ("fast", id_b)]
        wait_until(lambda: len(subscribed) >= 2, 10, "the subscription to deliver A's and B's events")
        assert [e.type for e in subscribed] == ["slow", "fast"]
    finally:
        unsubscribe()
        reader.close()


def test_queue_writers_do_not_wait_for_each_other_and_readers_keep_commit_safe_order(
    dbs: list[Database],
) -> None:
    db_a, db_b, db_r = dbs
    queue_a = Queue(db_a, QueueSettings(), Directory.single("alpha", "beta"))
    queue_b = Queue(db_b, QueueSettings(), Directory.single("alpha", "beta"))
    reader = SqlEventLog(db_r)
    appended = threading.Event()
    release = threading.Event()

    def hold(tx: Tx) -> None:
        # Inside A's enqueue, after its message_received event was appended: stay open until told.
        appended.set()
        assert release.wait(20)

    writer_a = in_thread(
        lambda: queue_a.intake.enqueue_message(ChatAddress("web", "ann"), "first", agent="alpha", also=hold)
    )
    try:
        wait_until(appended.is_set, 10, "A's enqueue to append its event")
        queue_b.intake.enqueue_message(
            ChatAddress("web", "bob"), "second", agent="beta"
        )  # returns: B does not wait for A
        seen = reader.read("queue")
        assert seen == [], f"a reader saw {[e.type for e in seen]} while an older writer was still open"
    finally:
        release.set()
        writer_a.join(10)
    assert not writer_a.is_alive()
    entries = reader.read("queue")

    assert [(e.type, e.payload["sender"]) for e in entries] == [
        ("message_received", "ann"),
        ("message_received", "bob"),
    ]
    reader.close()


def test_an_append_delivers_to_local_subscribers_only_once_older_writers_ended(dbs: list[Database]) -> None:
    """Seed 001: a subscriber in the appending process has the event when ``append`` returns. With A open,
    B's append cannot hand its event over without skipping A's, so it waits for A, then delivers both."""
    db_a, db_b, _ = dbs
    log_b = SqlEventLog(db_b)
    got: list[str] = []
    unsubscribe = log_b.subscribe(None, lambda e: got.append(e.type))
    a_open = db_a.transaction()
    tx_a = a_open.__enter__()
    try:
        append_events(tx_a, [PendingEvent("slow", {"writer": "A"})])
        writer_b = in_thread(lambda: log_b.append("queue", "fast", {"writer": "B"}))
        writer_b.join(0.3)
        assert writer_b.is_alive(), "B's append returned while an older writer could still commit"
        assert got == []
    finally:
        a_open.__exit__(None, None, None)
    writer_b.join(10)
    assert not writer_b.is_alive()
    assert got == ["slow", "fast"]
    unsubscribe()
    log_b.close()


def test_an_older_database_is_widened_and_new_ids_start_above_every_old_one(pg_url: str) -> None:
    """Databases of the advisory-lock era have ``integer`` ids counted from 1 (or copied from SQLite); the
    schema upgrade widens the column and moves the next transaction's ids above the highest old id."""
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("ALTER TABLE events ALTER COLUMN id TYPE integer")
        admin.execute(
            "INSERT INTO events (id, topic, type, payload, created_at) VALUES (2147483000, 'queue', 'old', '{}', 1)"
        )
        # Cleanup once removed ids up to here: just above what this server's next transactions would take.
        xid = int(admin.execute("SELECT CAST(CAST(pg_current_xact_id() AS text) AS bigint)").fetchone()[0])
        removed = (xid + 40) << EVENT_ORDINAL_BITS
    db = open_database(pg_url)
    try:
        kind = db.read_scalar(
            "SELECT data_type FROM information_schema.columns WHERE table_name = 'events' AND column_name = 'id'"
        )
        assert kind == "bigint"
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(
                "INSERT INTO kv (scope, key, value, updated_at) VALUES ('events.pruned', '*', %s, 1)",
                (str(removed),),
            )
        schema.create_schema(db)
        log = SqlEventLog(db)
        new = int(log.append("queue", "new", {}))
        assert new > removed > 2147483000
        assert [e.type for e in log.read(None, str(removed))] == ["new"]
        log.close()
    finally:
        db.close()


def test_a_transaction_in_another_database_does_not_hold_readers_back(
    dbs: list[Database], pg_url: str
) -> None:
    """Transaction ids are server-wide: a long write transaction of another database on the same server (another
    application's batch job) cannot write these events, and must not keep readers from them."""
    _, db_b, db_r = dbs
    info = psycopg.conninfo.conninfo_to_dict(pg_url)
    info["dbname"] = "postgres"
    with psycopg.connect(psycopg.conninfo.make_conninfo(**info)) as elsewhere:
        elsewhere.execute("SELECT pg_current_xact_id()")  # holds a transaction id, open until the block ends
        log_b, reader = SqlEventLog(db_b), SqlEventLog(db_r)
        first = log_b.append("queue", "first", {})
        second = log_b.append("queue", "second", {})
        wait_until(lambda: reader.read(None), 10, "the events of this database to be readable")
        assert [(e.type, e.cursor) for e in reader.read(None)] == [("first", first), ("second", second)]
        assert reader.last_cursor() == second
        elsewhere.rollback()
    log_b.close()
    reader.close()
