"""Voice notes and photos, with real processes: ``agentpost run telegram`` against the fake Bot API,
``agentpost run processor`` running the real Claude Code CLI against the fake Messages API, and the fake
speech-to-text service (tests/fakes/transcribe_api.py).

- A voice note's words reach the agent, marked as a transcript; ``/status`` shows what was heard; a text
  sent while the voice note is still being heard is answered without waiting for it.
- With no service set up, or a service that fails (500), the chat is told why within 5 s and the next text
  is answered.
- A photo reaches the model as an image block with its caption beside it, on a cold run (warm sessions
  off) and in a kept (warm) claude process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.inbound_media import TRANSCRIPT_KEY
from shared.reads.trace import timeline_lines, trace_message
from tests.channel_support import HoldingTelegram, Proc, open_home, telegram_env, wait_for
from tests.fakes.anthropic_api import JSON, Computed, FakeAnthropic
from tests.fakes.transcribe_api import FakeTranscriber
from tests.files_in_support import PNG, PNG_B64
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: A few bytes that stand for an OGG/Opus recording (the fake service does not decode it).
OGG = b"OggS\x00\x02" + bytes(58) + b"OpusHead-fake-voice-note"
WORDS = "please summarise the launch plan"
KEY = "stt-key-for-tests"


def _last_user_blocks(body: JSON) -> list[JSON]:
    """The content blocks of the request's last user message with text (tool results skipped)."""
    for message in reversed(body.get("messages") or []):
        if not (isinstance(message, dict) and message.get("role") == "user"):
            continue
        content = message.get("content")
        if isinstance(content, str):
            return [{"type": "text", "text": content}]
        blocks = [b for b in content or [] if isinstance(b, dict)]
        if any(b.get("type") in ("text", "image") for b in blocks):
            return blocks
    return []


def _model(body: JSON) -> str:
    """The scripted model: says which images it was shown and the texts beside them."""
    blocks = _last_user_blocks(body)
    images = [b["source"] for b in blocks if b.get("type") == "image"]
    texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
    said = " | ".join(t.strip() for t in texts if "<system-reminder>" not in t and t.strip())
    if images:
        kinds = ",".join(f"{i['media_type']}:{len(i['data'])}" for i in images)
        return f"SAW {len(images)} [{kinds}] BESIDE {said}"
    return f"GOT {said}"


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(default=Computed(_model)) as fake:
        yield fake


def _finals(telegram: HoldingTelegram, chat: int, prefix: str) -> list[str]:
    """The bot's messages in ``chat`` as shown now (a preview edited into its final) starting with ``prefix``."""
    return [
        str(m.get("text") or "")
        for m in telegram.bot_messages(chat)
        if str(m.get("text") or "").startswith(prefix)
    ]


def _processes(
    tmp_path: Path,
    api: FakeAnthropic,
    telegram: HoldingTelegram,
    *,
    processor: dict[str, Any] | None = None,
    **env: str,
) -> tuple[Path, list[Proc]]:
    home = claude_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        channels={"telegram": {"allowlist": ["42", "43"], "poll_timeout_seconds": 1}},
        processor=processor,
    )
    procs = [
        Proc("telegram", home, telegram_env(telegram, **env), tmp_path / "telegram.log"),
        Proc("processor", home, cli_env(api, tmp_path), tmp_path / "processor.log"),
    ]
    return home, procs


