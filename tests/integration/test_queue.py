"""Every queue operation, on a SQLite file and on the PostgreSQL server."""

from __future__ import annotations

import pytest

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.log import SqlEventLog
from shared.queue.core import (
    AgentTurn,
    ChatPost,
    InvalidInput,
    LeaseLost,
    MessageDraft,
    NotFound,
    Queue,
    ResponseDraft,
    RetryBudgetExhausted,
    UnknownMention,
)

pytestmark = pytest.mark.integration


def _types(queue: Queue, message_id: str) -> list[str]:
    return [e.type for e in SqlEventLog(queue.db).read(None, None, 1000) if e.message_id == message_id]


def _make_available(queue: Queue) -> None:
    with queue.db.transaction() as tx:
        tx.execute("UPDATE messages SET available_at = 0 WHERE status = 'pending'")


def test_enqueue_routes_and_records_events(queue: Queue) -> None:
    plain = queue.intake.enqueue_message(ChatAddress("cli", "ann"), "hello there")
    mention = queue.intake.enqueue_message(ChatAddress("cli", "ann"), "@gamma please look")
    team = queue.intake.enqueue_message(ChatAddress("cli", "ann"), "@dev build it")
    # A mention of nobody is refused (the chat is told who there is), not sent to the default agent.
    with pytest.raises(UnknownMention):
        queue.intake.enqueue_message(ChatAddress("cli", "ann"), "@nobody hi")
    explicit = queue.intake.enqueue_message(ChatAddress("api", "ann"), "text", agent="gamma")
    assert [plain.agent, mention.agent, team.agent, explicit.agent] == ["alpha", "gamma", "beta", "gamma"]
    assert queue.db.read_scalar("SELECT COUNT(*) FROM messages WHERE message LIKE '@nobody%'") == 0
    assert plain.message_id.startswith("cli_") and len(plain.message_id) == 12
    stored = queue.admin.get_message(team.message_id)
    assert stored is not None and stored.message == "@dev build it" and stored.status == "pending"
    # One event per enqueue; a chosen agent (mention or agent=) is marked "named", a fallback is not.
    assert _types(queue, mention.message_id) == ["message_received"]
    assert _types(queue, plain.message_id) == ["message_received"]
    received = {e.message_id: e.payload for e in SqlEventLog(queue.db).read(None, None, 1000)}
    assert received[mention.message_id] == {
        "channel": "cli",
        "sender": "ann",
        "agent": "gamma",
        "named": True,
    }
    assert received[explicit.message_id]["named"] is True and received[team.message_id]["named"] is True
    assert "named" not in received[plain.message_id]


def test_enqueue_rejects_bad_input_and_changes_nothing(queue: Queue) -> None:
    for kwargs in (
        {"message": ""},
        {"message": "   \n"},
        {"message": "x", "agent": "Bad Name"},
        {"message": "x", "agent": "-dash"},
        {"message": "x", "agent": "a" * 33},
        {"message": "x", "agent": "unknown"},
        {"message": "x", "message_id": "not-an-id"},
        {"message": "x", "channel": "Bad Channel"},
    ):
        args = {"channel": "cli", "sender": "s", **kwargs}
        with pytest.raises(InvalidInput):
            chat = ChatAddress(args.pop("channel"), args.pop("sender"))
            queue.intake.enqueue_message(chat, args.pop("message"), **args)
    assert queue.admin.queue_status()["pending"] == 0
    assert SqlEventLog(queue.db).read(None) == []


