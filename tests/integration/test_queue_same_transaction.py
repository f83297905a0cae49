"""Work a caller adds to a queue operation's transaction (``also=``) and the release that rides along with
a completion (``release_when_idle``): each commits with the operation or not at all."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared.chat.address import ChatAddress
from shared.queue.core import LeaseLost, Queue
from shared.storage import kv
from shared.storage.db import Tx
from shared.storage.kv import Scope

pytestmark = pytest.mark.integration


def _put(key: str) -> Callable[[Tx], None]:
    def work(tx: Tx) -> None:
        kv.put(tx, Scope.AGENT_RUN, key, "x")

    return work


def test_a_completion_releases_the_agent_only_when_nothing_else_waits(queue: Queue) -> None:
    queue.intake.enqueue_message(ChatAddress("api", "ann"), "one", agent="alpha")
    (first,) = queue.messages.claim_all_pending_messages("alpha", "w1")
    queue.intake.enqueue_message(ChatAddress("api", "ann"), "two", agent="alpha")  # arrives during the run
    busy = queue.messages.complete_messages([first.message_id], "w1", "done", release_when_idle=True)
    assert not busy.released and queue.leases.agent_holder("alpha") == "w1"
    (second,) = queue.messages.claim_all_pending_messages("alpha", "w1")
    idle = queue.messages.complete_messages([second.message_id], "w1", "done", release_when_idle=True)
    assert idle.released and queue.leases.agent_holder("alpha") is None
    # Another worker can take the agent at once.
    queue.intake.enqueue_message(ChatAddress("api", "ann"), "three", agent="alpha")
    assert [m.message for m in queue.messages.claim_all_pending_messages("alpha", "w2")] == ["three"]


def test_work_added_to_a_transaction_commits_with_it_or_not_at_all(queue: Queue) -> None:
    queue.intake.enqueue_message(ChatAddress("api", "ann"), "one", agent="alpha", also=_put("enqueued"))
    (m,) = queue.messages.claim_all_pending_messages("alpha", "w1")
    queue.messages.mark_run_started([m.message_id], "w1", also=_put("started"))
    with pytest.raises(LeaseLost):
        queue.messages.complete_messages([m.message_id], "other", "x", also=_put("lost"))
    queue.messages.complete_messages([m.message_id], "w1", "done", also=_put("completed"))
    assert [e.key for e in kv.entries(queue.db, Scope.AGENT_RUN)] == ["completed", "enqueued", "started"]


def test_the_last_chunk_and_the_ack_are_one_write(queue: Queue) -> None:
    queue.intake.enqueue_message(ChatAddress("telegram", "ann", conversation="42"), "hi", agent="alpha")
    (m,) = queue.messages.claim_all_pending_messages("alpha", "w1")
    queue.messages.complete_messages([m.message_id], "w1", "the answer")
    (reply,) = queue.responses.claim_responses_for_channel("telegram", "d1")
    # A deliverer that lost the reply changes nothing, its own record included.
    assert not queue.responses.mark_chunk_delivered(reply.id, "someone-else", 0, ack=True, also=_put("lost"))
    assert queue.responses.mark_chunk_delivered(
        reply.id, "d1", 0, platform_id="777", ack=True, also=_put("sent")
    )
    status = queue.db.read("SELECT status, delivered FROM responses WHERE id = :i", {"i": reply.id})
    assert status == [{"status": "acked", "delivered": 1}]
    assert [e.key for e in kv.entries(queue.db, Scope.AGENT_RUN)] == ["sent"]
    kinds = [
        r["type"] for r in queue.db.read("SELECT type FROM events WHERE message_id = :m", {"m": m.message_id})
    ]
    assert kinds[-2:] == ["chunk_delivered", "response_acked"]
    assert queue.responses.claim_responses_for_channel("telegram", "d1") == []
