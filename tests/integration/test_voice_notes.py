"""Voice notes on WhatsApp and Discord, with the adapters in-process against their platform fakes and the
fake speech-to-text service: the recording is fetched, heard, and queued as its words (the ``[voice]``
section of settings.toml names the service); an image beside it is noted for the model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from adapters.discord import DiscordChannel
from shared.inbound_media import IMAGES_KEY, TRANSCRIPT_KEY
from tests.channel_support import RunningChannel, count, discord_env, open_home, wait_for, whatsapp_webhook
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.transcribe_api import FakeTranscriber
from tests.fakes.whatsapp_api import FakeWhatsApp, audio_message_payload, signed_webhook
from tests.files_in_support import PNG
from tests.liveness_support import claude_home

pytestmark = pytest.mark.integration

SECRET = "app-secret-for-tests"
OGG = b"OggS" + bytes(40) + b"whatsapp-voice"


def _voice_settings(home: Path, url: str, more: str = "") -> None:
    """Name the speech-to-text service in the home's settings.toml (its ``[voice]`` section)."""
    with (home / "settings.toml").open("a") as settings:
        settings.write(f'\n[voice]\napi_url = "{url}"\n{more}')


def test_a_whatsapp_voice_note_is_queued_as_its_words(tmp_path: Path) -> None:
    channels = {"whatsapp": {"allowlist": ["111"], "typing": False, "media_poll_seconds": 0.5}}
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=channels)
    with FakeTranscriber("meet me at the station") as stt, FakeWhatsApp() as fake:
        _voice_settings(home, stt.base_url, 'model = "whisper-large-v3"\n')
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


def test_a_discord_voice_message_is_queued_as_its_words_and_an_image_is_noted(tmp_path: Path) -> None:
    alice, dm = 5001, 7001
    channels = {"discord": {"allowlist": [str(alice)], "guild_ready_timeout_seconds": 0.1, "typing": False}}
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=channels)
    with FakeTranscriber("ship it on friday") as stt, FakeDiscord(heartbeat_interval_ms=5_000) as fake:
        _voice_settings(home, stt.base_url)
        with open_home(home) as rt, RunningChannel(DiscordChannel(rt, env=discord_env(fake))):
            wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
            # Discord names a voice message's file itself; the content type is what says it is audio.
            fake.push_message(dm, "", alice, "alice", attachments=[("voice-message", OGG, "audio/ogg")])
            fake.push_message(
                dm, "and this chart", alice, "alice", attachments=[("chart.png", PNG, "image/png")]
            )
            wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 2, 15, "both messages queued")
            rows = {
                str(r["message"]).split("\n")[0]: r
                for r in rt.db.read("SELECT message, metadata FROM messages")
            }
    voice = rows['[voice note, transcribed: "ship it on friday"]']
    assert json.loads(str(voice["metadata"]))[TRANSCRIPT_KEY] == "ship it on friday"
    (sent,) = stt.received
    assert sent.data == OGG and sent.filename.endswith("voice-message.oga")
    chart = rows["and this chart"]
    (image,) = json.loads(str(chart["metadata"]))[IMAGES_KEY]
    assert image.endswith("-chart.png") and f"[file: {image}] (an image, image/png" in str(chart["message"])
