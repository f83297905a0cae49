"""An agent's question on Telegram, end to end: the real claude CLI (``permission_mode = "ask"``) against the
fake Anthropic API asks for Bash; the processor and the Telegram channel run against the fake Bot API in a
forum topic of a group. The question arrives with its three buttons; a press by someone else changes nothing
(they get an alert), the asker's press lets the command run; the question is edited to the decision without
its keyboard; a late press is told the request is over; ``/allow`` typed in the chat answers too. And without
a run: a question deleted in the chat gets its answer as a new message, an edit to what it already shows is
done."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.approval_prompts import buttons_for
from adapters.runner import ChannelRunner
from adapters.telegram import TelegramChannel
from shared.chat.address import ChatAddress
from shared.queue import approvals
from shared.runtime import Runtime
from shared.storage.statuses import ApprovalStatus
from tests.approval_support import ask_for_bash
from tests.channel_support import HoldingTelegram, RunningChannel, telegram_env, wait_for
from tests.fakes.anthropic_api import (
    Computed,
    FakeAnthropic,
    ToolUse,
    last_user_text,
    tool_result_text,
    tool_results,
)
from tests.fixtures import cli_installed, telegram_fake  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env, of_kind, serving
from tests.processor_support import open_home

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

GROUP, TOPIC = -1005001, 7
ANN, BOB = 42, 900
KEYBOARD = [[("Allow", "{id}:allow"), ("Deny", "{id}:deny")], [("Allow for this chat", "{id}:chat")]]


def model(body: dict[str, Any]) -> Any:
    """Ask for ``echo ran > marker-N.txt`` (N from the prompt); then report what the tool gave."""
    results = tool_results(body)
    if not results:
        found = re.search(r"marker-(\d+)", last_user_text(body))
        n = found.group(1) if found else "0"
        return ToolUse("Bash", {"command": f"echo ran > marker-{n}.txt", "description": "Write the marker"})
    result = results[-1]
    verdict = "TOOL FAILED" if result.get("is_error") else "TOOL RAN"
    return f"{verdict}: {tool_result_text(result)[:160]}"


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        fake.add_rule(None, Computed(model))
        yield fake


def _home(tmp_path: Path, db_url: str, **processor: Any) -> Path:
    channels = {"telegram": {"allowlist": [str(ANN), str(BOB)], "poll_timeout_seconds": 1}}
    return claude_home(
        tmp_path, db_url, agent={"permission_mode": "ask"}, processor=processor, channels=channels
    )


def _sqlite(tmp_path: Path) -> str:
    # The press path is the same on both databases (the first test runs on each): one is enough here.
    return f"sqlite:///{tmp_path / 'agentpost.db'}"


def _channel(rt: Runtime, fake: HoldingTelegram) -> RunningChannel:
    return RunningChannel(ChannelRunner(TelegramChannel(rt, env=telegram_env(fake))))


def _ask(fake: HoldingTelegram, text: str) -> None:
    fake.push_text(
        GROUP, f"@agentpost_bot {text}", user_id=ANN, username="ann", chat_type="supergroup", thread_id=TOPIC
    )


def _question(fake: HoldingTelegram) -> tuple[int, str]:
    """The question as it arrived (message id, approval id), once it has, with its buttons checked."""
    shown = fake.wait_for(lambda c: c.chat_id == GROUP and c.keyboard is not None, 40)
    assert shown.params.get("message_thread_id") == str(TOPIC)  # in the topic it was asked in
    assert shown.keyboard is not None
    approval_id = shown.keyboard[0][0][1].split(":")[0]
    assert shown.keyboard == [
        [(label, data.format(id=approval_id)) for label, data in row] for row in KEYBOARD
    ]
    return int(shown.result["message_id"]), approval_id


def _press(fake: HoldingTelegram, message_id: int, data: str, user_id: int, username: str) -> dict[str, Any]:
    """Press a button as ``user_id``; the answer they were given, once it came and the update was
    acknowledged."""
    update = fake.push_callback_query(GROUP, message_id, data, user_id=user_id, username=username)
    count = len([a for a in fake.callback_answers if a["user_id"] == user_id]) + 1
    wait_for(
        lambda: len([a for a in fake.callback_answers if a["user_id"] == user_id]) >= count,
        15,
        f"the answer to {username}'s press",
    )
    # Acknowledged to Telegram (the next poll's offset) once answered.
    fake.wait_for_offset(int(update["update_id"]) + 1, 10)
    return [a for a in fake.callback_answers if a["user_id"] == user_id][-1]


def _final(rt: Runtime, fake: HoldingTelegram) -> str:
    """The final reply, once it was delivered (the last text the chat shows)."""
    done = wait_for(
        lambda: [r for r in of_kind(rt, "final") if r["status"] == "acked"], 40, "the final reply delivered"
    )
    text = str(done[-1]["message"])
    assert fake.chat_log(GROUP)[-1][2] == text, fake.transcript(GROUP)
    return text


def _previewed(text: str, final: str) -> bool:
    """Whether ``text`` is what a live preview showed before ``final``: the run waiting for the answer, then
    going on with it, or the start of the reply (the preview marks it unfinished with "…")."""
    steps = ("⏳ Waiting for your approval: Bash", "▶ Running: Bash")
    return text.startswith(steps) or final.startswith(text.rstrip(" …"))


def _markers(tmp_path: Path, n: int) -> list[Path]:
    return [p for p in tmp_path.rglob(f"marker-{n}.txt") if p.is_file()]


def test_the_askers_press_lets_it_run_and_the_question_shows_the_decision(
    tmp_path: Path, db_url: str, api: FakeAnthropic, fake: HoldingTelegram
) -> None:
    with open_home(_home(tmp_path, db_url)) as rt, serving(rt, cli_env(api, tmp_path)), _channel(rt, fake):
        _ask(fake, "please write marker-1")
        message_id, approval_id = _question(fake)

        # Bob, in the same group, presses Allow: nothing changes, and he is told plainly why.
        told = _press(fake, message_id, f"{approval_id}:allow", BOB, "bob")
        assert (told["text"], told["show_alert"]) == ("Only ann can answer this request.", True)
        request = approvals.get(rt.db, approval_id)
        assert request is not None and request.status == ApprovalStatus.PENDING
        assert not _markers(tmp_path, 1)

        told = _press(fake, message_id, f"{approval_id}:allow", ANN, "ann")
        decided = "✅ Allowed by ann — Bash: echo ran > marker-1.txt"
        assert (told["text"], told["show_alert"]) == (decided, False)
        final = _final(rt, fake)
        assert final.startswith("TOOL RAN")
        assert _markers(tmp_path, 1), "the allowed command did not run"

        # A press on the old keyboard (a client that had not seen the edit): the request is over.
        late = _press(fake, message_id, f"{approval_id}:deny", ANN, "ann")
        assert late["text"] == f"This request was already answered: {decided}" and late["show_alert"]
        request = approvals.get(rt.db, approval_id)
        assert request is not None and request.status == ApprovalStatus.ALLOWED
        assert (request.decided_by, request.decided_via) == ("ann", "chat")

    # The chat as Telegram got it: the question with its keyboard, edited to the decision without one; the
    # rest is the reply's live preview (the run's "⏳ waiting" step, when it was shown in time) and the reply.
    log, story = fake.chat_log(GROUP), fake.transcript(GROUP)
    keyboard = [[(label, data.format(id=approval_id)) for label, data in row] for row in KEYBOARD]
    assert log[0] == ("sendMessage", message_id, approvals.question_text(request), keyboard), story
    assert [e for e in log if e[1] == message_id] == [
        log[0],
        ("editMessageText", message_id, decided, None),
    ], story
    reply = [(i, text, buttons) for _, i, text, buttons in log if i != message_id]
    assert reply[-1][1] == final and all(b is None for _, _, b in reply), story
    assert len({i for i, _, _ in reply}) == 1, story  # one message: the preview edited into the reply
    assert all(_previewed(t, final) for _, t, _ in reply[:-1]), story
    shown = fake.message(GROUP, message_id)
    assert shown is not None and shown["text"] == decided and "reply_markup" not in shown


def test_a_press_after_the_time_ran_out_is_told_it_expired(
    tmp_path: Path, api: FakeAnthropic, fake: HoldingTelegram
) -> None:
    home = _home(tmp_path, _sqlite(tmp_path), approval_timeout_seconds=3)
    with open_home(home) as rt, serving(rt, cli_env(api, tmp_path)), _channel(rt, fake):
        _ask(fake, "please write marker-2")
        message_id, approval_id = _question(fake)
        final = _final(rt, fake)
        assert final.startswith("TOOL FAILED") and "(no answer within 3 s)" in final
        told = _press(fake, message_id, f"{approval_id}:allow", ANN, "ann")
        assert (told["text"], told["show_alert"]) == ("This request has expired.", True)
        assert not _markers(tmp_path, 2)
    closed = "⌛ No answer within 3 s — not run: Bash: echo ran > marker-2.txt"
    question = [e for e in fake.chat_log(GROUP) if e[1] == message_id]
    assert [(m, t, b is not None) for m, _, t, b in question] == [
        ("sendMessage", question[0][2], True),
        ("editMessageText", closed, False),  # the keyboard is gone with the edit
    ], fake.transcript(GROUP)


def test_allow_typed_in_the_chat_answers(tmp_path: Path, api: FakeAnthropic, fake: HoldingTelegram) -> None:
    with (
        open_home(_home(tmp_path, _sqlite(tmp_path))) as rt,
        serving(rt, cli_env(api, tmp_path)),
        _channel(rt, fake),
    ):
        _ask(fake, "please write marker-3")
        message_id, _ = _question(fake)
        fake.push_text(GROUP, "/allow", user_id=ANN, username="ann", chat_type="supergroup", thread_id=TOPIC)
        assert _final(rt, fake).startswith("TOOL RAN")
        assert _markers(tmp_path, 3)
    decided = "✅ Allowed by ann — Bash: echo ran > marker-3.txt"
    texts = [(m, i, t) for m, i, t, _ in fake.chat_log(GROUP)]
    assert [e for e in texts if e[1] == message_id][1:] == [("editMessageText", message_id, decided)], (
        fake.transcript(GROUP)
    )
    # Ann was told what her /allow did, in the topic she typed it in.
    told = [c for c in fake.sent if c.method == "sendMessage" and c.text == decided]
    assert len(told) == 1 and told[0].params.get("message_thread_id") == str(TOPIC)


def test_a_deleted_question_gets_its_answer_anew_and_an_edit_changing_nothing_is_done(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    chat = ChatAddress("telegram", "ann", sender_id=str(ANN), conversation=str(ANN))
    fake.add_chat(ANN, username="ann")
    with open_home(_home(tmp_path, _sqlite(tmp_path))) as rt:
        with _channel(rt, fake):
            request = ask_for_bash(rt, chat, "", command="rm -rf build", agent="coder")
            shown = fake.wait_for(lambda c: c.chat_id == ANN and c.keyboard is not None, 20)
            fake.delete_message(ANN, int(shown.result["message_id"]))  # Ann deleted it in her chat
            answered = approvals.answer(
                rt.db, rt.queue.responses, request.id, "deny", by="operator", via="cli"
            )
            assert answered.outcome == "applied"
            denied = "🚫 Denied by operator — not run: Bash: rm -rf build"
            fake.wait_for(lambda c: c.method == "sendMessage" and c.text == denied, 20)
        assert [(m, t, b is not None) for m, _, t, b in fake.chat_log(ANN)] == [
            ("sendMessage", approvals.question_text(request), True),
            ("sendMessage", denied, False),
        ], fake.transcript(ANN)
        refused = [c for c in fake.calls if c.method == "editMessageText"]
        assert refused and all(c.error is not None for c in refused)  # the edit was tried first

        # The plugin itself: a second close (its first was done, the acknowledgement lost) is "not modified".
        channel = TelegramChannel(rt, env=telegram_env(fake))

        async def close_twice() -> list[bool]:
            await channel.open()
            try:
                question = await channel.send_question(str(ANN), "Allow it?", buttons_for(request.id))
                assert question is not None
                return [await channel.close_question(str(ANN), question, denied) for _ in range(2)]
            finally:
                await channel.close()

        assert asyncio.run(close_twice()) == [True, True]
    edits = [c for c in fake.calls if c.method == "editMessageText"][len(refused) :]
    assert [(c.ok, c.keyboard) for c in edits] == [(True, None), (False, None)]
    assert "not modified" in str((edits[1].error or {}).get("description"))