def test_duplicate_message_id_and_external_id_are_reported_once(queue: Queue) -> None:
    first = queue.intake.enqueue_message(ChatAddress("cli", "s"), "one", message_id="cli_abcdefgh")
    again = queue.intake.enqueue_message(ChatAddress("cli", "s"), "@gamma two", message_id="cli_abcdefgh")
    assert not first.duplicate and again.duplicate
    assert again.agent == "alpha" and again.id == first.id
    ext1 = queue.intake.enqueue_message(ChatAddress("telegram", "s"), "hi", external_id="update-7")
    ext2 = queue.intake.enqueue_message(ChatAddress("telegram", "s"), "hi", external_id="update-7")
    assert ext2.duplicate and ext2.message_id == ext1.message_id
    assert queue.admin.queue_status()["pending"] == 2


def test_claim_takes_all_of_one_agent_in_order_under_its_lease(queue: Queue) -> None:
    ids = [
        queue.intake.enqueue_message(ChatAddress("cli", "s", conversation="c"), f"m{i}").message_id
        for i in range(3)
    ]
    other = queue.intake.enqueue_message(ChatAddress("cli", "s"), "@beta x").message_id
    claimed = queue.messages.claim_all_pending_messages("alpha", "w1")
    assert [m.message_id for m in claimed] == ids
    assert all(m.status == "processing" and m.claimed_by == "w1" and m.lease_until for m in claimed)
    assert queue.leases.agent_holder("alpha") == "w1"
    # Another worker can neither claim the agent's new messages nor take its lease.
    queue.intake.enqueue_message(ChatAddress("cli", "s"), "late")
    assert queue.messages.claim_all_pending_messages("alpha", "w2") == []
    assert [m.message_id for m in queue.messages.claim_all_pending_messages("beta", "w2")] == [other]
    assert queue.messages.claim_all_pending_messages("gamma", "w1") == []
    assert queue.leases.agent_holder("gamma") is None


def test_a_claimed_message_is_the_row_the_database_holds(queue: Queue) -> None:
    # The claim reads back only the columns it did not set itself and fills in the rest: what it hands
    # out must still equal the stored row, field for field (metadata decoded, every column present).
    sent = queue.intake.enqueue_message(
        ChatAddress("telegram", "Ann", sender_id="42", conversation="c9"),
        "hello",
        metadata={"origin": {"x": 1}},
    )
    (claimed,) = queue.messages.claim_all_pending_messages("alpha", "w1")
    stored = queue.admin.get_message(sent.message_id)
    assert stored is not None
    assert claimed == stored and claimed.as_dict() == stored.as_dict()
    assert claimed.metadata == {"origin": {"x": 1}} and claimed.address == stored.address
    # Completing it reads the first message's chat for the reply.
    queue.messages.complete_messages([claimed.message_id], "w1", "hi Ann")
    (reply,) = queue.admin.chat_responses(ChatAddress("telegram", conversation="c9"))
    assert (reply.message, reply.sender_id, reply.original_message) == ("hi Ann", "42", "hello")


def test_claim_respects_backoff_and_releases_when_empty(queue: Queue) -> None:
    queue.intake.enqueue_message(ChatAddress("cli", "s"), "later", available_at=now_ms() + 60_000)
    assert queue.messages.agents_with_pending() == []
    assert queue.messages.claim_all_pending_messages("alpha", "w1") == []
    assert queue.messages.next_available_at() is not None
    assert queue.leases.agent_holder("alpha") is None


