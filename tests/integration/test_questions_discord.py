"""An agent's question in Discord (``permission_mode = "ask"``), through the real channel runner against the
fake REST API and gateway: the question arrives with Allow / Deny / Allow for this chat buttons; a press by
someone else changes nothing (they are told, privately); the asker's press decides the request, and the
question is edited to the decision with its buttons gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.discord import DiscordChannel
from shared.chat.address import ChatAddress
from tests.approval_support import COMMAND, ask_for_bash, status_of
from tests.channel_support import RunningChannel, channel_home, discord_env, open_home, wait_for
from tests.fakes.discord_api import FakeDiscord

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ANN, BOB = 5001, 5002
DM, GUILD, GUILD_CHANNEL = 7001, 8001, 8101
QUESTION_BUTTONS = ["Allow", "Deny", "Allow for this chat"]


@pytest.mark.parametrize("where", ["guild", "dm"])
def test_a_press_answers_the_question_only_for_its_asker(tmp_path: Path, where: str) -> None:
    channels = {
        "discord": {"allowlist": [str(ANN), str(BOB)], "guild_ready_timeout_seconds": 0.1, "typing": False}
    }
    rt = open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels))
    in_guild = where == "guild"
    channel_id = GUILD_CHANNEL if in_guild else DM
    try:
        with FakeDiscord(heartbeat_interval_ms=5_000) as fake:
            with RunningChannel(DiscordChannel(rt, env=discord_env(fake))):
                wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
                text = f"<@{fake.bot_id}> clean up" if in_guild else "clean up"
                fake.push_message(channel_id, text, ANN, "ann", guild_id=GUILD if in_guild else None)
                message_id = wait_for(lambda: rt.db.read_scalar("SELECT id FROM messages"), 10, "the message")
                chat = ChatAddress("discord", "ann", sender_id=str(ANN), conversation=str(channel_id))
                request = ask_for_bash(rt, chat, str(message_id))

                question = fake.wait_for(lambda s: s.kind == "message" and bool(s.buttons), 10)
                assert question.message_id is not None
                # Someone else presses Allow (in a DM nobody else can; the press is forged the same way).
                fake.press_button(question.message_id, f"{request.id}:allow", BOB, "bob")
                fake.wait_for(lambda s: s.kind == "followup", 10)
                assert status_of(rt, request.id) == "pending"
                fake.press_button(question.message_id, f"{request.id}:allow", ANN, "ann")
                wait_for(lambda: status_of(rt, request.id) == "allowed", 10, "the request allowed")
                fake.wait_for(lambda s: s.kind == "edit", 10)
                fake.wait_for(lambda s: s.kind == "followup" and "Allowed" in (s.content or ""), 10)
            chat_log = [
                (s.kind, s.content, [label for label, _, _ in s.buttons], s.ephemeral)
                for s in fake.sent
                if s.channel_id == channel_id and s.kind != "typing"
            ]
            styles = [(custom_id, style) for _, custom_id, style in question.buttons]
            presses = [(i.user_id, i.answered_with) for i in fake.interactions]
    finally:
        rt.close()
    decided = f"✅ Allowed by ann — Bash: {COMMAND}"
    assert chat_log[0][0] == "message" and COMMAND in (chat_log[0][1] or "")
    assert chat_log[0][2] == QUESTION_BUTTONS
    asked = chat_log[0][1]
    assert chat_log[:4] == [
        ("message", asked, QUESTION_BUTTONS, False),
        ("interaction_response", None, [], True),  # deferred at once, privately
        ("followup", "Only ann can answer this request.", [], True),
        ("interaction_response", None, [], True),
    ]
    # The edit is delivered by the runner, the followup by the press: either may come first.
    assert sorted(chat_log[4:]) == [
        ("edit", decided, [], False),  # the question, now its answer, without buttons
        ("followup", decided, [], True),
    ]
    assert styles == [(f"{request.id}:allow", 3), (f"{request.id}:deny", 4), (f"{request.id}:chat", 2)]
    assert presses == [(BOB, 5), (ANN, 5)]


def test_a_press_acknowledged_too_late_still_answers(tmp_path: Path) -> None:
    channels = {"discord": {"allowlist": [str(ANN)], "guild_ready_timeout_seconds": 0.1, "typing": False}}
    rt = open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels))
    try:
        with FakeDiscord(heartbeat_interval_ms=5_000) as fake:
            fake.answer_within = 0.0  # every acknowledgement comes too late ("This interaction failed")
            with RunningChannel(DiscordChannel(rt, env=discord_env(fake))):
                wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
                fake.push_message(DM, "clean up", ANN, "ann")
                message_id = wait_for(lambda: rt.db.read_scalar("SELECT id FROM messages"), 10, "the message")
                chat = ChatAddress("discord", "ann", sender_id=str(ANN), conversation=str(DM))
                request = ask_for_bash(rt, chat, str(message_id))
                question = fake.wait_for(lambda s: s.kind == "message" and bool(s.buttons), 10)
                assert question.message_id is not None
                fake.press_button(question.message_id, f"{request.id}:deny", ANN, "ann")
                wait_for(lambda: status_of(rt, request.id) == "denied", 10, "the request denied")
                fake.wait_for(lambda s: s.kind == "edit", 10)
            chat_log = [
                (s.kind, s.content, s.buttons) for s in fake.sent if s.channel_id == DM and s.kind != "typing"
            ]
            refused = [r.status for r in fake.requests if r.path.endswith("/callback")]
    finally:
        rt.close()
    assert refused == [404]
    assert chat_log[1:] == [("edit", f"🚫 Denied by ann — not run: Bash: {COMMAND}", [])]
