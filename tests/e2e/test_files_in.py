"""Files in, with real processes: ``agentpost run telegram``, ``agentpost run whatsapp`` and ``agentpost run
processor`` (the real Claude Code CLI against the fake Messages API). A document and a PNG sent on Telegram,
and an image sent on WhatsApp, are read by the agent: the fake API sees the CLI's ``Read`` of each succeed
(the text, the image block with the PNG's bytes), and each chat gets the reply. While the WhatsApp message
waits and runs, it is marked read with the typing indicator.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.channel_support import (
    HoldingTelegram,
    Proc,
    count,
    free_port,
    open_home,
    telegram_env,
    wait_for,
    whatsapp_env,
)
from tests.fakes.anthropic_api import Computed, FakeAnthropic, tool_images, tool_result_text
from tests.fakes.whatsapp_api import FakeWhatsApp, image_message_payload, signed_webhook
from tests.files_in_support import DOC, PNG, PNG_B64, read_outcomes, reader
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

SECRET = "app-secret-for-tests"
ALICE = "15550001111"


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(default=Computed(reader)) as fake:
        yield fake


def test_files_sent_on_telegram_and_whatsapp_are_read_by_the_agent(
    tmp_path: Path, api: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    channels = {
        "telegram": {"allowlist": ["42", "43"], "poll_timeout_seconds": 1},
        "whatsapp": {"allowlist": [ALICE], "media_poll_seconds": 0.5},
    }
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=channels)
    port = free_port()
    with HoldingTelegram() as telegram, FakeWhatsApp() as whatsapp, open_home(home) as rt:
        wa_env = whatsapp_env(whatsapp, SECRET, port)
        procs = [
            Proc("telegram", home, telegram_env(telegram), tmp_path / "telegram.log"),
            Proc("whatsapp", home, wa_env, tmp_path / "whatsapp.log"),
        ]
        try:
            procs[1].wait_output("webhook listening")
            telegram.push_document(42, "notes.txt", DOC, mime_type="text/plain", caption="summarise this")
            telegram.push_document(43, "chart.png", PNG, mime_type="image/png", caption="what do you see?")
            image = whatsapp.add_media(PNG, "image/png")
            media = whatsapp.media(image)
            assert media is not None
            payload = whatsapp.inbound(
                image_message_payload(ALICE, image, sha256=media.sha256, caption="and this?")
            )
            wamid = str(payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"])
            body, headers = signed_webhook(SECRET, payload)
            assert (
                httpx.post(f"http://127.0.0.1:{port}/webhook", content=body, headers=headers).status_code
                == 200
            )
            wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 3, 20, "all three messages queued")
            # Taken in: read, with "typing…" while it waits for the agent.
            assert whatsapp.wait_for_read(lambda r: r.message_id == wamid, 10).typing == "text"
            procs.append(Proc("processor", home, cli_env(api, tmp_path), tmp_path / "processor.log"))
            # The final replies, not the first text each chat shows (a preview of the reply, a progress note).
            wait_for(
                lambda: all(any(t.startswith("READ OK") for t in telegram.shown(c)) for c in (42, 43)),
                60,
                "both Telegram replies",
            )
            reply = whatsapp.wait_for(lambda s: s.to == ALICE and "READ" in (s.text or ""), 30).text or ""
        finally:
            for proc in procs:
                proc.stop()
    outcomes = read_outcomes(api.main_requests())
    assert len(outcomes) == 3, outcomes
    assert not [o for o in outcomes if o.get("is_error")], [tool_result_text(o) for o in outcomes]
    assert ["PELICAN-7" in tool_result_text(o) for o in outcomes].count(True) == 1
    images = [i for o in outcomes for i in tool_images(o)]
    assert [(i["media_type"], i["data"]) for i in images] == [("image/png", PNG_B64)] * 2
    assert telegram.shown(42)[-1].startswith("READ OK") and "PELICAN-7" in telegram.shown(42)[-1]
    assert telegram.shown(43)[-1].startswith("READ OK") and "image/png" in telegram.shown(43)[-1]
    assert reply.startswith("READ OK") and "image/png" in reply