def test_complete_enqueues_response_followups_posts_and_history_atomically(queue: Queue) -> None:
    a = queue.intake.enqueue_message(
        ChatAddress("telegram", "ann", sender_id="u1", conversation="chat-1"), "first"
    ).message_id
    b = queue.intake.enqueue_message(
        ChatAddress("telegram", "ann", sender_id="u1", conversation="chat-1"), "second"
    ).message_id
    claimed = queue.messages.claim_all_pending_messages("alpha", "w1")
    out = queue.messages.complete_messages(
        [m.message_id for m in claimed],
        "w1",
        ResponseDraft(message="answer", files=["/tmp/x.txt"], metadata={"k": 1}),
        followups=[
            MessageDraft(
                channel="internal",
                sender="alpha",
                message="help",
                agent="beta",
                prefix="internal",
                from_agent="alpha",
                hops=1,
            ),
            MessageDraft(
                channel="internal",
                sender="alpha",
                message="too deep",
                agent="gamma",
                prefix="internal",
                from_agent="alpha",
                hops=9,
            ),
        ],
        chat_posts=[ChatPost("dev", "alpha", "hello room")],
        history=[AgentTurn("alpha", "user", "first"), AgentTurn("alpha", "assistant", "answer")],
    )
    assert out.response_id is not None and len(out.followups) == 1 and out.refused_followups == 1
    assert queue.admin.get_message(a).status == "completed"  # type: ignore[union-attr]
    assert queue.admin.get_message(b).status == "completed"  # type: ignore[union-attr]
    [resp] = queue.admin.list_responses(pending_only=True)
    assert (resp.message, resp.channel, resp.conversation, resp.sender_id) == (
        "answer",
        "telegram",
        "chat-1",
        "u1",
    )
    assert resp.files == ["/tmp/x.txt"] and resp.metadata == {"k": 1} and resp.message_id == a
    handoff = queue.admin.get_message(out.followups[0])
    assert (
        handoff is not None
        and handoff.agent == "beta"
        and handoff.hops == 1
        and handoff.from_agent == "alpha"
    )
    assert queue.db.read_scalar("SELECT COUNT(*) FROM chat_messages") == 1
    assert queue.db.read_scalar("SELECT COUNT(*) FROM agent_messages") == 2
    types = _types(queue, a)
    assert "response_ready" in types and "chain_handoff" in types and "chain_handoff_refused" in types


def test_complete_is_fenced_by_the_claim(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("cli", "s"), "x").message_id
    queue.messages.claim_all_pending_messages("alpha", "w1")
    with pytest.raises(LeaseLost):
        queue.messages.complete_messages([mid], "w2", "stolen")
    recovered = queue.failures.recover_stale_messages(now=now_ms() + 60_000)
    assert recovered.retried == [mid]
    with pytest.raises(LeaseLost):
        queue.messages.complete_messages([mid], "w1", "too late")
    assert queue.admin.list_responses() == []
    with pytest.raises(InvalidInput):
        queue.messages.complete_messages([], "w1", "x")


def test_fail_backs_off_then_dies_with_one_notice(queue: Queue) -> None:
    ids = [
        queue.intake.enqueue_message(ChatAddress("cli", "s", conversation="c"), f"m{i}").message_id
        for i in range(2)
    ]
    before = now_ms()
    for attempt in range(1, 5):
        claimed = queue.messages.claim_all_pending_messages("alpha", "w1")
        assert [m.message_id for m in claimed] == ids
        out = queue.failures.fail_messages(ids, "w1", "exit 1: boom")
        assert out.retried == ids and out.dead == []
        msg = queue.admin.get_message(ids[0])
        assert msg is not None and msg.retry_count == attempt and msg.last_error == "exit 1: boom"
        # exponential with jitter in [50%, 100%] of base * 2^(n-1)
        delay = msg.available_at - msg.updated_at
        assert 500 * 2 ** (attempt - 1) <= delay <= 1000 * 2 ** (attempt - 1)
        assert queue.messages.claim_all_pending_messages("alpha", "w1") == []
        _make_available(queue)
    claimed = queue.messages.claim_all_pending_messages("alpha", "w1")
    out = queue.failures.fail_messages(ids, "w1", "exit 1: boom")
    assert out.dead == ids and out.retried == []
    assert {m.message_id for m in queue.admin.list_dead()} == set(ids)
    notices = queue.admin.list_responses(pending_only=True)
    assert len(notices) == 1 and notices[0].metadata["kind"] == "dead_notice"
    text = notices[0].message
    assert "boom" in text and "could not answer" in text and "after 5 tries" in text and ids[0] in text
    assert "/retry" in text and "dead letter" not in text
    # The dead letters keep the last error and the attempts made, stamped when they died.
    after = now_ms()
    for dead in queue.admin.list_dead():
        assert dead.last_error == "exit 1: boom" and dead.retry_count == 5
        assert before <= dead.updated_at <= after


