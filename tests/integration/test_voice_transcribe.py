"""The speech-to-text request (adapters/voice.py ``transcribe``) with httpx against the fake service
(tests/fakes/transcribe_api.py): what it sends, and the plain explanation of each way it can fail."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from adapters.voice import NotHeard, heard_text, transcribe, transcriptions_url
from shared.settings.sections import VoiceSettings
from tests.fakes.transcribe_api import FakeTranscriber
from tests.probes import free_port

pytestmark = pytest.mark.integration

OGG = b"OggS" + bytes(60)


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    path = tmp_path / "1-voice.ogg"
    path.write_bytes(OGG)
    return path


def _why(recording: Path, config: VoiceSettings, url: str, key: str = "") -> str:
    with pytest.raises(NotHeard) as caught:
        asyncio.run(transcribe(recording, config, url, key))
    return str(caught.value)


def test_the_recording_and_model_are_sent_and_the_words_come_back(recording: Path) -> None:
    with FakeTranscriber("call mum at six", key="k1") as stt:
        words = asyncio.run(
            transcribe(recording, VoiceSettings(model="whisper-large-v3"), stt.base_url, "k1")
        )
    assert words == "call mum at six"
    [sent] = stt.received
    assert (sent.path, sent.model, sent.filename, sent.content_type, sent.data) == (
        "/v1/audio/transcriptions",
        "whisper-large-v3",
        "1-voice.ogg",
        "audio/ogg",
        OGG,
    )
    assert sent.authorization == "Bearer k1"
    assert heard_text("", words) == '[voice note, transcribed: "call mum at six"]'
    assert heard_text("fyi", words) == 'fyi\n[voice note, transcribed: "call mum at six"]'


def test_each_failure_is_explained_in_plain_words(recording: Path) -> None:
    config = VoiceSettings()
    with FakeTranscriber(key="right") as stt:
        assert "refused agentpost's key" in _why(recording, config, stt.base_url, "wrong")
        stt.fail_with(500)
        assert "answered with an error (HTTP 500)" in _why(recording, config, stt.base_url, "right")
        stt.fail_with(200)
        stt.words = "   "
        assert "no words could be made out" in _why(recording, config, stt.base_url, "right")
    assert "could not be reached" in _why(recording, config, f"http://127.0.0.1:{free_port()}/v1")
    assert "larger than the speech-to-text service takes" in _why(
        recording, VoiceSettings(max_mb=0.00001), "http://x"
    )


def test_a_service_that_does_not_answer_is_given_up_on_in_time(recording: Path) -> None:
    with FakeTranscriber(delay=5.0) as stt:
        started = time.monotonic()
        why = _why(recording, VoiceSettings(timeout_seconds=0.5), stt.base_url)
        took = time.monotonic() - started
    assert "did not answer within 0.5 s" in why
    assert took < 2.0, took


def test_the_address_may_be_the_base_or_the_endpoint() -> None:
    assert transcriptions_url("https://api.openai.com/v1") == "https://api.openai.com/v1/audio/transcriptions"
    assert transcriptions_url("http://h:9/v1/audio/transcriptions/") == "http://h:9/v1/audio/transcriptions"
