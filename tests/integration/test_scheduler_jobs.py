"""Each scheduler job called directly (run-until-idle), on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from scheduler.service import SchedulerService
from shared.chat import previews
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue import approvals
from shared.queue.core import ResponseDraft
from shared.runtime import Runtime, open_runtime
from shared.settings.model import SettingsError
from shared.storage.db import Tx
from tests.approval_support import ask_for_bash
from tests.scheduler_support import (
    T0,
    count,
    events_of,
    make_dead,
    wait_until,
    write_home,
)

pytestmark = pytest.mark.integration


def test_recover_job_returns_messages_of_a_dead_worker(scheduler_rt: Runtime) -> None:
    q = scheduler_rt.queue
    mid = q.intake.enqueue_message(ChatAddress("cli", "ann"), "hello").message_id
    claimed = q.messages.claim_all_pending_messages("assistant", "gone-worker", lease_ms=1)
    assert [m.message_id for m in claimed] == [mid]
    q.messages.mark_run_started([mid], "gone-worker")  # its run had started when the worker died
    wait_until(lambda: now_ms() > (q.admin.get_message(mid).lease_until or 0) + 1, what="the lease to expire")  # type: ignore[union-attr]
    service = SchedulerService(scheduler_rt)
    # An interrupted run is charged to the message (its own budget), not a retry meant for errors.
    assert service.recover() == {"retried": 1, "dead": 0, "approvals_timed_out": 0}
    back = q.admin.get_message(mid)
    assert back is not None and back.status == "pending" and back.interruptions == 1 and back.retry_count == 0
    assert service.recover() == {"retried": 0, "dead": 0, "approvals_timed_out": 0}  # nothing left to recover


def test_recover_job_closes_the_approval_requests_a_gone_processor_left_waiting(
    scheduler_rt: Runtime,
) -> None:
    """A processor killed while a request waited never ends it: a minute past its time the recover job does,
    and the chat's question says no answer came in time and the tool did not run."""
    chat = ChatAddress("telegram", "ann", sender_id="7", conversation="c1")
    rt = scheduler_rt
    left = ask_for_bash(rt, chat, "m-left", command="make deploy", agent="assistant")
    late = ask_for_bash(rt, chat, "m-late", command="make test", agent="assistant")
    fresh = ask_for_bash(rt, chat, "m-fresh", command="make lint", agent="assistant")
    now = now_ms()
    # Asked ten minutes ago: one 61 s past its time, one 30 s past (its processor may still be ending it).
    for approval, past in ((left, 61_000), (late, 30_000)):
        with rt.db.transaction() as tx:
            tx.execute(
                "UPDATE approvals SET expires_at = :t WHERE id = :id", {"t": now - past, "id": approval.id}
            )
    service = SchedulerService(rt)
    assert service.recover()["approvals_timed_out"] == 1
    status = {a.id: approvals.get(rt.db, a.id).status for a in (left, late, fresh)}  # type: ignore[union-attr]
    assert status == {left.id: "timed_out", late.id: "pending", fresh.id: "pending"}
    closed = rt.db.read(
        "SELECT message, metadata FROM responses WHERE message_id = 'm-left' ORDER BY id",
    )
    kinds = [json.loads(str(r["metadata"]))["kind"] for r in closed]
    assert kinds == ["approval", "approval_closed"]
    assert closed[-1]["message"].startswith("⌛ No answer within") and "not run: Bash: make deploy" in str(
        closed[-1]["message"]
    )
    assert service.recover()["approvals_timed_out"] == 0  # at most once


def test_prune_job_deletes_only_old_finished_rows(scheduler_rt: Runtime) -> None:
    q = scheduler_rt.queue
    old, fresh = (
        q.intake.enqueue_message(ChatAddress("cli", "ann"), t).message_id for t in ("old one", "fresh one")
    )
    claimed = q.messages.claim_all_pending_messages("assistant", "w")
    for m in claimed:
        q.messages.complete_messages([m.message_id], "w", ResponseDraft(message="done"))
    q.leases.release_agent("assistant", "w")
    for r in q.admin.list_responses(10, pending_only=True):
        q.responses.ack_response(r.id)
    make_dead(q, 1)
    pending = q.intake.enqueue_message(ChatAddress("cli", "ann"), "still waiting").message_id
    day = 86_400_000
    with scheduler_rt.db.transaction() as tx:  # age the first message and its reply past 24 h
        tx.execute(
            "UPDATE messages SET updated_at = updated_at - :d WHERE message_id = :m",
            {"d": day + 1000, "m": old},
        )
        tx.execute(
            "UPDATE responses SET acked_at = acked_at - :d WHERE message_id = :m", {"d": day + 1000, "m": old}
        )
        tx.execute("UPDATE messages SET updated_at = updated_at - :d WHERE status = 'dead'", {"d": 3 * day})
    pruned, unserved = SchedulerService(scheduler_rt).prune()
    kept = {"chat_messages": 0, "agent_messages": 0, "run_usage": 0, "approvals": 0}
    assert pruned == {"messages": 1, "responses": 1, **kept} and unserved == 0
    assert q.admin.get_message(old) is None
    assert q.admin.get_message(fresh).status == "completed"  # type: ignore[union-attr]
    assert q.admin.get_message(pending).status == "pending"  # type: ignore[union-attr]
    assert count(q, "dead") == 1


