"""Live previews on Discord with real processes: ``agentpost run discord`` (discord.py against the fake
gateway and REST API) and ``agentpost run processor`` running the real Claude CLI against the fake Anthropic
API, which streams a reply over about five seconds. The chat sees the reply while it is written and ends
with exactly one message holding it; the same after the processor is killed mid-stream (the re-run finishes
the killed run's preview message)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.previews import INTERRUPTED_TEXT
from tests.channel_support import Proc, discord_env, wait_for
from tests.fakes.anthropic_api import Chunked, FakeAnthropic
from tests.fakes.discord_api import FakeDiscord
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ALICE, DM = 5001, 7001
CHANNELS = {"discord": {"allowlist": [str(ALICE)], "guild_ready_timeout_seconds": 0.1}}
LINES = [f"Line {i} of the answer, written slowly." for i in range(1, 11)]
REPLY = "\n".join(LINES)


@pytest.fixture
def fake() -> Iterator[FakeDiscord]:
    with FakeDiscord(heartbeat_interval_ms=5_000) as server:
        yield server


def _env(api: FakeAnthropic, tmp: Path) -> dict[str, str]:
    env = cli_env(api, tmp)
    env["PATH"] = os.environ.get("PATH", env["PATH"])
    return env


def chat(fake: FakeDiscord) -> dict[int, str]:
    """The bot's messages in the DM as it shows them now (edits applied), by message id."""
    shown: dict[int, str] = {}
    for s in fake.sent:
        if s.channel_id == DM and s.kind in ("message", "edit") and s.message is not None:
            shown[int(s.message["id"])] = s.content or ""
    return shown


def transcript(fake: FakeDiscord, since: float) -> str:
    """Every message and edit the fake accepted in the DM, in order (printed when a test fails)."""
    return "\n".join(
        f"+{s.at - since:6.2f}s {s.kind} #{(s.message or {}).get('id')}: {s.content!r}"
        for s in fake.sent
        if s.channel_id == DM and s.kind in ("message", "edit")
    )


def first_seen(fake: FakeDiscord, needle: str) -> float | None:
    return next(
        (
            s.at
            for s in fake.sent
            if s.channel_id == DM and s.kind != "typing" and needle in (s.content or "")
        ),
        None,
    )


def answered(fake: FakeDiscord) -> bool:
    return REPLY in chat(fake).values()


def test_reply_grows_in_one_message_that_becomes_the_answer(
    tmp_path: Path, fake: FakeDiscord, api: FakeAnthropic
) -> None:
    api.add_rule("tell me slowly", Chunked([line + "\n" for line in LINES], interval=0.5))
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=CHANNELS)
    adapter = Proc("discord", home, discord_env(fake), tmp_path / "discord.log")
    processor = Proc("processor", home, _env(api, tmp_path), tmp_path / "processor.log")
    began = time.monotonic()
    try:
        wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
        fake.push_message(DM, "tell me slowly", ALICE, "alice")
        wait_for(lambda: answered(fake), 60, "the whole reply in the chat")
        time.sleep(1.5)  # nothing may touch the answer afterwards
    finally:
        adapter.stop()
        processor.stop()
    record = transcript(fake, began)
    first, last = first_seen(fake, LINES[0]), first_seen(fake, LINES[-1])
    assert first is not None and last is not None, record
    assert last - first >= 2.0, (
        f"the first line was visible only {last - first:.2f} s before the last\n{record}"
    )
    assert list(chat(fake).values()) == [REPLY], record


def test_processor_killed_mid_stream_the_rerun_finishes_the_killed_runs_preview(
    tmp_path: Path, fake: FakeDiscord, api: FakeAnthropic
) -> None:
    """kill -9 of the processor while the reply streams: the re-run's text grows in the killed run's preview
    message, which becomes the whole answer (the same code as Telegram's: adapters/previews.py)."""
    slow = api.add_rule("tell me slowly", Chunked([line + "\n" for line in LINES] * 4, interval=0.5), times=1)
    api.add_rule("tell me slowly", Chunked([line + "\n" for line in LINES], interval=0.3))
    home = claude_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=CHANNELS, queue={"lease_seconds": 2}
    )
    env = _env(api, tmp_path)
    adapter = Proc("discord", home, discord_env(fake), tmp_path / "discord.log")
    first = Proc("processor", home, env, tmp_path / "processor.log")
    began = time.monotonic()
    second: Proc | None = None
    try:
        wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
        fake.push_message(DM, "tell me slowly", ALICE, "alice")
        wait_for(
            lambda: slow.hits == 1 and any(s.channel_id == DM and s.kind == "edit" for s in fake.sent),
            60,
            "the CLI to stream and the preview to be edited",
        )
        half = list(chat(fake).values())
        first.kill()
        second = Proc("processor", home, env, tmp_path / "processor2.log")
        wait_for(lambda: answered(fake), 60, "the re-run's whole reply in the chat")
        wait_for(lambda: list(chat(fake).values()) == [REPLY], 10, "the answer alone in the chat")
        time.sleep(1.5)  # nothing may touch the answer afterwards
    finally:
        adapter.stop()
        if second is not None:
            second.stop()
    record = transcript(fake, began)
    print(record)
    assert len(half) == 1 and REPLY not in half, record  # killed mid-reply, one preview shown
    assert list(chat(fake).values()) == [REPLY], record
    assert [s.kind for s in fake.sent if s.channel_id == DM and s.kind == "message"] == ["message"], record
    assert all(s.content != INTERRUPTED_TEXT for s in fake.sent if s.channel_id == DM), record
