"""The named reads chat adapters make (shared.chat.lookups) and the pairing storage they use (shared.chat.pairings)."""

from __future__ import annotations

import pytest

from shared.chat import lookups, pairings
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue.core import Queue

pytestmark = pytest.mark.integration


def test_busy_agents_lists_processing_ones_first(queue: Queue) -> None:
    queue.intake.enqueue_message(
        ChatAddress("telegram", "ann", sender_id="1", conversation="c1"), "hi", agent="gamma"
    )
    queue.intake.enqueue_message(
        ChatAddress("telegram", "ann", sender_id="1", conversation="c1"), "hi", agent="beta"
    )
    queue.intake.enqueue_message(
        ChatAddress("telegram", "ann", sender_id="1", conversation="c1"), "hi", agent="alpha"
    )
    queue.intake.enqueue_message(
        ChatAddress("telegram", "bob", sender_id="2", conversation="c2"), "hi", agent="alpha"
    )
    assert queue.messages.claim_all_pending_messages("gamma", "w1")
    assert lookups.busy_agents(queue.db, ChatAddress("telegram", conversation="c1")) == [
        "gamma",
        "alpha",
        "beta",
    ]
    assert lookups.busy_agents(queue.db, ChatAddress("telegram", conversation="c3")) == []
    assert lookups.busy_agents(queue.db, ChatAddress("discord", conversation="c1")) == []


def test_busy_conversations_leave_out_paused_agents_and_far_retries(queue: Queue) -> None:
    now = now_ms()
    queue.intake.enqueue_message(
        ChatAddress("telegram", "ann", sender_id="1", conversation="soon"), "hi", agent="alpha"
    )
    queue.intake.enqueue_message(
        ChatAddress("telegram", "bob", sender_id="2", conversation="later"),
        "hi",
        agent="alpha",
        available_at=now + 600_000,
    )
    queue.intake.enqueue_message(
        ChatAddress("telegram", "cy", sender_id="3", conversation="paused"), "hi", agent="beta"
    )
    queue.control.pause_agent("beta", now + 600_000, "rate limited")
    assert lookups.busy_conversations(queue.db, "telegram", now, 60_000) == ["soon"]
    assert sorted(lookups.busy_conversations(queue.db, "telegram", now, 1_200_000)) == ["later", "soon"]


def test_newest_waiting_external_id(queue: Queue) -> None:
    assert lookups.newest_waiting_external_id(queue.db, ChatAddress("whatsapp", conversation="49")) is None
    queue.intake.enqueue_message(
        ChatAddress("whatsapp", "ann", sender_id="49", conversation="49"), "one", external_id="w1"
    )
    queue.intake.enqueue_message(
        ChatAddress("whatsapp", "ann", sender_id="49", conversation="49"), "two", external_id="w2"
    )
    queue.intake.enqueue_message(ChatAddress("whatsapp", "ann", sender_id="49", conversation="49"), "three")
    assert lookups.newest_waiting_external_id(queue.db, ChatAddress("whatsapp", conversation="49")) == "w2"


def test_pairing_storage_issue_find_and_count(queue: Queue) -> None:
    db, now = queue.db, now_ms()
    with db.transaction() as tx:
        assert pairings.find(tx, "telegram", "1") is None
        pairings.issue_code(tx, "telegram", "1", "ann", "CODE1234", now - 10)
        pairings.issue_code(tx, "telegram", "2", "bob", "CODE5678", now)
    with db.transaction() as tx:
        found = pairings.find(tx, "telegram", "1")
        assert found is not None and (found.code, found.status, found.sender) == (
            "CODE1234",
            "pending",
            "ann",
        )
        assert pairings.pending_since(tx, "telegram", now - 10) == 2
        assert pairings.pending_since(tx, "telegram", now) == 1
        assert pairings.pending_since(tx, "discord", 0) == 0
    pairings.approve(db, "code1234")
    assert pairings.is_approved(db, "telegram", "1")
    assert pairings.revoke(db, "telegram", "1").status == "revoked"
    with db.transaction() as tx:
        pairings.issue_code(tx, "telegram", "1", "ann", "CODE9999", now)  # a revoked sender asks again
        again = pairings.find(tx, "telegram", "1")
    assert again is not None and (again.code, again.status, again.approved_at) == (
        "CODE9999",
        "pending",
        None,
    )
