"""The WhatsApp adapter in-process: inbound documents fetched from the Graph API and referenced in the
message; a stranger's document is not downloaded; signature checks over the raw body."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from adapters.whatsapp import valid_signature
from tests.channel_support import channel_home, count, open_home, wait_for, whatsapp_webhook
from tests.fakes.whatsapp_api import FakeWhatsApp, document_message_payload, signed_webhook

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SECRET = "s3cret"


def test_inbound_document_saved_and_referenced(tmp_path: Path) -> None:
    home = channel_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"whatsapp": {"allowlist": ["111"], "typing": False}}
    )
    rt = open_home(home)
    with FakeWhatsApp() as fake:
        try:
            with whatsapp_webhook(rt, fake, SECRET) as url:
                for sender in ("111", "222"):
                    media = fake.add_media(b"%PDF-1.4 fake", "application/pdf", "spec.pdf")
                    item = fake.media(media)
                    assert item is not None
                    payload = document_message_payload(
                        sender,
                        media,
                        filename="spec.pdf",
                        mime_type="application/pdf",
                        sha256=item.sha256,
                        caption="read",
                    )
                    body, headers = signed_webhook(SECRET, payload)
                    assert httpx.post(url, content=body, headers=headers).status_code == 200
                wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 1, 10, "the document message")
            message = rt.db.read_scalar("SELECT message FROM messages")
            downloads = [c for c in fake.calls if c.path.startswith("/download/")]
        finally:
            rt.close()
    assert message.startswith("read\n[file: ")
    saved = Path(message.split("[file: ")[1].rstrip("]"))
    assert saved.read_bytes() == b"%PDF-1.4 fake" and saved.name.endswith("spec.pdf")
    assert len(downloads) == 1  # the stranger (222) got a pairing code; their file was not fetched


def test_signature_is_checked_over_the_raw_bytes() -> None:
    body, headers = signed_webhook(SECRET, {"entry": [{"x": "é"}]})
    header = headers["X-Hub-Signature-256"]
    assert valid_signature(SECRET, body, header)
    assert not valid_signature(SECRET, body + b" ", header)  # same JSON, different bytes
    assert not valid_signature("other", body, header)
    assert not valid_signature(SECRET, body, None)
    assert not valid_signature(SECRET, body, header.removeprefix("sha256="))
