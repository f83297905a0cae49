"""The busy note as a Telegram chat sees it: the real processor (``agentpost run processor``, a scripted agent)
and the Telegram adapter (python-telegram-bot) in-process against the fake Bot API. A chat that writes while
the agent is busy with another chat gets one note, then one answer; ``busy_notice = false`` turns the note
off for the channel."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from adapters.telegram import TelegramChannel
from shared.runtime import Runtime
from tests.channel_support import HoldingTelegram, Proc, RunningChannel, count, events, open_home, wait_for
from tests.fault_support import fault_home
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

TELEGRAM = {"allowlist": ["42", "43"], "poll_timeout_seconds": 1, "typing": False}
PROCESSOR = {"control_interval_seconds": 0.2, "recover_interval_seconds": 0.5}


@contextmanager
def running(tmp_path: Path, fake: HoldingTelegram, telegram: Mapping[str, Any]) -> Iterator[Runtime]:
    """The Telegram adapter in-process and a processor process, over one SQLite home."""
    home = fault_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"telegram": dict(telegram)}, processor=PROCESSOR
    )
    rt = open_home(home)
    channel = TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    try:
        with RunningChannel(channel):
            yield rt
    finally:
        processor.stop()
        rt.close()


def _busy_then_burst(rt: Runtime, fake: HoldingTelegram) -> None:
    """Chat 43 starts a 4 s run; while it goes on, chat 42 writes three messages; wait until all is sent."""
    fake.push_text(43, "token-long sleep=4")
    wait_for(lambda: events(rt, "chain_step_start"), 30, "the run for chat 43 to start")
    for word in ("token-a", "token-b", "token-c"):
        fake.push_text(42, word)
    wait_for(
        lambda: (
            count(rt, "SELECT COUNT(*) FROM messages WHERE status = 'completed'") == 4
            and count(rt, "SELECT COUNT(*) FROM responses WHERE status <> 'acked'") == 0
        ),
        40,
        "every message answered and every reply sent",
    )


def test_a_chat_writing_while_the_agent_is_busy_sees_one_note_then_one_answer(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    with running(tmp_path, fake, TELEGRAM) as rt:
        _busy_then_burst(rt, fake)
        texts, busy = fake.texts(42), fake.texts(43)
    assert len(texts) == 2, texts  # three messages mid-run: one note, not three
    note, answer = texts
    assert note == (
        "Queued: “alpha” is busy with another conversation. This will be answered together with anything "
        "else you send meanwhile, after the current run."
    )
    assert answer == "(Answering your 3 messages together.)\nalpha answered token-a token-b token-c"
    assert busy == ["alpha answered token-long"]  # the chat whose run it was gets no note


def test_busy_notice_false_turns_the_note_off_for_the_channel(tmp_path: Path, fake: HoldingTelegram) -> None:
    with running(tmp_path, fake, {**TELEGRAM, "busy_notice": False}) as rt:
        _busy_then_burst(rt, fake)
        texts = fake.texts(42)
    assert texts == ["(Answering your 3 messages together.)\nalpha answered token-a token-b token-c"]
