"""Files a chat user sends: which are shown to the model as images, which are recordings, what the agent's
text says of each (shared/inbound_media.py), and the image blocks a run gives claude
(workers/prompt_images.py)."""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path

import pytest

from shared.inbound_media import IMAGES_KEY, MAX_IMAGE_BYTES, describe_files, is_recording, sniff_image
from shared.settings.model import SettingsError, load_settings
from tests.files_in_support import PNG, PNG_B64
from tests.homes import write_settings
from tests.queued import claimed_message
from workers.prompt_images import images_of, user_content

pytestmark = pytest.mark.unit


def test_images_are_known_by_their_bytes_not_their_names(tmp_path: Path) -> None:
    assert sniff_image(PNG[:16]) == "image/png"
    assert sniff_image(b"\xff\xd8\xff\xe0" + bytes(12)) == "image/jpeg"
    assert sniff_image(b"GIF89a" + bytes(10)) == "image/gif"
    assert sniff_image(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert sniff_image(b"II*\x00" + bytes(12)) is None  # a TIFF: the model cannot take it
    png_named_jpg = tmp_path / "photo.jpg"
    png_named_jpg.write_bytes(PNG)
    refs, images = describe_files([png_named_jpg])
    assert images == [str(png_named_jpg)]
    assert refs == [f"[file: {png_named_jpg}] (an image, image/png: shown to you with this message)"]


def test_a_large_or_unreadable_image_stays_a_file_and_the_agent_is_told_why(tmp_path: Path) -> None:
    big = tmp_path / "big.png"
    big.write_bytes(PNG + bytes(MAX_IMAGE_BYTES))
    tiff = tmp_path / "scan.tiff"
    tiff.write_bytes(b"II*\x00" + bytes(100))
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    refs, images = describe_files([big, tiff, notes])
    assert images == []
    assert "too large to show you" in refs[0] and "open the file" in refs[0]
    assert "a type you cannot be shown" in refs[1]
    assert refs[2] == f"[file: {notes}]"


def test_recordings_are_known_by_their_names() -> None:
    for name in ("voice.ogg", "audio.oga", "voice-message.ogg", "song.mp3", "memo.m4a", "a.wav", "x.opus"):
        assert is_recording(Path(name)), name
    for name in ("photo.jpg", "notes.txt", "clip.mp4", "file"):
        assert not is_recording(Path(name)), name


def test_a_run_shows_the_images_its_messages_carry_before_the_prompt_text(tmp_path: Path) -> None:
    shown = tmp_path / "a.png"
    shown.write_bytes(PNG)
    gone = tmp_path / "gone.png"
    message = replace(claimed_message(), metadata={IMAGES_KEY: [str(shown), str(gone)]})
    images = images_of([message, claimed_message()])
    assert [(i.media_type, i.data) for i in images] == [("image/png", PNG_B64)]
    content = user_content("what is this?", images)
    assert content == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
        {"type": "text", "text": "what is this?"},
    ]
    assert user_content("plain", ()) == "plain"
    assert base64.b64decode(images[0].data) == PNG


def test_the_voice_section_is_checked(tmp_path: Path) -> None:
    write_settings(tmp_path, '[voice]\napi_url = "https://stt.example/v1/"\nmodel = "whisper-large-v3"\n')
    voice = load_settings(tmp_path, env={}).voice
    assert (voice.api_url, voice.model, voice.timeout_seconds) == (
        "https://stt.example/v1",
        "whisper-large-v3",
        30,
    )
    write_settings(tmp_path, '[voice]\napi_url = "stt.example"\ntimeout = 3\n')
    with pytest.raises(SettingsError) as caught:
        load_settings(tmp_path, env={})
    assert "voice.api_url: Value error, must start with http:// or https://" in str(caught.value)
    assert "voice.timeout: unknown key" in str(caught.value)
