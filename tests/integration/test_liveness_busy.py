"""Busy chats with the real Claude Code CLI against the fake API: what messages sent while a run is going
become under each busy policy, the one note telling their chat so, the debounce window, and the cap on
waiting messages."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.chat.address import ChatAddress
from shared.chat.prefs import set_busy_policy
from shared.clock import now_ms
from shared.queue.core import Queue
from shared.runtime import Runtime
from tests.fakes.anthropic_api import Chunked, FakeAnthropic, Text
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env, group_gone, of_kind, payloads, responses, run_with
from tests.processor_support import open_home, run_idle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SLOW = Chunked(["working "] * 6, interval=0.5)  # about 3 s of streaming


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        fake.add_rule(re.compile(r"^first"), SLOW)
        yield fake


def _five_when_running(
    api: FakeAnthropic, queue: Queue, chat: str = "c1"
) -> tuple[list[str], Callable[[], None]]:
    """The ids the action fills, and the action: once the first run has reached the API, send five more."""
    ids: list[str] = []

    def act() -> None:
        api.wait_for_main_requests(1, 30)
        for n in range(1, 6):
            sent = queue.intake.enqueue_message(
                ChatAddress("telegram", "ann", sender_id="7", conversation=chat), f"extra {n}"
            )
            ids.append(sent.message_id)

    return ids, act


def test_collect_five_messages_during_a_run_become_one_followup_run(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    home = claude_home(tmp_path, db_url)
    with open_home(home) as rt:
        first = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "first task"
        )
        ids, act = _five_when_running(api, rt.queue)
        stats = run_with(rt, cli_env(api, tmp_path), act)
        assert stats.invocations == 2
        for mid in [first.message_id, *ids]:
            msg = rt.queue.admin.get_message(mid)
            assert msg is not None and msg.status == "completed" and msg.retry_count == 0
        finals = of_kind(rt, "final")
        assert len(finals) == 2 and len(responses(rt)) == 3  # the two answers and the one busy note
        assert finals[1]["message_id"] == ids[0]  # the follow-up run answers the five as one group
    main = api.main_requests()
    assert len(main) == 2
    follow = main[1].last_user_text
    assert "5 messages arrived" in follow
    assert [follow.index(f"extra {n}") for n in range(1, 6)] == sorted(
        follow.index(f"extra {n}") for n in range(1, 6)
    )


def test_followup_runs_each_waiting_message_alone_in_order(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    home = claude_home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        # the per-chat override (/queue followup)
        set_busy_policy(rt.db, ChatAddress("telegram", conversation="c1"), "followup")
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "first task"
        )
        ids, act = _five_when_running(api, rt.queue)
        stats = run_with(rt, cli_env(api, tmp_path), act)
        assert stats.invocations == 6
        finals = of_kind(rt, "final")
        assert [f["message_id"] for f in finals[1:]] == ids
        starts = payloads(rt, "chain_step_start")
        assert [s["policy"] for s in starts[1:]] == ["followup"] * 5
    texts = [r.last_user_text for r in api.main_requests()]
    assert texts[1:] == [f"extra {n}" for n in range(1, 6)]


def test_interrupt_kills_the_running_cli_and_the_new_run_carries_the_earlier_message(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.script()
    api.add_rule(re.compile(r"^first"), Chunked(["still going "] * 40, interval=0.5))  # 20 s if not stopped
    home = claude_home(tmp_path, sqlite_url, processor={"busy_policy": "interrupt"})
    with open_home(home) as rt:
        first = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "first task"
        )
        other = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "bo", sender_id="8", conversation="c2"), "other chat"
        )
        second: list[str] = []

        def act() -> None:
            api.wait_for_main_requests(1, 30)
            time.sleep(1.0)  # let it stream a little
            second.append(
                rt.queue.intake.enqueue_message(
                    ChatAddress("telegram", "ann", sender_id="7", conversation="c1"),
                    "actually do this instead",
                ).message_id
            )

        started = time.monotonic()
        stats = run_with(rt, cli_env(api, tmp_path), act)
        assert time.monotonic() - started < 15, "the first run should have been interrupted, not finished"
        assert stats.interrupted == 1
        (interrupted,) = payloads(rt, "run_interrupted")
        assert interrupted["message_ids"] == [first.message_id]
        killed = next(d for d in payloads(rt, "chain_step_done") if d.get("stopped_by") == "interrupt")
        assert group_gone(int(killed["pid"]))
        for mid in (first.message_id, second[0], other.message_id):
            msg = rt.queue.admin.get_message(mid)
            assert msg is not None and msg.status == "completed" and msg.retry_count == 0, (mid, msg)
        finals = of_kind(rt, "final")
        c1 = [f for f in finals if f["conversation"] == "c1"]
        assert len(c1) == 1 and c1[0]["message_id"] == first.message_id  # one reply for both messages
        assert len([f for f in finals if f["conversation"] == "c2"]) == 1
    rerun = next(r for r in api.main_requests() if "actually do this instead" in r.last_user_text)
    assert "was stopped because 1 new message arrived" in rerun.last_user_text
    assert "first task" in rerun.last_user_text


def test_a_burst_inside_the_debounce_window_is_one_run(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    home = claude_home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        for n in range(3):
            sent = rt.queue.intake.enqueue_message(
                ChatAddress("telegram", "ann", sender_id="7", conversation="c1"),
                f"burst {n}",
                debounce_ms=800,
            )
            if n == 0:  # a lone message of a quiet chat is claimable at once ...
                lone = rt.queue.admin.get_message(sent.message_id)
                assert lone is not None and lone.available_at <= now_ms()
            time.sleep(0.2)
        # ... and the second one opened the window: the three wait together until 800 ms after the last.
        waiting = {int(r["available_at"]) for r in rt.db.read("SELECT available_at FROM messages")}
        assert len(waiting) == 1 and waiting.pop() > now_ms()
        stats = run_idle(rt, env=cli_env(api, tmp_path), include_delayed=True)
        assert stats.invocations == 1
        (final,) = responses(rt)
        assert final["metadata"]["kind"] == "final"
    (request,) = api.main_requests()
    assert all(f"burst {n}" in request.last_user_text for n in range(3))


def test_waiting_messages_past_the_cap_are_dropped_with_one_notice(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule(None, Text("answered"))
    home = claude_home(tmp_path, sqlite_url, processor={"max_waiting": 3})
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "first task"
        )
        ids, act = _five_when_running(api, rt.queue)
        stats = run_with(rt, cli_env(api, tmp_path), act)
        assert stats.invocations == 2 and stats.dropped == 2
        (notice,) = of_kind(rt, "dropped")
        assert notice["metadata"]["dropped"] == ids[:2]  # the two oldest waiting
        assert "extra 1" in notice["message"] and "extra 2" in notice["message"]
        assert "extra 3" not in notice["message"] and notice["conversation"] == "c1"
        for mid in ids:
            msg = rt.queue.admin.get_message(mid)
            assert msg is not None and msg.status == "completed"
    follow = api.main_requests()[1].last_user_text
    assert "extra 1" not in follow and all(f"extra {n}" in follow for n in (3, 4, 5))


def _busy_notes(rt: Runtime) -> list[dict[str, Any]]:
    return [r for r in of_kind(rt, "progress") if r["metadata"].get("note") == "busy"]


@pytest.mark.parametrize(
    ("policy", "said"),
    [
        ("collect", "answered together with anything else you send meanwhile, after the current run"),
        ("followup", "answered after the current run, each of your messages in turn"),
        ("interrupt", "stopping “coder”'s current run to include this message"),
    ],
)
def test_messages_sent_during_a_run_get_one_busy_note_per_chat_saying_how_they_will_be_handled(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic, policy: str, said: str
) -> None:
    api.script()
    api.add_rule(re.compile(r"^first"), Chunked(["working "] * 10, interval=0.5))  # 5 s unless stopped
    home = claude_home(tmp_path, sqlite_url, processor={"busy_policy": policy})
    burst = 1 if policy == "interrupt" else 5  # an interrupt starts a new run at the first one
    with open_home(home) as rt:
        first = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "first task"
        )
        mine: list[str] = []
        other: list[str] = []

        def act() -> None:
            api.wait_for_main_requests(1, 30)
            other.append(
                rt.queue.intake.enqueue_message(
                    ChatAddress("telegram", "bo", sender_id="8", conversation="c2"), "hello"
                ).message_id
            )
            for n in range(1, burst + 1):
                sent = rt.queue.intake.enqueue_message(
                    ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), f"extra {n}"
                )
                mine.append(sent.message_id)

        run_with(rt, cli_env(api, tmp_path), act)
        notes = _busy_notes(rt)
        finals = of_kind(rt, "final")
        for mid in [first.message_id, *mine, *other]:
            msg = rt.queue.admin.get_message(mid)
            assert msg is not None and msg.status == "completed", (mid, msg)
    c1 = [n for n in notes if n["conversation"] == "c1"]
    c2 = [n for n in notes if n["conversation"] == "c2"]
    assert len(c1) == 1 and len(c2) == 1, notes  # a burst of five mid-run: one note, not five
    assert c1[0]["message_id"] == mine[0] and said in c1[0]["message"], c1
    assert "busy with another conversation" in c2[0]["message"] and c2[0]["message_id"] == other[0]
    for note in (c1[0], c2[0]):
        # A note, never the answer: every final of its chat comes after it, and each chat has its answers.
        assert note["metadata"]["kind"] == "progress" and note["metadata"]["edit_key"]
        chat = [f for f in finals if f["conversation"] == note["conversation"]]
        assert chat and all(f["id"] > note["id"] for f in chat)
    answered = {f["message_id"] for f in finals}
    assert other[0] in answered and (first.message_id in answered or mine[0] in answered)
