"""The ``steer`` busy policy (workers/steer.py) with the real Claude Code CLI against the fake API: a message
sent while its chat's run goes on is handed to that run's CLI at once, the chat is told, and one final
reply answers the folded group."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.chat.prefs import set_busy_policy
from shared.runtime import Runtime
from tests.fakes.anthropic_api import Chunked, FakeAnthropic, RecordedRequest, Text, ToolUse
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env, of_kind, payloads, process_gone, run_with
from tests.processor_support import open_home

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CHAT = ChatAddress("telegram", "ann", sender_id="7", conversation="c1")
#: The first message's reply: six deltas 0.4 s apart (about 2 s of streaming).
SLOW_PARTS = ("one ", "two ", "three ", "four ", "five ", "six")


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        fake.add_rule(re.compile(r"second"), Text("second answer"))
        yield fake


def _steer_home(tmp_path: Path, db_url: str, **processor: object) -> Path:
    return claude_home(tmp_path, db_url, processor={"busy_policy": "steer", **processor})


def _send_second_once_running(api: FakeAnthropic, rt: Runtime, ids: list[str]) -> None:
    """The action: once the first run's request reached the API, send the second message."""
    api.wait_for_main_requests(1, 30)
    ids.append(rt.queue.intake.enqueue_message(CHAT, "second: and add tests").message_id)


def _request_with(api: FakeAnthropic, text: str) -> RecordedRequest:
    return next(r for r in api.main_requests() if text in r.last_user_text)


def _one_final_for_both(rt: Runtime, ids: list[str]) -> dict[str, object]:
    """The one final reply of the folded group; checks each message completed and the run counted once."""
    for mid in ids:
        msg = rt.queue.admin.get_message(mid)
        assert msg is not None and msg.status == "completed" and msg.retry_count == 0, msg
    finals = of_kind(rt, "final")
    events = rt.db.read("SELECT type, payload FROM events WHERE topic = 'queue' ORDER BY id")
    assert len(finals) == 1, (finals, [(e["type"], e["payload"][:300]) for e in events])
    (final,) = finals
    assert final["message_id"] == ids[0]
    starts = payloads(rt, "chain_step_start")
    assert len(starts) == 1, (starts, payloads(rt, "chain_step_done"))
    (start,) = starts  # one CLI run for both messages
    assert start["message_ids"] == ids[:1] and start["policy"] == "steer"
    (done,) = payloads(rt, "chain_step_done")
    assert done["ok"] is True and done["message_ids"] == ids
    claims = [p for p in payloads(rt, "message_claimed") if p.get("steered")]
    assert [c["message_ids"] for c in claims] == [ids[1:]] and claims[0]["run_id"] == start["run_id"]
    return final


def test_message_during_a_reply_becomes_the_next_turn_of_the_same_process(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    api.add_rule(re.compile(r"^first"), Chunked(SLOW_PARTS, interval=0.4))
    with open_home(_steer_home(tmp_path, db_url)) as rt:
        ids = [rt.queue.intake.enqueue_message(CHAT, "first: write the parser").message_id]
        stats = run_with(rt, cli_env(api, tmp_path), lambda: _send_second_once_running(api, rt, ids))
        assert stats.invocations == 1
        final = _one_final_for_both(rt, ids)
        # Each turn's answer, in order, in the one reply (which says it answers both).
        assert final["message"] == (
            "(Answering your 2 messages together.)\none two three four five six\n\nsecond answer"
        )
        (note,) = of_kind(rt, "progress")
        assert note["message_id"] == ids[1] and note["metadata"]["note"] == "steer"
        assert "Added to what “coder” is working on now" in note["message"]
    first, second = _request_with(api, "first"), _request_with(api, "second")
    # Handed over while the first turn streamed (one CLI run in all, above) and taken as its next turn right
    # after the first turn's last delta. bench/warm_sessions.py measures how soon (a few hundred ms at most);
    # the bound here leaves room for a machine loaded by the rest of the suite.
    last_delta = max(at for at, text in api.deltas if text == "six")
    assert 0 <= second.at - last_delta < 1.5, second.at - last_delta
    assert second.user_turns == 2 and "write the parser" in str(second.body["messages"])
    assert first.at < second.at


def test_message_during_a_tool_step_is_folded_into_the_running_turn(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    api.add_rule(
        re.compile(r"^first"),
        ToolUse("Bash", {"command": "sleep 3; echo built", "description": "Build"}),
        times=1,
    )
    home = _steer_home(tmp_path, db_url)
    with open_home(home) as rt:
        ids = [rt.queue.intake.enqueue_message(CHAT, "first: build it").message_id]
        run_with(
            rt,
            cli_env(api, tmp_path),
            lambda: _send_second_once_running(api, rt, ids),
        )
        final = _one_final_for_both(rt, ids)
        assert final["message"].endswith("\nsecond answer")
    main = api.main_requests()
    # The tool's result and the new message went out in one request of the same turn: two requests in all.
    assert len(main) == 2, [r.last_user_text for r in main]
    assert "second" in main[1].last_user_text and "built" in str(main[1].body["messages"][-1])


def test_chat_choice_steer_overrides_the_default(tmp_path: Path, db_url: str, api: FakeAnthropic) -> None:
    """``/queue steer`` in one chat: that chat steers while the processor's default stays ``collect``."""
    api.add_rule(re.compile(r"^first"), Chunked(SLOW_PARTS, interval=0.4))
    with open_home(claude_home(tmp_path, db_url)) as rt:
        set_busy_policy(rt.db, CHAT, "steer")
        ids = [rt.queue.intake.enqueue_message(CHAT, "first: write the parser").message_id]
        stats = run_with(rt, cli_env(api, tmp_path), lambda: _send_second_once_running(api, rt, ids))
        assert stats.invocations == 1
        _one_final_for_both(rt, ids)


def test_steer_with_warm_sessions_keeps_the_process_for_the_next_message(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    api.add_rule(re.compile(r"^first"), Chunked(SLOW_PARTS, interval=0.4))
    with open_home(_steer_home(tmp_path, db_url, session_idle_seconds=60)) as rt:
        ids = [rt.queue.intake.enqueue_message(CHAT, "first: write the parser").message_id]

        def act() -> None:
            _send_second_once_running(api, rt, ids)

        run_with(rt, cli_env(api, tmp_path), act)
        _one_final_for_both(rt, ids)
        (done,) = payloads(rt, "chain_step_done")
        # run_with's processor ended, and with it the kept process.
        assert process_gone(int(done["pid"]))


def test_without_steer_the_same_message_waits_for_a_followup_run(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    """The control: under ``collect`` the same timing gives two CLI runs (what steer saves)."""
    api.add_rule(re.compile(r"^first"), Chunked(SLOW_PARTS, interval=0.4))
    with open_home(claude_home(tmp_path, db_url)) as rt:
        ids = [rt.queue.intake.enqueue_message(CHAT, "first: write the parser").message_id]
        stats = run_with(rt, cli_env(api, tmp_path), lambda: _send_second_once_running(api, rt, ids))
        assert stats.invocations == 2
        assert [p["message_ids"] for p in payloads(rt, "chain_step_done")] == [ids[:1], ids[1:]]
        assert not [p for p in payloads(rt, "message_claimed") if p.get("steered")]
