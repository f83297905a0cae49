"""Files users send reach the agent: an image and a text document sent on Telegram and on WhatsApp (the real
adapters against the platform fakes) are read by the real Claude Code CLI in that chat's run.

The fake Messages API scripts the model (:func:`tests.files_in_support.reader`): it calls the CLI's ``Read``
tool on each ``[file: …]`` path of the prompt and answers with what the tool gave back. The test then checks
what the fake API received in the ``tool_result``: the document's text and the PNG as an image block, not
the CLI's "requested permissions to read" refusal it gave before the chat's upload folder was passed on.
A file of another chat stays unreadable.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adapters.telegram import TelegramChannel
from shared.chat.address import ChatAddress
from shared.file_access import chat_upload_dir
from tests.channel_support import (
    HoldingTelegram,
    RunningChannel,
    count,
    open_home,
    wait_for,
    whatsapp_webhook,
)
from tests.fakes.anthropic_api import Computed, FakeAnthropic, tool_images, tool_result_text, tool_results
from tests.fakes.whatsapp_api import (
    FakeWhatsApp,
    WhatsAppSent,
    document_message_payload,
    image_message_payload,
    signed_webhook,
)
from tests.files_in_support import DOC, PNG, PNG_B64, read_outcomes, reader
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env
from tests.processor_support import run_idle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = "s3cret"


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(default=Computed(reader)) as fake:
        yield fake


def _check_reads(api: FakeAnthropic) -> None:
    """The fake API saw the CLI read both files successfully: the text, and the PNG as an image block."""
    outcomes = read_outcomes(api.main_requests())
    assert len(outcomes) == 2, outcomes
    by_text = {tool_result_text(o): o for o in outcomes}
    assert not [o for o in outcomes if o.get("is_error")], outcomes
    assert all("requested permissions" not in text for text in by_text), outcomes
    doc = [o for text, o in by_text.items() if "PELICAN-7" in text]
    assert len(doc) == 1, outcomes
    images = [image for o in outcomes for image in tool_images(o)]
    assert [(i["media_type"], i["data"]) for i in images] == [("image/png", PNG_B64)]


def test_telegram_document_and_image_are_read_by_the_agent(
    tmp_path: Path, api: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    channels = {"telegram": {"allowlist": ["42", "43"], "poll_timeout_seconds": 1, "typing": False}}
    home = claude_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=channels, queue={"debounce_ms": 0}
    )
    with HoldingTelegram() as fake, open_home(home) as rt:
        # Another chat's upload: a run for chat 42 must not be able to read it.
        other = chat_upload_dir(rt.settings, ChatAddress("telegram", conversation="99"))
        other.mkdir(parents=True)
        (other / "private.txt").write_text("not yours")
        env = {"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url}
        with RunningChannel(TelegramChannel(rt, env=env)):
            fake.push_document(42, "notes.txt", DOC, mime_type="text/plain", caption="what does this say?")
            fake.push_document(43, "chart.png", PNG, mime_type="image/png", caption="what is in the picture?")
            wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 2, 15, "both messages queued")
            run_idle(rt, env=cli_env(api, tmp_path))
            # The final replies (a live preview may show first, and be edited into the final).
            wait_for(
                lambda: all(any("READ" in t for t in fake.shown(c)) for c in (42, 43)), 20, "both replies"
            )
            reply_42, reply_43 = fake.shown(42)[-1], fake.shown(43)[-1]
            _check_reads(api)
            assert "READ OK" in reply_42 and "PELICAN-7" in reply_42
            assert reply_43.startswith("READ OK") and "image/png" in reply_43

            # The same scripted model asked to read another chat's upload from chat 42: refused.
            api.clear()
            rt.queue.intake.enqueue_message(
                ChatAddress("telegram", "alice", sender_id="42", conversation="42"),
                f"and this?\n[file: {other / 'private.txt'}]",
            )
            run_idle(rt, env=cli_env(api, tmp_path))
            (refused,) = tool_results(api.main_requests()[-1].body)  # this run's read (not the resumed ones)
            assert refused.get("is_error") and "requested permissions" in tool_result_text(refused)
            wait_for(lambda: any("READ FAILED" in t for t in fake.shown(42)), 20, "the refusal reply")


def test_whatsapp_document_and_image_are_read_by_the_agent(tmp_path: Path, api: FakeAnthropic) -> None:
    channels = {"whatsapp": {"allowlist": ["111", "112"], "typing": False, "media_poll_seconds": 0.5}}
    home = claude_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=channels, queue={"debounce_ms": 0}
    )
    with FakeWhatsApp() as fake, open_home(home) as rt, whatsapp_webhook(rt, fake, SECRET) as url:
        doc_id = fake.add_media(DOC, "text/plain", "notes.txt")
        image_id = fake.add_media(PNG, "image/png", "")
        payloads = [
            document_message_payload(
                "111", doc_id, filename="notes.txt", mime_type="text/plain", sha256=_sha(fake, doc_id)
            ),
            image_message_payload("112", image_id, sha256=_sha(fake, image_id), caption="what is this?"),
        ]
        for payload in payloads:
            body, headers = signed_webhook(SECRET, fake.inbound(payload))
            assert httpx.post(url, content=body, headers=headers).status_code == 200
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 2, 15, "both messages queued")
        run_idle(rt, env=cli_env(api, tmp_path))
        replies = {to: _reply_to(fake, to) for to in ("111", "112")}
    _check_reads(api)
    assert replies["111"].startswith("READ OK") and "PELICAN-7" in replies["111"]
    assert replies["112"].startswith("READ OK") and "image/png" in replies["112"]


def _reply_to(fake: FakeWhatsApp, to: str) -> str:
    def answered(sent: WhatsAppSent) -> bool:
        return sent.to == to and "READ" in (sent.text or "")

    return fake.wait_for(answered, 20).text or ""


def _sha(fake: FakeWhatsApp, media_id: str) -> str:
    media = fake.media(media_id)
    assert media is not None
    return media.sha256


def test_a_home_with_a_space_still_lets_the_agent_read_uploads(tmp_path: Path, api: FakeAnthropic) -> None:
    base = tmp_path / "my agentpost"
    base.mkdir()
    home = claude_home(base, f"sqlite:///{tmp_path / 'a.db'}", queue={"debounce_ms": 0})
    with open_home(home) as rt:
        folder = chat_upload_dir(rt.settings, ChatAddress("telegram", conversation="42"))
        folder.mkdir(parents=True)
        (folder / "notes.txt").write_bytes(DOC)
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "alice", sender_id="42", conversation="42"),
            f"read it\n[file: {folder / 'notes.txt'}]",
        )
        run_idle(rt, env=cli_env(api, tmp_path))
        (reply,) = [str(r["message"]) for r in rt.db.read("SELECT message FROM responses")]
    (result,) = tool_results(api.main_requests()[-1].body)
    assert not result.get("is_error") and "PELICAN-7" in tool_result_text(result), result
    assert reply.startswith("READ OK") and "PELICAN-7" in reply


def test_telegram_photo_is_read_by_the_agent(
    tmp_path: Path, api: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    channels = {"telegram": {"allowlist": ["44"], "poll_timeout_seconds": 1, "typing": False}}
    home = claude_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=channels, queue={"debounce_ms": 0}
    )
    with HoldingTelegram() as fake, open_home(home) as rt:
        env = {"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url}
        with RunningChannel(TelegramChannel(rt, env=env)):
            fake.push_photo(44, PNG, caption="what is this?")
            wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 1, 15, "the photo message")
            run_idle(rt, env=cli_env(api, tmp_path))
            # The final reply, not the first text the chat shows (a preview of it, a progress note).
            wait_for(lambda: any(t.startswith("READ OK") for t in fake.shown(44)), 20, "the reply")
    (result,) = read_outcomes(api.main_requests())
    assert not result.get("is_error"), tool_result_text(result)
    assert [i["data"] for i in tool_images(result)] == [PNG_B64]  # the photo's bytes reached the model
    assert fake.shown(44)[-1].startswith("READ OK")