def test_a_voice_note_reaches_the_agent_as_words_and_does_not_hold_up_later_messages(
    tmp_path: Path, api: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    # A slow service: the text sent after the voice note is answered while the note is still being heard.
    with FakeTranscriber(WORDS, key=KEY, delay=4.0) as stt, HoldingTelegram() as telegram:
        home, procs = _processes(
            tmp_path,
            api,
            telegram,
            AGENTPOST_VOICE_API_URL=stt.base_url,
            AGENTPOST_VOICE_API_KEY=KEY,
        )
        try:
            telegram.push_voice(42, OGG)
            telegram.push_text(42, "ping while you listen")
            wait_for(lambda: _finals(telegram, 42, "GOT ping"), 60, "the text answered")
            assert not _finals(telegram, 42, "GOT [voice"), "the text waited for the voice note"
            heard = wait_for(lambda: _finals(telegram, 42, "GOT [voice"), 60, "the voice note answered")
            telegram.push_text(42, "/status")
            status = wait_for(
                lambda: [t for t in telegram.texts(42) if "heard as" in t], 30, "the /status answer"
            )
            with open_home(home) as rt:
                row = rt.db.read(
                    "SELECT message_id, metadata FROM messages WHERE message LIKE '%voice note, transcribed%'"
                )[0]
                story = "\n".join(timeline_lines(trace_message(rt.db, str(row["message_id"]))))
        finally:
            for proc in procs:
                proc.stop()
    assert heard == [f'GOT [voice note, transcribed: "{WORDS}"]']
    received = stt.received
    assert len(received) == 1, received
    assert received[0].status == 200 and received[0].data == OGG and received[0].model == "whisper-1"
    assert received[0].authorization == f"Bearer {KEY}" and received[0].filename.endswith(".ogg")
    assert f'heard as: "{WORDS}"' in status[-1]
    assert json.loads(str(row["metadata"]))[TRANSCRIPT_KEY] == WORDS
    assert WORDS in story  # `agentpost trace` shows what was heard


@pytest.mark.parametrize("service", ["none", "failing"])
def test_a_voice_note_that_cannot_be_heard_is_explained_at_once_and_later_messages_are_answered(
    tmp_path: Path, api: FakeAnthropic, monkeypatch: pytest.MonkeyPatch, service: str
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    with FakeTranscriber() as stt, HoldingTelegram() as telegram:
        stt.fail_with(500)
        env = {"AGENTPOST_VOICE_API_URL": stt.base_url} if service == "failing" else {}
        _home, procs = _processes(tmp_path, api, telegram, **env)
        try:
            telegram.wait_for_poller(30)
            sent = time.monotonic()
            telegram.push_voice(43, OGG)
            note = telegram.wait_for(lambda c: c.chat_id == 43 and "voice note" in (c.text or ""), 10)
            told_after = note.at - sent
            telegram.push_text(43, "are you there?")
            wait_for(lambda: _finals(telegram, 43, "GOT are you there?"), 60, "the next text answered")
        finally:
            for proc in procs:
                proc.stop()
    text = note.text or ""
    print(f"{service}: the chat was told {told_after:.2f} s after the voice note was sent")
    assert told_after < 5.0, f"told after {told_after:.1f} s"
    assert text.startswith("I got your voice note but could not turn it into text:"), text
    if service == "none":
        assert "no speech-to-text service is set up" in text and not stt.received
    else:
        assert "HTTP 500" in text and "try again" in text and len(stt.received) == 1
    # Nothing of the voice note went to the agent: the only request is the text's.
    assert [r.last_user_text for r in api.main_requests()] == ["are you there?"]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_photo_reaches_the_model_as_an_image_with_its_caption(
    tmp_path: Path, api: FakeAnthropic, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    with HoldingTelegram() as telegram:
        home, procs = _processes(
            tmp_path, api, telegram, processor={"session_idle_seconds": 60 if warm else 0}
        )
        try:
            if warm:  # a first photo: the chat's process is started with it, and kept
                telegram.push_photo(43, PNG, caption="first")
                wait_for(lambda: _finals(telegram, 43, "SAW 1"), 60, "the first answer")
            telegram.push_photo(43, PNG, caption="what is in this picture?")
            seen = wait_for(
                lambda: [t for t in _finals(telegram, 43, "SAW") if "picture" in t], 60, "the photo answered"
            )
            with open_home(home) as rt:
                done = [
                    str(row["payload"])
                    for row in rt.db.read(
                        "SELECT payload FROM events WHERE type = 'chain_step_done' ORDER BY id"
                    )
                ]
        finally:
            for proc in procs:
                proc.stop()
    assert len(seen) == 1 and seen[0].startswith(
        f"SAW 1 [image/png:{len(PNG_B64)}] BESIDE what is in this picture?"
    )
    photo_request = next(r for r in api.main_requests() if "picture" in _model(r.body))
    images = [b for b in _last_user_blocks(photo_request.body) if b.get("type") == "image"]
    assert [i["source"] for i in images] == [{"type": "base64", "media_type": "image/png", "data": PNG_B64}]
    # The caption is the text right after the image (the message's own text block).
    blocks = _last_user_blocks(photo_request.body)
    after = blocks[blocks.index(images[0]) + 1]
    assert after["type"] == "text" and after["text"].startswith("what is in this picture?"), blocks
    assert "[file: " in after["text"] and "shown to you" in after["text"]
    if warm:
        assert len(done) == 2 and _pid(done[0]) == _pid(done[1]), done  # one kept process, two turns
        assert photo_request.user_turns >= 2
    else:
        assert len(done) == 1


def _pid(payload: str) -> int:
    return int(json.loads(payload)["pid"])