def test_rate_limit_failure_does_not_count_an_attempt(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("cli", "s"), "x").message_id
    queue.messages.claim_all_pending_messages("alpha", "w1")
    out = queue.failures.fail_messages(
        [mid], "w1", "429 rate limited", count_attempt=False, retry_after_ms=5_000
    )
    msg = queue.admin.get_message(mid)
    assert msg is not None and msg.retry_count == 0 and msg.status == "pending"
    assert out.next_attempt_at is not None and msg.available_at >= now_ms() + 3_000


def test_renew_extends_leases_and_reports_lost_ones(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("cli", "s"), "x").message_id
    [m] = queue.messages.claim_all_pending_messages("alpha", "w1", lease_ms=1_000)
    assert queue.leases.renew_leases("w1", [mid], agent="alpha", lease_ms=120_000) == 1
    renewed = queue.admin.get_message(mid)
    assert renewed is not None and renewed.lease_until is not None and renewed.lease_until > m.lease_until  # type: ignore[operator]
    assert queue.failures.recover_stale_messages(now=now_ms() + 60_000).retried == []
    assert queue.leases.renew_leases("w2", [mid]) == 0


def test_recover_returns_merely_claimed_messages_uncharged(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("cli", "s"), "x").message_id
    for round_ in range(1, 4):
        assert queue.messages.claim_all_pending_messages("alpha", f"w{round_}", lease_ms=1)
        out = queue.failures.recover_stale_messages(now=now_ms() + 10)
        msg = queue.admin.get_message(mid)
        assert out.retried == [mid] and out.dead == []
        assert msg is not None and msg.status == "pending" and msg.claimed_by is None
        assert msg.retry_count == 0 and msg.interruptions == 0 and msg.last_error is None
        assert queue.leases.agent_holder("alpha") is None
        _make_available(queue)


def test_recover_charges_interrupted_runs_and_kills_at_their_limit(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("cli", "s", conversation="c"), "x").message_id
    limit = queue.config.max_interrupted_runs
    for attempt in range(1, limit + 1):
        assert queue.messages.claim_all_pending_messages("alpha", f"w{attempt}", lease_ms=1)
        queue.messages.mark_run_started([mid], f"w{attempt}")
        out = queue.failures.recover_stale_messages(now=now_ms() + 10)
        _make_available(queue)
        msg = queue.admin.get_message(mid)
        assert msg is not None and msg.interruptions == attempt and msg.retry_count == 0
        if attempt < limit:
            assert out.retried == [mid] and msg.status == "pending"
            assert (msg.last_error or "").startswith("interrupted")
            assert msg.run_started_at is None
        else:
            assert out.dead == [mid] and msg.status == "dead"
    [notice] = queue.admin.list_responses(pending_only=True)
    assert notice.metadata["kind"] == "dead_notice" and "/retry" in notice.message


def test_mark_run_started_is_fenced_by_the_claim(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("cli", "s"), "x").message_id
    queue.messages.claim_all_pending_messages("alpha", "w1")
    with pytest.raises(LeaseLost):
        queue.messages.mark_run_started([mid], "w2")
    msg = queue.admin.get_message(mid)
    assert msg is not None and msg.run_started_at is None


def test_permanent_failure_dies_at_once_with_a_plain_notice(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("telegram", "ann", conversation="42"), "x").message_id
    queue.messages.claim_all_pending_messages("alpha", "w1")
    out = queue.failures.fail_messages(
        [mid],
        "w1",
        "claude reported an error (api_error): 400 invalid_request_error",
        permanent=True,
        explanation="the AI service refused the request",
    )
    assert out.dead == [mid] and out.retried == []
    msg = queue.admin.get_message(mid)
    assert msg is not None and msg.status == "dead" and msg.retry_count == 1
    [notice] = queue.admin.list_responses(pending_only=True)
    assert "refused the request" in notice.message and mid in notice.message
    assert "api_error" not in notice.message and "invalid_request_error" not in notice.message


