"""WhatsApp read receipts and the typing indicator (the real adapter against the fake Graph API).

A message taken in is marked read (``{"status": "read", "message_id": WAMID}``), with
``"typing_indicator": {"type": "text"}`` when an agent will answer it; the indicator is renewed on the
chat's newest waiting message while the run goes on and stops once the reply is done. Commands and pairing
codes get a plain read receipt; with ``read_receipts = false`` nothing is marked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.runtime import Runtime
from tests.channel_support import channel_home, count, open_home, wait_for, whatsapp_webhook
from tests.fakes.whatsapp_api import FakeWhatsApp, ReadReceipt, signed_webhook, text_message_payload
from tests.processor_support import run_idle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SECRET = "s3cret"


@contextmanager
def _running(tmp_path: Path, settings: Mapping[str, Any]) -> Iterator[tuple[Runtime, FakeWhatsApp, str]]:
    home = channel_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        {"whatsapp": {"allowlist": ["111"], **settings}},
        queue={"debounce_ms": 0},
    )
    with FakeWhatsApp() as fake, open_home(home) as rt, whatsapp_webhook(rt, fake, SECRET) as url:
        yield rt, fake, url


def _send(fake: FakeWhatsApp, url: str, sender: str, text: str) -> str:
    payload = fake.inbound(text_message_payload(sender, text))
    wamid = str(payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"])
    body, headers = signed_webhook(SECRET, payload)
    assert httpx.post(url, content=body, headers=headers).status_code == 200
    return wamid


def _of(fake: FakeWhatsApp, wamid: str) -> list[ReadReceipt]:
    return [r for r in fake.reads if r.message_id == wamid]


def test_queued_message_is_read_with_typing_renewed_until_the_reply(tmp_path: Path) -> None:
    with _running(tmp_path, {"typing_interval_seconds": 0.4}) as (rt, fake, url):
        wamid = _send(fake, url, "111", "hello there")
        first = fake.wait_for_read(lambda r: r.message_id == wamid, 5)
        assert first.typing == "text"
        # Nothing answers yet: the indicator is renewed on the waiting message.
        wait_for(lambda: len(_of(fake, wamid)) >= 3, 10, "the typing indicator renewed")
        assert all(r.typing == "text" for r in _of(fake, wamid))

        # A newer message of the chat takes the indicator over.
        newer = _send(fake, url, "111", "and one more thing")
        wait_for(lambda: len(_of(fake, newer)) >= 2, 10, "typing on the newest message")

        run_idle(rt)  # the scripted agent answers both
        fake.wait_for(lambda s: s.to == "111" and "got:" in (s.text or ""), 10)
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'acked'") >= 1, 10, "ack")
        time.sleep(0.5)  # a renewal already in flight when the run ended
        settled = len(fake.reads)
        time.sleep(1.5)  # three typing intervals: nothing is waiting, so no renewal
        assert len(fake.reads) == settled, fake.reads[settled:]


def test_commands_and_pairing_codes_are_read_without_typing(tmp_path: Path) -> None:
    with _running(tmp_path, {}) as (rt, fake, url):
        help_wamid = _send(fake, url, "111", "/help")
        stranger = _send(fake, url, "222", "who are you")
        assert fake.wait_for_read(lambda r: r.message_id == help_wamid, 5).typing is None
        assert fake.wait_for_read(lambda r: r.message_id == stranger, 5).typing is None
        assert count(rt, "SELECT COUNT(*) FROM messages") == 0


def test_read_receipts_can_be_turned_off(tmp_path: Path) -> None:
    with _running(tmp_path, {"read_receipts": False, "typing_interval_seconds": 0.2}) as (rt, fake, url):
        _send(fake, url, "111", "hello there")
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 1, 5, "the message queued")
        time.sleep(1.0)  # several typing intervals
        assert fake.reads == []
