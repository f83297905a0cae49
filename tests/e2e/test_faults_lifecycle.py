"""Fault injection: the real ``agentpost run telegram`` and ``agentpost run processor`` against the fake Bot
API, SIGKILLed at every step of a message's life, each restarted; then the invariant.

Steps (one chat each, so every reply is attributable):

1. after enqueue: the processor is killed while claiming (the claim never commits);
2. after claim: the processor is killed with the claim committed, before the agent CLI starts;
3. mid-run: the processor is killed while the agent CLI runs (the CLI dies with it);
4. after the response: the processor has completed the message and queued its reply; the adapter is killed
   as it claims the reply, and the processor too;
5. mid-delivery: the adapter is killed while the second chunk of a three-chunk reply is in flight.

Where each kill landed is confirmed from the database (kill points wait in ``pg_locks``; statuses, events
and the agent's start markers), never by timing. The invariant: every accepted message ends completed
with exactly one final reply, visible in its chat as exactly that reply's chunks, once each, in order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.chunking import split_message, utf16_len
from shared.runtime import Runtime
from tests.channel_support import HoldingTelegram, Proc, count, open_home, telegram_env, wait_for
from tests.fault_support import KillPoints, fault_home, fresh_pg_database, started_runs
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(120)]

CHATS = {"enqueue": 101, "claim": 102, "run": 103, "response": 104, "delivery": 105}
CHANNELS = {
    "telegram": {
        "allowlist": [str(c) for c in CHATS.values()],
        "poll_timeout_seconds": 1,
        "typing_interval_seconds": 1.0,
    }
}
QUEUE = {"lease_seconds": 1.5, "poll_interval_seconds": 0.5, "debounce_ms": 200}
PROCESSOR = {"recover_interval_seconds": 0.3, "progress_note_seconds": 0, "control_interval_seconds": 0.3}


class Lifecycle:
    """The processes under test, restartable, and what the test reads about them."""

    def __init__(self, tmp: Path, home: Path, fake: HoldingTelegram, rt: Runtime) -> None:
        self.tmp, self.home, self.fake, self.rt = tmp, home, fake, rt
        self.adapter = self.start_adapter()
        self.processor = self.start_processor()

    def start_adapter(self) -> Proc:
        return Proc("telegram", self.home, telegram_env(self.fake), self.tmp / "telegram.log")

    def start_processor(self) -> Proc:
        return Proc("processor", self.home, {}, self.tmp / "processor.log")

    def stop(self) -> None:
        for proc in (self.adapter, self.processor):
            proc.stop()

    def message_of(self, chat: int) -> dict[str, object]:
        rows = self.rt.db.read(
            "SELECT message_id, status, retry_count FROM messages WHERE conversation = :c", {"c": str(chat)}
        )
        assert len(rows) <= 1, rows
        return dict(rows[0]) if rows else {}

    def queued(self, chat: int) -> str:
        found = wait_for(lambda: self.message_of(chat), 15, f"the message of chat {chat} queued")
        return str(found["message_id"])

    def has_event(self, type_: str, message_id: str) -> bool:
        sql = "SELECT COUNT(*) FROM events WHERE type = :t AND message_id = :m"
        return count(self.rt, sql, {"t": type_, "m": message_id}) > 0

    def answered(self, chat: int) -> bool:
        sql = "SELECT COUNT(*) FROM responses WHERE conversation = :c AND status = 'acked'"
        return count(self.rt, sql, {"c": str(chat)}) > 0


def test_sigkill_at_every_lifecycle_step_leaves_exactly_one_final_reply(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    with fresh_pg_database() as url:
        home = fault_home(tmp_path, url, CHANNELS, processor=PROCESSOR, queue=QUEUE)
        points = KillPoints(url)
        rt = open_home(home)
        life = Lifecycle(tmp_path, home, fake, rt)
        landed: dict[str, str] = {}
        try:
            life.adapter.wait_output("telegram adapter")
            _after_enqueue(life, points, landed)
            _after_claim(life, points, landed)
            _mid_run(life, landed)
            _after_response(life, points, landed)
            _mid_delivery(life, landed)
            for chat in CHATS.values():
                wait_for(lambda c=chat: life.answered(c), 30, f"the reply in chat {chat} acked")  # type: ignore[misc]
        finally:
            life.stop()
            points.close()
        try:
            _check_invariant(rt, fake)
        finally:
            rt.close()
    assert set(landed) == set(CHATS), landed


def _after_enqueue(life: Lifecycle, points: KillPoints, landed: dict[str, str]) -> None:
    chat = CHATS["enqueue"]
    points.arm("claim")
    life.fake.push_text(chat, "token-enqueue do this")
    mid = life.queued(chat)
    wait_for(lambda: points.waiting("claim") == 1, 15, "the processor at the claim")
    life.processor.kill()
    points.disarm("claim")
    wait_for(lambda: points.waiting("claim") == 0, 10, "the killed claim rolled back")
    state = life.message_of(chat)
    assert state["status"] == "pending" and not life.has_event("message_claimed", mid), state
    landed["enqueue"] = "processor killed inside its claim; the message stayed pending, never claimed"
    life.processor = life.start_processor()
    wait_for(lambda: life.answered(chat), 30, "the reply after the restart")


def _after_claim(life: Lifecycle, points: KillPoints, landed: dict[str, str]) -> None:
    chat = CHATS["claim"]
    points.arm("run_start")
    life.fake.push_text(chat, "token-claim do that")
    mid = life.queued(chat)
    wait_for(lambda: points.waiting("run_start") == 1, 15, "the processor between claim and run")
    life.processor.kill()
    points.disarm("run_start")
    state = life.message_of(chat)
    assert state["status"] == "processing" and life.has_event("message_claimed", mid), state
    assert not life.has_event("chain_step_start", mid) and not started_runs(life.tmp, mid)
    landed["claim"] = "processor killed with the claim committed, before the CLI started"
    life.processor = life.start_processor()
    wait_for(lambda: life.answered(chat), 30, "the reply after the restart")


def _mid_run(life: Lifecycle, landed: dict[str, str]) -> None:
    chat = CHATS["run"]
    life.fake.push_text(chat, "token-run a long job sleepfirst=30")
    mid = life.queued(chat)
    wait_for(lambda: started_runs(life.tmp, mid), 20, "the agent CLI to start")
    life.processor.kill()
    state = life.message_of(chat)
    assert state["status"] == "processing" and life.has_event("chain_step_start", mid), state
    assert not life.has_event("chain_step_done", mid) and not life.answered(chat)
    landed["run"] = "processor killed while the agent CLI ran"
    life.processor = life.start_processor()
    wait_for(lambda: life.answered(chat), 30, "the reply after the restart")
    assert len(started_runs(life.tmp, mid)) == 2  # the interrupted run, then the re-run


def _after_response(life: Lifecycle, points: KillPoints, landed: dict[str, str]) -> None:
    chat = CHATS["response"]
    points.arm("delivery")
    life.fake.push_text(chat, "token-response answer me")
    mid = life.queued(chat)
    wait_for(lambda: points.waiting("delivery") == 1, 20, "the adapter claiming the reply")
    sql = "SELECT COUNT(*) FROM responses WHERE message_id = :m AND status = 'pending'"
    assert life.message_of(chat)["status"] == "completed" and count(life.rt, sql, {"m": mid}) == 1
    life.adapter.kill()
    life.processor.kill()
    points.disarm("delivery")
    wait_for(lambda: points.waiting("delivery") == 0, 10, "the killed claim rolled back")
    assert count(life.rt, sql, {"m": mid}) == 1 and life.fake.texts(chat) == []
    landed["response"] = "reply queued, adapter killed while claiming it (processor killed too)"
    life.adapter = life.start_adapter()
    life.processor = life.start_processor()
    wait_for(lambda: life.answered(chat), 30, "the reply after the restart")


def _mid_delivery(life: Lifecycle, landed: dict[str, str]) -> None:
    chat = CHATS["delivery"]
    life.fake.hold_send(2)  # the second chunk of the reply hangs in flight
    life.fake.push_text(chat, "token-delivery write long=30")
    mid = life.queued(chat)
    assert life.fake.held.wait(40), life.adapter.output()
    life.adapter.kill()
    life.fake.release()
    row = life.rt.db.read("SELECT status, delivered FROM responses WHERE message_id = :m", {"m": mid})
    assert row == [{"status": "delivering", "delivered": 1}] and len(life.fake.texts(chat)) == 1, row
    landed["delivery"] = "adapter killed with chunk 2 of 3 in flight"
    life.adapter = life.start_adapter()


def _check_invariant(rt: Runtime, fake: HoldingTelegram) -> None:
    """Every accepted message: completed, one final reply, its chunks visible once each, in order."""
    for step, chat in CHATS.items():
        messages = rt.db.read(
            "SELECT message_id, status FROM messages WHERE conversation = :c", {"c": str(chat)}
        )
        assert [m["status"] for m in messages] == ["completed"], (step, messages)
        responses = rt.db.read(
            "SELECT message, metadata, status FROM responses WHERE conversation = :c ORDER BY id",
            {"c": str(chat)},
        )
        kinds = [json.loads(r["metadata"]).get("kind") for r in responses]
        assert kinds == ["final"] and responses[0]["status"] == "acked", (step, kinds)
        expected = split_message(str(responses[0]["message"]).strip(), 4096, length=utf16_len)
        assert fake.texts(chat) == expected, (step, fake.texts(chat))
        if step == "delivery":
            assert len(expected) == 3
        else:
            assert expected == [f"alpha answered token-{step}"], (step, expected)
