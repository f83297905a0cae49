"""The WhatsApp adapter in-process: inbound documents fetched from the Graph API and referenced in the
message; a stranger's document is not downloaded; signature checks over the raw body."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from adapters.whatsapp import WhatsAppChannel, valid_signature
from tests.channel_support import RunningChannel, channel_home, count, free_port, open_home, wait_for
from tests.fakes.whatsapp_api import FakeWhatsApp, document_message_payload, signed_webhook

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SECRET = "s3cret"


def test_inbound_document_saved_and_referenced(tmp_path: Path) -> None:
    home = channel_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"whatsapp": {"allowlist": ["111"], "typing": False}}
    )
    rt = open_home(home)
    port = free_port()
    with FakeWhatsApp() as fake:
        env = {
            "WHATSAPP_ACCESS_TOKEN": fake.access_token,
            "WHATSAPP_PHONE_NUMBER_ID": fake.phone_number_id,
            "WHATSAPP_APP_SECRET": SECRET,
            "WHATSAPP_VERIFY_TOKEN": "v",
            "WHATSAPP_GRAPH_URL": fake.graph_url,
            "WHATSAPP_WEBHOOK_PORT": str(port),
        }
        try:
            with RunningChannel(WhatsAppChannel(rt, env=env)):
                url = f"http://127.0.0.1:{port}/webhook"
                wait_for(lambda: _up(url), 10, "the webhook")
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


def _up(url: str) -> bool:
    try:
        return httpx.get(url).status_code == 403
    except httpx.HTTPError:
        return False


def test_signature_is_checked_over_the_raw_bytes() -> None:
    body, headers = signed_webhook(SECRET, {"entry": [{"x": "é"}]})
    header = headers["X-Hub-Signature-256"]
    assert valid_signature(SECRET, body, header)
    assert not valid_signature(SECRET, body + b" ", header)  # same JSON, different bytes
    assert not valid_signature("other", body, header)
    assert not valid_signature(SECRET, body, None)
    assert not valid_signature(SECRET, body, header.removeprefix("sha256="))