def test_previews_job_removes_the_text_of_runs_that_are_gone_and_keeps_a_live_ones(
    scheduler_rt: Runtime,
) -> None:
    q, db = scheduler_rt.queue, scheduler_rt.db
    dead = make_dead(q, 1)[0]  # its run crashed half-way, then it was dead-lettered: no run will finish it
    live = q.intake.enqueue_message(ChatAddress("cli", "ann"), "still running").message_id
    assert [m.message_id for m in q.messages.claim_all_pending_messages("assistant", "w")] == [live]
    chat = ChatAddress("telegram", conversation="42")

    def stream(tx: Tx) -> None:
        previews.put_partial(tx, chat, "run-dead", "The answer starts", [dead])
        previews.put_partial(tx, chat, "run-live", "Another answer starts", [live])
        previews.put_partial(tx, chat, "run-gone", "A pruned message's", ["m-pruned-long-ago"])
        # The chat shows the dead run's preview (not finished) and the gone one's (closed already).
        previews.put_shown(chat, "run-dead", {"id": "77", "text": "…", "message_ids": [dead], "done": False})(
            tx
        )
        previews.put_shown(chat, "run-gone", {"id": "78", "text": "…", "message_ids": [], "done": True})(tx)

    db.run_transaction(stream)
    service = SchedulerService(scheduler_rt)
    assert service.prune_previews() == 2
    assert [p.edit_key for p in previews.partials(db, "telegram")] == ["run-live"]
    # The chat's adapter is told to close the previews of both (if it shows them still).
    assert previews.left(db, "telegram") == [("42", "run-dead"), ("42", "run-gone")]
    assert service.prune_previews() == 0  # idempotent
    assert service.run_once().previews_removed == 0
    # A text not written for a day goes even while its messages are processing.
    assert previews.prune_partials(db, now=now_ms() + previews.PARTIAL_MAX_AGE_MS + 1000) == 1
    assert previews.partials(db, "telegram") == []
    assert previews.left(db, "telegram") == [("42", "run-dead"), ("42", "run-gone"), ("42", "run-live")]


def test_replies_on_unserved_channels_are_acked_and_recorded(scheduler_rt: Runtime) -> None:
    q = scheduler_rt.queue
    service = SchedulerService(scheduler_rt, start=T0)
    fired = service.fire_due(T0 + timedelta(seconds=1))
    assert fired == []  # no heartbeats configured
    hb = q.intake.enqueue_message(
        ChatAddress("heartbeat", "System"), "check in", agent="assistant"
    ).message_id
    tg = q.intake.enqueue_message(ChatAddress("telegram", "ann"), "hi", agent="assistant").message_id
    claimed = q.messages.claim_all_pending_messages("assistant", "w")
    for m in claimed:
        q.messages.complete_messages([m.message_id], "w", ResponseDraft(message=f"reply to {m.message_id}"))
    assert service.prune()[1] == 0  # younger than unserved_response_age_seconds
    with scheduler_rt.db.transaction() as tx:
        tx.execute("UPDATE responses SET created_at = created_at - 61000")
    assert service.prune()[1] == 1
    assert service.prune()[1] == 0
    by_message = {r.message_id: r.status for r in q.admin.list_responses(10)}
    assert by_message == {hb: "acked", tg: "pending"}
    recorded = events_of(scheduler_rt, "response_unserved")
    assert len(recorded) == 1 and recorded[0]["message_id"] == hb
    assert recorded[0]["payload"]["reply"] == f"reply to {hb}"  # type: ignore[index]


def test_event_cleanup_job_applies_the_ttl(scheduler_rt: Runtime) -> None:
    scheduler_rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), "one")
    scheduler_rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), "two")
    before = len(scheduler_rt.events.read(None, None, 1000))
    with scheduler_rt.db.transaction() as tx:
        tx.execute(
            "UPDATE events SET created_at = created_at - :age WHERE id = (SELECT MIN(id) FROM events)",
            {"age": int(scheduler_rt.settings.events.ttl_hours * 3_600_000) + 1000},
        )
    assert SchedulerService(scheduler_rt).clean_events() == 1
    assert len(scheduler_rt.events.read(None, None, 1000)) == before - 1


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('[heartbeats.assistant]\ninterval = 5\ncron = "* * * * *"\n', "heartbeats"),
        ("[heartbeats.nobody]\ninterval = 5\n", "heartbeats.nobody"),
        ('[heartbeats.assistant]\ncron = "99 * * * *"\n', "heartbeats.assistant.cron"),
        ('[[schedules]]\nagent = "assistant"\nmessage = "x"\n', "schedules.0"),
        ('[[schedules]]\nagent = "ghost"\nmessage = "x"\ncron = "* * * * *"\n', "schedules.0.agent"),
        ("[scheduler]\ncatchup_seconds = 90000\n", "scheduler"),
        ('[scheduler]\ntimezone = "Mars/Olympus"\n', "scheduler.timezone"),
    ],
)
def test_bad_scheduler_settings_name_the_key(tmp_path: Path, extra: str, key: str) -> None:
    home = write_home(tmp_path / "home", f"sqlite:///{tmp_path / 'a.db'}", extra)
    # Refused when the settings are loaded (by every command, not only when the scheduler starts).
    with pytest.raises(SettingsError) as err:
        open_runtime(home, env={})
    assert key in str(err.value)
