"""Pauses and stop requests travel through the database, and trace explains each message's state."""

from __future__ import annotations

import pytest

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue.core import Queue
from shared.reads.trace import timeline_lines, trace_message

pytestmark = pytest.mark.integration


def test_a_paused_agent_is_not_claimed_until_resumed(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("cli", "s"), "x").message_id
    queue.control.pause_agent("alpha", now_ms() + 60_000, "rate limited (429)")
    queue.control.pause_agent("alpha", now_ms() + 1_000, "shorter pause never shortens")
    state = queue.control.agent_state("alpha")
    assert state["paused_until"] > now_ms() + 50_000 and "429" in state["note"]
    assert queue.messages.claim_all_pending_messages("alpha", "w") == []
    assert "paused" in trace_message(queue.db, mid).verdict
    queue.control.resume_agent("alpha")
    assert [m.message_id for m in queue.messages.claim_all_pending_messages("alpha", "w")] == [mid]


def test_stop_requests_reach_only_the_holder_once(queue: Queue) -> None:
    queue.intake.enqueue_message(ChatAddress("cli", "s", conversation="chat-1"), "x")
    queue.messages.claim_all_pending_messages("alpha", "w1")
    queue.control.request_stop("alpha", "cli:chat-1")
    assert queue.control.take_stop_request("alpha", "w2") == ""
    assert queue.control.take_stop_request("alpha", "w1") == "cli:chat-1"
    assert queue.control.take_stop_request("alpha", "w1") == ""
    assert queue.control.agent_state("gamma")["stop_requested"] == ""


def test_trace_explains_delivered_dead_and_waiting_messages(queue: Queue) -> None:
    delivered = queue.intake.enqueue_message(
        ChatAddress("telegram", "ann", conversation="c1"), "hello"
    ).message_id
    [m] = queue.messages.claim_all_pending_messages("alpha", "w")
    queue.messages.complete_messages([m.message_id], "w", "hi ann")
    queue.leases.release_agent("alpha", "w")
    [r] = queue.responses.claim_responses_for_channel("telegram", "d")
    queue.responses.mark_chunk_delivered(r.id, "d", 0)
    queue.responses.ack_response(r.id, "d")
    story = trace_message(queue.db, delivered)
    types = [e.type for e in story.events]
    assert types == [
        "message_received",
        "message_claimed",
        "response_ready",
        "chunk_delivered",
        "response_acked",
    ]
    assert story.verdict.startswith("delivered on telegram")
    assert any("chunk_delivered" in line for line in timeline_lines(story))

    dead = queue.intake.enqueue_message(
        ChatAddress("telegram", "ann", conversation="c2"), "doomed"
    ).message_id
    for _ in range(queue.config.max_retries):
        with queue.db.transaction() as tx:
            tx.execute("UPDATE messages SET available_at = 0 WHERE status = 'pending'")
        queue.messages.claim_all_pending_messages("alpha", "w")
        queue.failures.fail_messages([dead], "w", "exit 1: the CLI crashed")
    verdict = trace_message(queue.db, dead).verdict
    assert (
        "dead letter after 5 attempt(s)" in verdict and "the CLI crashed" in verdict and "was told" in verdict
    )

    waiting = queue.intake.enqueue_message(ChatAddress("cli", "s"), "later").message_id
    queue.messages.claim_all_pending_messages("alpha", "w")
    queue.failures.fail_messages([waiting], "w", "boom")
    assert "waiting to retry" in trace_message(queue.db, waiting).verdict
    assert trace_message(queue.db, "cli_zzzzzzzz").verdict.startswith("unknown")
