"""Retention: every kind of finished history is pruned past its age, in batches, and nothing unfinished or
young goes; a large prune never holds up an enqueue. On a SQLite file and on PostgreSQL."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.cli.doctor import run_checks
from shared.clock import now_ms
from shared.events.entries import CursorExpired
from shared.events.log import SqlEventLog
from shared.queue.core import Directory, Queue, ResponseDraft
from shared.queue.retention import RetentionPolicy, prune_history
from shared.reads.table_sizes import table_sizes
from shared.settings.model import QueueSettings
from shared.storage.db import Database
from shared.storage.schema import open_database
from tests.scheduler_support import make_dead
from tests.web_support import make_home, runtime_for

pytestmark = pytest.mark.integration

DAY = 86_400_000
#: Every kind kept 10 days; the old rows below are 30 days old, the young ones an hour.
POLICY = RetentionPolicy(
    messages_ms=10 * DAY,
    replies_ms=10 * DAY,
    failed_replies_ms=10 * DAY,
    chat_room_ms=10 * DAY,
    agent_history_ms=10 * DAY,
    usage_ms=10 * DAY,
    batch=3,  # several batches per kind, even with a handful of rows
    pause_seconds=0,
)


def answered(queue: Queue, text: str, *, ack: bool = True, channel: str = "telegram") -> str:
    """A message enqueued, claimed, completed with a reply, and the reply delivered (``ack``)."""
    mid = queue.intake.enqueue_message(ChatAddress(channel, "ann", conversation=text), text).message_id
    claimed = queue.messages.claim_all_pending_messages("alpha", "w")
    assert [m.message_id for m in claimed] == [mid]
    queue.messages.complete_messages([mid], "w", ResponseDraft(message="answer to " + text))
    queue.leases.release_agent("alpha", "w")
    if ack:
        for r in queue.admin.list_responses(10, pending_only=True):
            if r.message_id == mid:
                queue.responses.ack_response(r.id)
    return mid


def age(db: Database, message_ids: list[str], ms: int) -> None:
    """Move every time of these messages and their replies ``ms`` into the past."""
    with db.transaction() as tx:
        for mid in message_ids:
            params = {"d": ms, "m": mid}
            tx.execute(
                "UPDATE messages SET created_at = created_at - :d, updated_at = updated_at - :d "
                "WHERE message_id = :m",
                params,
            )
            tx.execute(
                "UPDATE responses SET created_at = created_at - :d, updated_at = updated_at - :d, "
                "acked_at = acked_at - :d WHERE message_id = :m",
                params,
            )


def add_history(db: Database, at: int, tag: str) -> None:
    """One chat-room post, one agent turn and one cost record written at ``at``."""
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO chat_messages (team_id, from_agent, message, created_at) VALUES ('dev', 'beta', :t, :a)",
            {"t": tag, "a": at},
        )
        tx.execute(
            "INSERT INTO agent_messages (agent_id, role, content, created_at) VALUES ('alpha', 'user', :t, :a)",
            {"t": tag, "a": at},
        )
        tx.execute(
            "INSERT INTO run_usage (run_id, agent, created_at) VALUES (:t, 'alpha', :a)", {"t": tag, "a": at}
        )
        for status in ("allowed", "pending"):  # a settled question to a person, and one still waiting
            tx.execute(
                "INSERT INTO approvals (id, message_id, agent, tool, status, created_at, expires_at) "
                "VALUES (:i, :t, 'alpha', 'Bash', :s, :a, :a)",
                {"i": f"{tag} {status}", "t": tag, "s": status, "a": at},
            )


def texts(db: Database, sql: str) -> set[str]:
    return {str(r["t"]) for r in db.read(sql)}


def test_each_kind_loses_its_old_rows_and_keeps_young_and_unfinished_ones(queue: Queue) -> None:
    db = queue.db
    old = [answered(queue, f"old {i}") for i in range(7)]
    young = answered(queue, "young")
    undelivered = answered(queue, "old but its reply is undelivered", ack=False)
    waiting = queue.intake.enqueue_message(ChatAddress("cli", "bob"), "old and still waiting").message_id
    working = queue.intake.enqueue_message(ChatAddress("cli", "cy"), "old and being worked on", agent="beta")
    assert queue.messages.claim_all_pending_messages("beta", "w2")
    dead = make_dead(queue, 1, agent="gamma")
    age(db, [*old, undelivered, waiting, working.message_id, *dead], 30 * DAY)
    now = now_ms()
    for n in range(5):
        add_history(db, now - 30 * DAY + n, f"old {n}")
    add_history(db, now - 3_600_000, "young")

    pruned = prune_history(db, POLICY)

    assert pruned == {
        "messages": 8,  # the seven old answered ones and the one whose reply waits (it is completed)
        # The seven delivered replies, and the dead letter's notice: a CLI reply nobody read, which goes
        # after failed_replies_ms. The undelivered Telegram reply stays.
        "responses": 8,
        "chat_messages": 5,
        "agent_messages": 5,
        "run_usage": 5,
        "approvals": 5,  # the old settled ones: a question still waiting for its answer stays
    }
    kept = {
        str(r["message_id"]): str(r["status"]) for r in db.read("SELECT message_id, status FROM messages")
    }
    assert kept == {young: "completed", waiting: "pending", working.message_id: "processing", dead[0]: "dead"}
    replies = {str(r["t"]) for r in db.read("SELECT message_id AS t FROM responses")}
    assert replies == {young, undelivered}
    for table, column in (
        ("chat_messages", "message"),
        ("agent_messages", "content"),
        ("run_usage", "run_id"),
    ):
        assert texts(db, f"SELECT {column} AS t FROM {table}") == {"young"}, table
    waiting_questions = {f"old {n} pending" for n in range(5)}
    assert texts(db, "SELECT id AS t FROM approvals") == {
        "young allowed",
        "young pending",
        *waiting_questions,
    }
    assert prune_history(db, POLICY) == dict.fromkeys(pruned, 0)  # nothing more: idempotent


def test_the_event_log_is_cleaned_in_batches_and_readers_of_a_removed_stretch_are_told(db: Database) -> None:
    events = SqlEventLog(db)
    try:
        for n in range(10):
            events.append("queue", "message_received", {"n": n})
        first = events.read("queue", after=None, limit=1)[0].cursor
        with db.transaction() as tx:
            tx.execute("UPDATE events SET created_at = created_at - :d", {"d": 30 * DAY})
        events.append("queue", "message_received", {"n": "young"})

        assert events.cleanup(ttl_ms=10 * DAY, max_per_topic=100_000, batch=3, pause_seconds=0) == 10

        assert [e.payload["n"] for e in events.read("queue", after=None, limit=100)] == ["young"]
        with pytest.raises(CursorExpired):
            events.read("queue", after=first, limit=10)
    finally:
        events.close()


def fill_completed(db: Database, count: int, at: int) -> None:
    """``count`` completed messages finished at ``at``, inserted in bulk."""
    rows = [
        {"m": f"old_{n:08d}", "t": f"old message {n}", "at": at, "c": f"chat-{n % 500}"} for n in range(count)
    ]
    with db.transaction() as tx:
        tx.executemany(
            "INSERT INTO messages (message_id, channel, sender, message, agent, status, created_at, updated_at, "
            "conversation) VALUES (:m, 'telegram', 'ann', :t, 'alpha', 'completed', :at, :at, :c)",
            rows,
        )


def test_pruning_50000_rows_never_holds_up_an_enqueue_for_a_second(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentpost.db'}"
    pruner_db, writer_db = open_database(url), open_database(url)
    try:
        fill_completed(pruner_db, 50_000, now_ms() - 30 * DAY)
        queue = Queue(writer_db, QueueSettings(debounce_ms=0), Directory.single("alpha"))
        result: dict[str, int] = {}
        policy = RetentionPolicy(messages_ms=10 * DAY)  # the defaults: 500 rows a batch, 20 ms apart
        took: list[float] = []

        def prune() -> None:
            t0 = time.monotonic()
            result.update(prune_history(pruner_db, policy))
            took.append(time.monotonic() - t0)

        pruner = threading.Thread(target=prune)
        waits: list[float] = []
        pruner.start()
        while pruner.is_alive() or len(waits) < 5:
            t0 = time.monotonic()
            queue.intake.enqueue_message(ChatAddress("cli", "ann"), f"hello {len(waits)}")
            waits.append(time.monotonic() - t0)
            time.sleep(0.005)  # a steady stream of messages, not a writer hogging the lock
        pruner.join()
        assert result["messages"] == 50_000
        assert len(waits) >= 20, "the enqueues never ran beside the prune"
        assert max(waits) < 1.0, f"an enqueue waited {max(waits):.2f} s"
        # Held up by one batch at most, not by the whole prune (as one big DELETE would hold it up).
        assert max(waits) < took[0] / 4, f"an enqueue waited {max(waits):.2f} s of a {took[0]:.2f} s prune"
        assert writer_db.read_scalar("SELECT COUNT(*) FROM messages") == len(waits)
    finally:
        pruner_db.close()
        writer_db.close()


def test_table_sizes_count_rows_and_on_postgresql_bytes(queue: Queue) -> None:
    answered(queue, "one")
    sizes = {s.table: s for s in table_sizes(queue.db)}
    assert (sizes["messages"].rows, sizes["responses"].rows, sizes["chat_messages"].rows) == (1, 1, 0)
    if queue.db.dialect.is_sqlite:
        assert all(s.bytes is None for s in sizes.values())
    else:
        assert all(s.bytes is not None and s.bytes > 0 for s in sizes.values())


def test_doctor_shows_each_tables_size(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    rt = runtime_for(home)
    try:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), "hello")
    finally:
        rt.close()
    [check] = [c for c in run_checks(home) if c.name == "table sizes"]
    assert check.level == "ok" and "messages 1 row;" in check.detail and "run_usage 0 rows" in check.detail


def test_a_topic_over_its_cap_loses_its_oldest_events_in_batches(db: Database) -> None:
    events = SqlEventLog(db)
    try:
        for n in range(20):
            events.append("agents", "agent_progress", {"n": n})
        first = events.read("agents", after=None, limit=1)[0].cursor

        assert events.cleanup(ttl_ms=10 * DAY, max_per_topic=5, batch=4, pause_seconds=0) == 15

        assert [e.payload["n"] for e in events.read("agents", after=None, limit=100)] == list(range(15, 20))
        with pytest.raises(CursorExpired):
            events.read("agents", after=first, limit=10)
    finally:
        events.close()
