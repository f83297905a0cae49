"""No statement of the hot path scans a whole table: the tables keep every finished message, reply and event
for a day or more, so a scan makes each operation slower as they pile up (growth).

Every statement the queue runs for one message — enqueue, claim, run start, completion with the reply and the
agent's release, the reply's claim and its last chunk with the ack — is captured as SQLite ran it (with its
values) and its query plan checked.
"""

from __future__ import annotations

import sqlite3

import pytest

from shared.chat.address import ChatAddress
from shared.queue.core import Directory, Queue
from shared.storage.db import Database
from shared.storage.schema import open_database

pytestmark = pytest.mark.integration

#: Tables whose rows pile up; a plan may read them only through an index.
GROWING = ("messages", "responses", "events", "kv", "agent_messages")


def _statements(db: Database, path_of_one_message: object) -> list[str]:
    captured: list[str] = []
    conn: sqlite3.Connection = db.connection()
    conn.set_trace_callback(captured.append)
    try:
        path_of_one_message()  # type: ignore[operator]
    finally:
        conn.set_trace_callback(None)
    skip = ("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA")
    return [s for s in captured if not s.lstrip().upper().startswith(skip)]


def test_the_hot_path_reads_growing_tables_only_through_indexes(tmp_path: object) -> None:
    db = open_database(f"sqlite:///{tmp_path}/a.db")
    queue = Queue(db, directory=Directory.single("alpha", "beta"))

    def one_message() -> None:
        queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="42"), "hello", external_id="42:1"
        )
        (m,) = queue.messages.claim_all_pending_messages("alpha", "w1")
        queue.messages.mark_run_started([m.message_id], "w1")
        queue.messages.complete_messages([m.message_id], "w1", "the answer", release_when_idle=True)
        (r,) = queue.responses.claim_responses_for_channel("telegram", "d1")
        assert queue.responses.mark_chunk_delivered(r.id, "d1", 0, platform_id="9", ack=True)

    statements = _statements(db, one_message)
    assert len(statements) >= 10  # the capture works: the path ran its statements through this connection
    scans = []
    for sql in statements:
        plan = " | ".join(str(r["detail"]) for r in db.read("EXPLAIN QUERY PLAN " + sql))
        for table in GROWING:
            if f"SCAN {table}" in plan and "INDEX" not in plan.split(f"SCAN {table}", 1)[1].split("|", 1)[0]:
                scans.append(f"{sql}\n    -> {plan}")
    db.close()
    assert scans == [], "full scans on the hot path:\n" + "\n".join(scans)
