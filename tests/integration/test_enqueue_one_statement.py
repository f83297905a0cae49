"""The plain enqueue on PostgreSQL is one statement (message row, its events under the commit-order lock, the
wake-ups): the same rows and events as the transaction path, duplicates still found, waiters still woken."""

from __future__ import annotations

import json
import threading

import pytest

from shared.chat.address import ChatAddress
from shared.queue.core import Directory, Queue
from shared.storage.db import Database
from shared.storage.schema import open_database

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def _queue(db: Database) -> Queue:
    return Queue(db, directory=Directory.single("alpha", "beta"))


def test_one_statement_writes_what_the_transaction_path_writes(pg_url: str) -> None:
    db = open_database(pg_url)
    queue = _queue(db)
    woken: list[set[str]] = []
    db.on_commit(woken.append)
    plain = queue.intake.enqueue_message(
        ChatAddress("api", "ann", conversation="c1"), "hello", agent="beta", external_id="x1"
    )
    assert not plain.duplicate and plain.id is not None
    assert woken and {"messages", "events"} <= woken[-1]
    debounced = queue.intake.enqueue_message(
        ChatAddress("api", "ann", conversation="c1"), "hi again", debounce_ms=10
    )  # transaction
    rows = db.read("SELECT type, message_id, payload FROM events ORDER BY id")
    kinds = [(r["type"], r["message_id"]) for r in rows]
    assert kinds == [
        ("message_received", plain.message_id),
        ("message_received", debounced.message_id),
    ]
    assert json.loads(str(rows[0]["payload"])) == {
        "channel": "api",
        "sender": "ann",
        "agent": "beta",
        "named": True,
    }
    again = queue.intake.enqueue_message(
        ChatAddress("api", "ann", conversation="c1"), "hello", agent="beta", external_id="x1"
    )
    assert again.duplicate and again.message_id == plain.message_id and again.id == plain.id
    assert db.read_scalar("SELECT COUNT(*) FROM events") == 2  # a duplicate writes nothing
    db.close()


def test_concurrent_enqueues_each_get_their_events(pg_url: str) -> None:
    db = open_database(pg_url)
    queue = _queue(db)

    def produce(k: int) -> None:
        for i in range(25):
            queue.intake.enqueue_message(ChatAddress("api", f"u{k}"), f"m{k}-{i}", agent="alpha")

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    messages = db.read("SELECT message_id FROM messages")
    events = db.read("SELECT message_id, type FROM events WHERE type = 'message_received'")
    assert len(messages) == 100
    assert sorted(r["message_id"] for r in events) == sorted(r["message_id"] for r in messages)
    db.close()
