"""End to end in one process: a Discord mention runs the real Claude Code CLI (against the fake Anthropic API,
which asks for Bash) under ``permission_mode = "ask"``; the question reaches the Discord chat with buttons,
another member's press changes nothing, the asker's press lets the command run, and the chat shows the
question edited to the decision and then the agent's reply."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.discord import DiscordChannel
from tests.approval_support import asking_model, command_runs, status_of
from tests.channel_support import RunningChannel, discord_env, wait_for
from tests.fakes.anthropic_api import Computed, FakeAnthropic
from tests.fakes.discord_api import FakeDiscord
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env, run_with
from tests.processor_support import open_home

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ANN, BOB = 5001, 5002
GUILD, CHANNEL = 8001, 8101
COMMAND = "echo ran >> marker-9.txt"  # what the scripted model asks to run for "marker-9"


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        fake.add_rule(None, Computed(asking_model))
        yield fake


def test_a_discord_press_lets_the_real_cli_run_the_command(tmp_path: Path, api: FakeAnthropic) -> None:
    channels = {
        "discord": {"allowlist": [str(ANN), str(BOB)], "guild_ready_timeout_seconds": 0.1, "typing": False}
    }
    home = claude_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", agent={"permission_mode": "ask"}, channels=channels
    )
    with open_home(home) as rt, FakeDiscord(heartbeat_interval_ms=5_000) as fake:
        with RunningChannel(DiscordChannel(rt, env=discord_env(fake))):
            wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
            fake.push_message(CHANNEL, f"<@{fake.bot_id}> please write marker-9", ANN, "ann", guild_id=GUILD)
            wait_for(lambda: rt.db.read_scalar("SELECT id FROM messages"), 10, "the message queued")
            asked: list[str] = []

            def press() -> None:
                question = fake.wait_for(lambda s: s.kind == "message" and bool(s.buttons), 40)
                assert question.message_id is not None
                request = question.buttons[0][1].rpartition(":")[0]
                asked.append(request)
                fake.press_button(question.message_id, f"{request}:allow", BOB, "bob")
                fake.wait_for(lambda s: s.kind == "followup", 10)
                assert status_of(rt, request) == "pending"
                assert command_runs(tmp_path, 9) == 0  # the CLI waits: nothing ran yet
                fake.press_button(question.message_id, f"{request}:allow", ANN, "ann")

            run_with(rt, cli_env(api, tmp_path), press)
            fake.wait_for(lambda s: "TOOL RAN" in (s.content or ""), 20)
        records = [s for s in fake.sent if s.channel_id == CHANNEL and s.kind != "typing"]
        (request,) = asked
        status = status_of(rt, request)
    assert status == "allowed" and command_runs(tmp_path, 9) == 1, "the allowed command did not run once"
    decided = f"✅ Allowed by ann — Bash: {COMMAND}"
    shown = records[0].message_id
    # The question, the answers to the presses, and the question's edit to the decision, in order.
    asking = [
        (s.kind, s.content)
        for s in records
        if s.kind in ("interaction_response", "followup") or s.message_id == shown
    ]
    question_text = asking[0][1] or ""
    assert "coder asks to use Bash" in question_text and COMMAND in question_text
    assert records[0].buttons and records[0].kind == "message"
    assert asking[:4] == [
        ("message", question_text),
        ("interaction_response", None),
        ("followup", "Only ann can answer this request."),
        ("interaction_response", None),
    ]
    assert sorted(asking[4:]) == [("edit", decided), ("followup", decided)]
    # Beside them, the run's own output: a progress note or a live preview ("⏳ Waiting for your approval
    # …", "▶ Running: Bash …", the reply as it streams) in one message, edited to the reply, or the reply.
    run = [(s.kind, s.content) for s in records if s.kind in ("message", "edit") and s.message_id != shown]
    assert run[0][0] == "message" and run[-1][1] == "TOOL RAN: (Bash completed with no output)", run
    assert all(kind == "edit" for kind, _ in run[1:]), run