def test_a_counted_retry_tells_the_chat_once_per_attempt_with_one_edit_key(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("telegram", "ann", conversation="42"), "x").message_id
    for _attempt in (1, 2):
        queue.messages.claim_all_pending_messages("alpha", "w1")
        queue.failures.fail_messages(
            [mid], "w1", "HTTP 500", explanation="the AI service had an error", tell_retry=True
        )
        _make_available(queue)
    notes = queue.admin.list_responses(pending_only=True)
    assert [n.metadata["kind"] for n in notes] == ["progress", "progress"]
    assert {n.metadata["edit_key"] for n in notes} == {f"retry_{mid}"}
    assert "attempt 2 of 5" in notes[0].message and "attempt 3 of 5" in notes[1].message
    assert "trying again in" in notes[0].message


def test_response_delivery_claims_chunks_and_acks(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("discord", "s", conversation="chan"), "x").message_id
    queue.messages.claim_all_pending_messages("alpha", "w1")
    rid = queue.messages.complete_messages([mid], "w1", "reply").response_id
    assert queue.responses.claim_responses_for_channel("telegram", "d1") == []
    [r] = queue.responses.claim_responses_for_channel("discord", "d1", lease_ms=1)
    assert r.id == rid and r.status == "delivering" and r.delivered == 0
    assert queue.responses.mark_chunk_delivered(r.id, "d1", 0, lease_ms=1)
    assert not queue.responses.mark_chunk_delivered(r.id, "d1", 0, lease_ms=1)  # recorded once
    # The deliverer dies; after its lease expires another one resumes at the next chunk.
    import time

    deadline = time.monotonic() + 5
    taken = []
    while not taken and time.monotonic() < deadline:
        taken = queue.responses.claim_responses_for_channel("discord", "d2")
    assert [t.delivered for t in taken] == [1]
    assert not queue.responses.mark_chunk_delivered(r.id, "d1", 1)
    assert queue.responses.mark_chunk_delivered(r.id, "d2", 1)
    assert not queue.responses.ack_response(r.id, "d1")
    assert queue.responses.ack_response(r.id, "d2")
    assert queue.responses.ack_response(r.id)  # idempotent without a worker
    assert queue.responses.claim_responses_for_channel("discord", "d2") == []
    with pytest.raises(NotFound):
        queue.responses.ack_response(999_999)
    assert "response_acked" in _types(queue, mid) and "chunk_delivered" in _types(queue, mid)


def test_two_deliverers_never_get_the_same_response(queue: Queue) -> None:
    for i in range(6):
        queue.responses.enqueue_response(ChatAddress("web", "s"), f"r{i}")
    first = queue.responses.claim_responses_for_channel("web", "d1", limit=4)
    second = queue.responses.claim_responses_for_channel("web", "d2", limit=4)
    assert len(first) == 4 and len(second) == 2
    assert not {r.id for r in first} & {r.id for r in second}


