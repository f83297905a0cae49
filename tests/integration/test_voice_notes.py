"""Voice notes on WhatsApp, with the adapter in-process against the fake Cloud API and the fake
speech-to-text service: the recording is fetched, heard, and queued as its words (the ``[voice]`` section
of settings.toml names the service)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from shared.inbound_media import TRANSCRIPT_KEY
from tests.channel_support import count, open_home, wait_for, whatsapp_webhook
from tests.fakes.transcribe_api import FakeTranscriber
from tests.fakes.whatsapp_api import FakeWhatsApp, audio_message_payload, signed_webhook
from tests.liveness_support import claude_home

pytestmark = pytest.mark.integration

SECRET = "app-secret-for-tests"
OGG = b"OggS" + bytes(40) + b"whatsapp-voice"


def test_a_whatsapp_voice_note_is_queued_as_its_words(tmp_path: Path) -> None:
    channels = {"whatsapp": {"allowlist": ["111"], "typing": False, "media_poll_seconds": 0.5}}
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=channels)
    with FakeTranscriber("meet me at the station") as stt, FakeWhatsApp() as fake:
        with (home / "settings.toml").open("a") as settings:
            settings.write(f'\n[voice]\napi_url = "{stt.base_url}"\nmodel = "whisper-large-v3"\n')
        with open_home(home) as rt, whatsapp_webhook(rt, fake, SECRET) as url:
            media_id = fake.add_media(OGG, "audio/ogg; codecs=opus", "")
            media = fake.media(media_id)
            assert media is not None
            body, headers = signed_webhook(
                SECRET, fake.inbound(audio_message_payload("111", media_id, sha256=media.sha256))
            )
            assert httpx.post(url, content=body, headers=headers).status_code == 200
            wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 1, 15, "the voice note queued")
            (row,) = rt.db.read("SELECT message, metadata FROM messages")
    assert row["message"] == '[voice note, transcribed: "meet me at the station"]'
    assert json.loads(str(row["metadata"]))[TRANSCRIPT_KEY] == "meet me at the station"
    (sent,) = stt.received
    assert (sent.data, sent.model, sent.content_type) == (OGG, "whisper-large-v3", "audio/ogg")
    assert sent.filename.endswith(".oga")
