"""Response claims keep each chat in order: one response per chat at a time, an expired lease taken again
before anything after it, a response waiting to retry holding up only its own chat, and a failed response
never claimed again. On SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue.core import Queue
from shared.storage.schema import open_database

pytestmark = pytest.mark.integration


def _queue_replies(queue: Queue, chat: str, n: int) -> list[int]:
    return [
        queue.responses.enqueue_response(
            ChatAddress("telegram", "ann", conversation=chat), f"{chat} reply {i}"
        ).id
        for i in range(n)
    ]


def _expire(queue: Queue, response_id: int) -> None:
    # The deliverer holding it died: its lease is in the past.
    with queue.db.transaction() as tx:
        tx.execute(
            "UPDATE responses SET lease_until = :t WHERE id = :id", {"t": now_ms() - 1, "id": response_id}
        )


def _row(queue: Queue, response_id: int) -> dict[str, object]:
    rows = queue.db.read(
        "SELECT status, claimed_by, delivered, last_error FROM responses WHERE id = :id", {"id": response_id}
    )
    return dict(rows[0])


def test_claims_keep_chat_order_with_an_expired_and_a_live_claimer(queue: Queue) -> None:
    a = _queue_replies(queue, "chat-a", 3)
    b = _queue_replies(queue, "chat-b", 2)
    first = queue.responses.claim_responses_for_channel("telegram", "d1", limit=10, lease_ms=60_000)
    assert sorted(r.id for r in first) == [a[0], b[0]]  # only the head of each chat
    assert queue.responses.mark_chunk_delivered(a[0], "d1", 0)
    # d1 dies while delivering chat-a's head; it still delivers chat-b's head (live lease).
    _expire(queue, a[0])
    second = queue.responses.claim_responses_for_channel("telegram", "d2", limit=10, lease_ms=60_000)
    assert [r.id for r in second] == [a[0]]  # the expired head again, not a later reply
    assert second[0].delivered == 1  # resumes after the chunk recorded
    assert _row(queue, b[0])["claimed_by"] == "d1" and _row(queue, b[0])["status"] == "delivering"
    assert not queue.responses.mark_chunk_delivered(a[0], "d1", 1)  # the dead deliverer is fenced out
    # Nothing more while both heads are being delivered: later replies never overtake them.
    assert queue.responses.claim_responses_for_channel("telegram", "d1", limit=10) == []
    assert queue.responses.claim_responses_for_channel("telegram", "d2", limit=10) == []
    assert queue.responses.ack_response(a[0], "d2")
    assert [r.id for r in queue.responses.claim_responses_for_channel("telegram", "d1", limit=10)] == [a[1]]
    assert queue.responses.ack_response(b[0], "d1")
    assert [r.id for r in queue.responses.claim_responses_for_channel("telegram", "d2", limit=10)] == [b[1]]


def test_a_reply_waiting_to_retry_holds_up_only_its_own_chat(queue: Queue) -> None:
    a = _queue_replies(queue, "chat-a", 2)
    b = _queue_replies(queue, "chat-b", 1)
    claimed = queue.responses.claim_responses_for_channel("telegram", "d1", limit=10)
    assert sorted(r.id for r in claimed) == [a[0], b[0]]
    outcome = queue.responses.retry_response_later(a[0], "d1", "HTTP 502", base_ms=60_000, max_ms=60_000)
    assert outcome is not None and outcome.attempts == 1 and not outcome.failed
    assert outcome.due > now_ms() + 30_000
    assert _row(queue, a[0])["status"] == "pending" and _row(queue, a[0])["last_error"] == "HTTP 502"
    assert queue.responses.ack_response(b[0], "d1")
    # chat-a's retry is not due and its next reply must not overtake it; chat-b is free.
    more = _queue_replies(queue, "chat-b", 1)
    assert [r.id for r in queue.responses.claim_responses_for_channel("telegram", "d2", limit=10)] == more
    _expire(queue, a[0])  # the retry is due
    assert [r.id for r in queue.responses.claim_responses_for_channel("telegram", "d2", limit=10)] == [a[0]]


def test_failed_responses_are_never_claimed_again(queue: Queue) -> None:
    a = _queue_replies(queue, "chat-a", 2)
    [head] = queue.responses.claim_responses_for_channel("telegram", "d1", limit=10, lease_ms=1)
    assert head.id == a[0]
    assert queue.responses.fail_response(
        a[0], "Forbidden: bot was blocked by the user", worker="d1", explanation="blocked"
    )
    row = _row(queue, a[0])
    assert row["status"] == "failed" and row["last_error"] == "Forbidden: bot was blocked by the user"
    assert not queue.responses.ack_response(a[0], "d1") and not queue.responses.ack_response(
        a[0]
    )  # never "delivered"
    assert _row(queue, a[0])["status"] == "failed"
    # The failed reply does not block its chat, and is not claimed again even with its lease long gone.
    [nxt] = queue.responses.claim_responses_for_channel("telegram", "d2", limit=10)
    assert nxt.id == a[1]
    assert queue.responses.ack_response(a[1], "d2")
    assert queue.responses.claim_responses_for_channel("telegram", "d3", limit=10) == []
    assert [f.id for f in queue.responses.failed_responses()] == [a[0]]
    notices = queue.responses.take_undelivered_notices(ChatAddress("telegram", conversation="chat-a"))
    assert [(n.response_id, n.explanation) for n in notices] == [(a[0], "blocked")]
    assert (
        queue.responses.take_undelivered_notices(ChatAddress("telegram", conversation="chat-a")) == []
    )  # told once


def test_transient_failures_run_out_into_failed(queue: Queue) -> None:
    [rid] = _queue_replies(queue, "chat-a", 1)
    for attempt in range(1, 3):
        [r] = queue.responses.claim_responses_for_channel("telegram", "d1", limit=10)
        outcome = queue.responses.retry_response_later(
            r.id, "d1", "HTTP 500", base_ms=0, max_ms=0, max_attempts=3, explanation="it kept failing"
        )
        assert outcome is not None and outcome.attempts == attempt and not outcome.failed
    [r] = queue.responses.claim_responses_for_channel("telegram", "d1", limit=10)
    outcome = queue.responses.retry_response_later(
        r.id, "d1", "HTTP 500", base_ms=0, max_ms=0, max_attempts=3
    )
    assert outcome is not None and outcome.failed
    row = _row(queue, rid)
    assert row["status"] == "failed" and "gave up after 3 attempts: HTTP 500" in str(row["last_error"])
    assert queue.responses.claim_responses_for_channel("telegram", "d1", limit=10) == []


def test_a_late_platform_failure_turns_a_delivered_reply_into_failed(queue: Queue) -> None:
    [rid] = _queue_replies(queue, "15551234", 1)
    [r] = queue.responses.claim_responses_for_channel("telegram", "d1")
    assert queue.responses.mark_chunk_delivered(r.id, "d1", 0, platform_id="wamid.X1")
    assert queue.responses.ack_response(r.id, "d1")
    assert queue.responses.response_for_platform_id("telegram", "wamid.X1") == rid
    assert queue.responses.fail_response(
        rid, "WhatsApp 131047: Re-engagement message", explanation="window closed"
    )
    assert _row(queue, rid)["status"] == "failed"
    assert not queue.responses.fail_response(rid, "again")  # once


@pytest.mark.postgres
def test_postgres_racing_claimers_take_only_each_chats_head(pg_url: str) -> None:
    """Four deliverers claim behind a barrier, round after round: together they never hold two responses
    of one chat, and each takes a chat's oldest unfinished response."""
    claimers = 4
    databases = [open_database(pg_url) for _ in range(claimers)]
    queues = [Queue(db) for db in databases]
    try:
        chats = {f"chat-{c}": _queue_replies(queues[0], f"chat-{c}", 4) for c in range(6)}
        order = {rid: (chat, i) for chat, ids in chats.items() for i, rid in enumerate(ids)}
        done: set[int] = set()
        for rnd in range(4):
            barrier = threading.Barrier(claimers)
            results: list[list[int]] = [[] for _ in range(claimers)]

            def claim(
                i: int, results: list[list[int]] = results, barrier: threading.Barrier = barrier
            ) -> None:
                barrier.wait(10)
                taken = queues[i].responses.claim_responses_for_channel("telegram", f"w{i}", limit=100)
                results[i] = [r.id for r in taken]

            threads = [threading.Thread(target=claim, args=(i,)) for i in range(claimers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(20)
            claimed = [rid for ids in results for rid in ids]
            assert len(claimed) == len(set(claimed)), f"round {rnd}: one response twice: {results}"
            per_chat = [order[rid][0] for rid in claimed]
            assert len(per_chat) == len(set(per_chat)) == len(chats), f"round {rnd}: {results}"
            for rid in claimed:
                chat, index = order[rid]
                assert all(earlier in done for earlier in chats[chat][:index]), (rnd, chat, index)
            for i, ids in enumerate(results):
                for rid in ids:
                    assert queues[i].responses.ack_response(rid, f"w{i}")
                    done.add(rid)
        assert done == set(order)
    finally:
        for db in databases:
            db.close()