def test_dead_letters_list_retry_budget_and_delete(queue: Queue) -> None:
    mid = queue.intake.enqueue_message(ChatAddress("cli", "s"), "x").message_id
    for _ in range(queue.config.max_retries):
        _make_available(queue)
        queue.messages.claim_all_pending_messages("alpha", "w")
        queue.failures.fail_messages([mid], "w", "err")
    [dead] = queue.admin.list_dead()
    for n in range(1, queue.config.manual_retry_budget + 1):
        again = queue.admin.retry_dead(dead.id if n % 2 else dead.message_id)
        assert again.status == "pending" and again.retry_count == 0 and again.manual_retries == n
        queue.messages.claim_all_pending_messages("alpha", "w")
        with queue.db.transaction() as tx:
            tx.execute("UPDATE messages SET status = 'dead' WHERE message_id = :m", {"m": mid})
    with pytest.raises(RetryBudgetExhausted):
        queue.admin.retry_dead(mid)
    with pytest.raises(NotFound):
        queue.admin.retry_dead(424242)
    with pytest.raises(NotFound):
        queue.admin.delete_dead("cli_zzzzzzzz")
    with pytest.raises(InvalidInput):
        queue.admin.delete_dead("../etc")
    assert queue.admin.delete_dead(mid).message_id == mid
    assert queue.admin.list_dead() == [] and queue.admin.get_message(mid) is None


def test_status_depths_processing_and_prune(queue: Queue) -> None:
    done = queue.intake.enqueue_message(ChatAddress("cli", "s"), "x").message_id
    queue.intake.enqueue_message(ChatAddress("cli", "s"), "@beta y")
    queue.messages.claim_all_pending_messages("alpha", "w")
    queue.messages.complete_messages([done], "w", "ok")
    queue.messages.claim_all_pending_messages("beta", "w")
    assert queue.admin.queue_status() == {
        "pending": 0,
        "processing": 1,
        "completed": 1,
        "dead": 0,
        "responses_pending": 0,
        "responses_delivering": 0,
        "cli_replies_unread": 1,  # a CLI reply waits to be read, it is not stuck in delivery
    }
    depths = {d["agent"]: (d["pending"], d["processing"]) for d in queue.admin.agent_queue_depths()}
    assert depths == {"alpha": (0, 0), "beta": (0, 1), "gamma": (0, 0)}
    assert [m.agent for m in queue.admin.list_processing()] == ["beta"]
    [r] = queue.responses.claim_responses_for_channel("cli", "d")
    queue.responses.ack_response(r.id)
    assert queue.admin.prune() == {"messages": 0, "responses": 0}  # younger than 24 h
    assert queue.admin.prune(completed_older_ms=-1, acked_older_ms=-1) == {"messages": 1, "responses": 1}
    assert queue.admin.queue_status()["processing"] == 1


def test_debounce_makes_a_burst_from_one_chat_wait_together(queue: Queue) -> None:
    before = now_ms()
    first = queue.intake.enqueue_message(
        ChatAddress("telegram", "s", conversation="c"), "one", debounce_ms=60_000
    ).message_id
    # A lone message in a quiet chat is available at once: no debounce wait for it.
    alone = queue.admin.get_message(first)
    assert alone is not None and before <= alone.available_at <= now_ms()
    other_chat = queue.intake.enqueue_message(
        ChatAddress("telegram", "s", conversation="d"), "else"
    ).message_id
    second = queue.intake.enqueue_message(
        ChatAddress("telegram", "s", conversation="c"), "two", debounce_ms=60_000
    ).message_id
    # A second message of the chat while the first still waits: the window opens, and both slide with it.
    m1, m2 = queue.admin.get_message(first), queue.admin.get_message(second)
    assert m1 is not None and m2 is not None and m1.available_at == m2.available_at > now_ms() + 50_000
    assert [m.message_id for m in queue.messages.claim_all_pending_messages("alpha", "w")] == [other_chat]
    third = queue.intake.enqueue_message(
        ChatAddress("telegram", "s", conversation="c"), "three", debounce_ms=90_000
    ).message_id
    m1, m3 = queue.admin.get_message(first), queue.admin.get_message(third)
    assert m1 is not None and m3 is not None and m1.available_at == m3.available_at > now_ms() + 80_000


