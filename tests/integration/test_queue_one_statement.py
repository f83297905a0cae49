"""The claim (after its probe), the plain completion and the lease release are one statement each on
PostgreSQL: the same rows, lease, events and wake-ups as the transaction path, and the same fence (all of a
group or nothing)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from shared.chat.address import ChatAddress
from shared.events.log import SqlEventLog
from shared.queue.core import Directory, LeaseLost, Queue, ResponseDraft
from shared.queue.records import QueuedMessage
from shared.settings.model import QueueSettings
from shared.storage.schema import open_database

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


@pytest.fixture
def pg_queue(pg_url: str) -> Iterator[Queue]:
    """The queue on PostgreSQL only (the one-statement paths exist there)."""
    db = open_database(pg_url)
    yield Queue(db, QueueSettings(lease_seconds=30), Directory.single("alpha", "beta", "gamma"))
    db.close()


def _enqueue(queue: Queue, agent: str, text: str, conversation: str = "c1") -> str:
    return queue.intake.enqueue_message(
        ChatAddress("api", "ann", sender_id="u1", conversation=conversation), text, agent=agent
    ).message_id


def _events(queue: Queue) -> list[tuple[str, str | None, dict[str, object]]]:
    return [(e.type, e.message_id, e.payload) for e in SqlEventLog(queue.db).read(None, None, 1000)]


def _lease(queue: Queue, agent: str) -> tuple[object, ...] | None:
    rows = queue.db.read("SELECT holder, lease_until FROM agent_leases WHERE agent = :a", {"a": agent})
    return (rows[0]["holder"], rows[0]["lease_until"]) if rows else None


def _ids(group: list[QueuedMessage]) -> list[str]:
    return [m.message_id for m in group]


def _complete_by_transaction(queue: Queue, ids: list[str], worker: str, draft: ResponseDraft) -> int | None:
    """The same completion through the transaction path (``also`` keeps it there)."""
    return queue.messages.complete_messages(ids, worker, draft, also=lambda tx: None).response_id


def test_one_statement_claim_takes_the_agent_and_writes_its_event(pg_queue: Queue) -> None:
    queue = pg_queue
    assert queue.db.dialect.single_statement_writes
    first = _enqueue(queue, "beta", "one")
    second = _enqueue(queue, "beta", "two")
    woken: list[set[str]] = []
    queue.db.on_commit(woken.append)
    group = queue.messages.claim_all_pending_messages("beta", "w1")
    assert _ids(group) == [first, second]
    assert all(m.status == "processing" and m.claimed_by == "w1" and m.agent == "beta" for m in group)
    assert group[0].message == "one" and group[0].address == ChatAddress("api", "ann", "u1", "c1")
    held = queue.db.read("SELECT message_id, status, claimed_by FROM messages ORDER BY id")
    assert [(r["message_id"], r["status"], r["claimed_by"]) for r in held] == [
        (first, "processing", "w1"),
        (second, "processing", "w1"),
    ]
    assert _lease(queue, "beta") == ("w1", group[0].lease_until)
    claimed = [e for e in _events(queue) if e[0] == "message_claimed"]
    assert claimed == [
        ("message_claimed", first, {"agent": "beta", "worker": "w1", "message_ids": [first, second]})
    ]
    assert woken == [{"events"}]


def test_one_statement_claim_of_a_held_or_empty_agent_changes_nothing(pg_queue: Queue) -> None:
    queue = pg_queue
    assert queue.messages.claim_all_pending_messages("beta", "w1") == []  # nothing waits
    assert _lease(queue, "beta") is None  # a claim of nothing takes no lease
    _enqueue(queue, "beta", "one")
    assert len(queue.messages.claim_all_pending_messages("beta", "w1")) == 1
    _enqueue(queue, "beta", "two")
    before = (_lease(queue, "beta"), len(_events(queue)))
    assert queue.messages.claim_all_pending_messages("beta", "w2") == []  # held by w1
    assert (_lease(queue, "beta"), len(_events(queue))) == before
    assert queue.db.read_scalar("SELECT COUNT(*) FROM messages WHERE status = 'pending'") == 1


def test_one_statement_completion_writes_what_the_transaction_path_writes(pg_queue: Queue) -> None:
    queue = pg_queue
    draft = ResponseDraft(message="done", files=("/tmp/a.txt",), metadata={"k": 1}, sender="bot")
    results = []
    for path in ("statement", "transaction"):
        ids = [_enqueue(queue, "beta", f"{path} 1"), _enqueue(queue, "beta", f"{path} 2")]
        assert _ids(queue.messages.claim_all_pending_messages("beta", "w1")) == ids
        if path == "statement":
            response_id = queue.messages.complete_messages(ids, "w1", draft).response_id
        else:
            response_id = _complete_by_transaction(queue, ids, "w1", draft)
        row = queue.db.read("SELECT * FROM responses WHERE id = :id", {"id": response_id})[0]
        event = [e for e in _events(queue) if e[0] == "response_ready"][-1]
        statuses = queue.db.read(
            "SELECT status, lease_until FROM messages WHERE message_id IN (:a, :b)",
            {"a": ids[0], "b": ids[1]},
        )
        queue.leases.release_agent("beta", "w1")
        results.append((ids, row, event, statuses))
    (ids_s, row_s, event_s, st_s), (ids_t, row_t, event_t, st_t) = results
    skip = {"id", "message_id", "original_message", "created_at", "updated_at"}
    assert {k: v for k, v in row_s.items() if k not in skip} == {
        k: v for k, v in row_t.items() if k not in skip
    }
    assert row_s["message_id"] == ids_s[0] and row_s["original_message"] == "statement 1"
    assert row_s["sender"] == "bot" and row_s["sender_id"] == "u1" and row_s["status"] == "pending"
    assert json.loads(row_s["files"]) == ["/tmp/a.txt"] and json.loads(row_s["metadata"]) == {"k": 1}
    assert event_s == (
        "response_ready",
        ids_s[0],
        {"message_ids": ids_s, "response_id": row_s["id"], "agent": "beta", "channel": "api"},
    )
    assert event_t[2] == {"message_ids": ids_t, "response_id": row_t["id"], "agent": "beta", "channel": "api"}
    assert (
        [(r["status"], r["lease_until"]) for r in st_s]
        == [("completed", None)] * 2
        == [(r["status"], r["lease_until"]) for r in st_t]
    )


def test_one_statement_completion_releases_only_an_idle_agent(pg_queue: Queue) -> None:
    queue = pg_queue
    woken: list[set[str]] = []
    queue.db.on_commit(woken.append)
    first = _enqueue(queue, "beta", "one")
    queue.messages.claim_all_pending_messages("beta", "w1")
    _enqueue(queue, "beta", "two")  # waits: the agent is not idle
    outcome = queue.messages.complete_messages([first], "w1", "done", release_when_idle=True)
    assert not outcome.released and _lease(queue, "beta") is not None
    assert _lease(queue, "beta")[0] == "w1"  # type: ignore[index]
    assert {"events", "responses"} <= woken[-1]
    second = queue.messages.claim_all_pending_messages("beta", "w1")
    assert queue.messages.complete_messages(_ids(second), "w1", "done", release_when_idle=True).released
    assert _lease(queue, "beta") == (None, 0)


def test_one_statement_completion_keeps_the_lease_while_another_group_is_held(pg_queue: Queue) -> None:
    queue = pg_queue
    first = _enqueue(queue, "beta", "one")
    queue.messages.claim_all_pending_messages("beta", "w1")
    second = _enqueue(queue, "beta", "two")
    queue.messages.claim_all_pending_messages("beta", "w1")  # a second group, still running
    assert not queue.messages.complete_messages([first], "w1", "done", release_when_idle=True).released
    assert queue.messages.complete_messages([second], "w1", "done", release_when_idle=True).released


def test_one_statement_completion_of_a_partly_lost_group_changes_nothing(pg_queue: Queue) -> None:
    queue = pg_queue
    ids = [_enqueue(queue, "beta", "one"), _enqueue(queue, "beta", "two")]
    queue.messages.claim_all_pending_messages("beta", "w1")
    with queue.db.transaction() as tx:  # the second was taken back and claimed by another worker
        tx.execute("UPDATE messages SET claimed_by = 'w2' WHERE message_id = :m", {"m": ids[1]})
    events = len(_events(queue))
    with pytest.raises(LeaseLost, match="no longer holds 1 of 2"):
        queue.messages.complete_messages(ids, "w1", "done", release_when_idle=True)
    rows = queue.db.read("SELECT status, claimed_by FROM messages ORDER BY id")
    assert [(r["status"], r["claimed_by"]) for r in rows] == [("processing", "w1"), ("processing", "w2")]
    assert queue.db.read_scalar("SELECT COUNT(*) FROM responses") == 0
    assert len(_events(queue)) == events and _lease(queue, "beta")[0] == "w1"  # type: ignore[index]
    with pytest.raises(LeaseLost):
        queue.messages.complete_messages([ids[1]], "w1", "done")


def test_one_statement_release_gives_up_only_the_workers_own_lease(pg_queue: Queue) -> None:
    queue = pg_queue
    _enqueue(queue, "beta", "one")
    queue.messages.claim_all_pending_messages("beta", "w1")
    queue.leases.release_agent("beta", "w2")
    assert _lease(queue, "beta")[0] == "w1"  # type: ignore[index]
    queue.leases.release_agent("beta", "w1")
    assert _lease(queue, "beta") == (None, 0)