def test_debounce_does_not_wait_when_the_chats_earlier_message_was_already_taken(queue: Queue) -> None:
    first = queue.intake.enqueue_message(
        ChatAddress("telegram", "s", conversation="c"), "one", debounce_ms=60_000
    ).message_id
    assert [m.message_id for m in queue.messages.claim_all_pending_messages("alpha", "w")] == [first]
    # The agent is busy with the first; the next message is the only one waiting, so it is not delayed
    # (the busy agent's lease holds it back until the run ends, and then it is claimed at once).
    second = queue.intake.enqueue_message(
        ChatAddress("telegram", "s", conversation="c"), "two", debounce_ms=60_000
    ).message_id
    m2 = queue.admin.get_message(second)
    assert m2 is not None and m2.available_at <= now_ms()
    # Another agent's waiting message in the same chat does not open the window either.
    third = queue.intake.enqueue_message(
        ChatAddress("telegram", "s", conversation="c"), "@beta three", debounce_ms=60_000
    ).message_id
    m3 = queue.admin.get_message(third)
    assert m3 is not None and m3.available_at <= now_ms()
    with pytest.raises(InvalidInput):
        queue.intake.enqueue_message(ChatAddress("telegram", "s"), "x", debounce_ms=-1)


def test_recover_takes_a_gone_local_holder_at_once_and_leaves_a_live_one_stalled(queue: Queue) -> None:
    import subprocess

    from shared.worker_identity import Holder, holder_state, new_worker_id

    child = subprocess.Popen(["sleep", "30"])
    gone = new_worker_id(child.pid)
    assert holder_state(gone) is Holder.ALIVE
    child.kill()
    child.wait()
    assert holder_state(gone) is Holder.GONE
    live = new_worker_id()
    assert holder_state(live) is Holder.ALIVE
    a = queue.intake.enqueue_message(ChatAddress("cli", "s"), "for alpha").message_id
    b = queue.intake.enqueue_message(ChatAddress("cli", "s"), "@beta for beta").message_id
    assert queue.messages.claim_all_pending_messages("alpha", gone, lease_ms=600_000)  # lease far from expiry
    assert queue.messages.claim_all_pending_messages("beta", live, lease_ms=1)  # lease lapses: a "stall"
    out = queue.failures.recover_stale_messages(now=now_ms() + 10)
    assert out.retried == [a]
    kept = queue.admin.get_message(b)
    assert kept is not None and kept.status == "processing" and kept.claimed_by == live
    assert queue.leases.agent_holder("alpha") is None  # the gone holder's agent lease is free at once
    # A live holder that has not renewed for longer than the stall ceiling is taken over after all.
    late = now_ms() + queue.config.stall_ceiling_ms + 10
    assert queue.failures.recover_stale_messages(now=late).retried == [b]


def test_a_random_id_that_meets_an_older_message_is_drawn_again(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 41 random bits meet a kept message's id now and then (1 in 2.8 million enqueues with a million kept);
    # that message must still be queued, not reported as "already queued" and dropped. Eight zero bytes
    # from the OS make the id "cli_aaaaaaaa", which an older message holds.
    import os

    older = queue.intake.enqueue_message(ChatAddress("cli", "s"), "older", message_id="cli_aaaaaaaa")
    real = os.urandom
    draws: list[int] = []

    def unlucky_then_real(n: int) -> bytes:
        draws.append(n)
        return bytes(n) if len(draws) == 1 else real(n)

    monkeypatch.setattr(os, "urandom", unlucky_then_real)
    newer = queue.intake.enqueue_message(ChatAddress("cli", "s"), "newer")
    assert not newer.duplicate and newer.message_id != older.message_id and len(draws) == 2
    assert queue.admin.get_message(newer.message_id) is not None
    # A platform id seen before is still a duplicate, whatever id was drawn for it.
    first = queue.intake.enqueue_message(ChatAddress("telegram", "s"), "hi", external_id="u1")
    draws.clear()
    again = queue.intake.enqueue_message(ChatAddress("telegram", "s"), "hi", external_id="u1")
    assert again.duplicate and again.message_id == first.message_id
