"""The WhatsApp adapter in-process against the fake Graph API and signed webhook posts: replies WhatsApp
refuses (131047) or reports failed later are marked failed with Meta's reason and the user is told when they
next write; a signed payload of a bad shape is acknowledged; webhooks never wait on media, and a failed
download is told while the message is still answered; a redelivery after pruning is not queued again; long
replies go as a text/plain file."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.whatsapp import WhatsAppChannel
from shared.chat.address import ChatAddress
from shared.reads.trace import trace_message
from shared.runtime import Runtime
from tests.channel_support import (
    RunningChannel,
    channel_home,
    count,
    free_port,
    open_home,
    wait_for,
    whatsapp_env,
    whatsapp_webhook,
)
from tests.fakes.whatsapp_api import (
    FakeWhatsApp,
    document_message_payload,
    signed_webhook,
    status_payload,
    text_message_payload,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SECRET = "s3cret"
ALICE = "15550001111"
SETTINGS = {
    "allowlist": [ALICE],
    "typing": False,
    "backoff_base_seconds": 0.05,
    "media_attempts": 2,
    "media_poll_seconds": 0.5,
}


class Harness:
    """A running WhatsApp adapter, its database and the fake Graph API."""

    def __init__(self, rt: Runtime, fake: FakeWhatsApp, port: int) -> None:
        self.rt, self.fake, self.port = rt, fake, port
        self.url = f"http://127.0.0.1:{port}/webhook"

    def post(self, payload: Any) -> httpx.Response:
        body, headers = signed_webhook(SECRET, payload)
        return httpx.post(self.url, content=body, headers=headers, timeout=30)

    def post_raw(self, body: bytes) -> httpx.Response:
        import hashlib
        import hmac

        digest = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        return httpx.post(self.url, content=body, headers={"X-Hub-Signature-256": f"sha256={digest}"})

    def texts(self) -> list[str]:
        return [s.text or "" for s in self.fake.sent if s.to == ALICE and s.type == "text"]

    def status(self, response_id: int) -> str:
        return str(self.rt.db.read_scalar("SELECT status FROM responses WHERE id = :id", {"id": response_id}))

    def messages(self) -> list[str]:
        return [str(r["message"]) for r in self.rt.db.read("SELECT message FROM messages ORDER BY id")]


@pytest.fixture
def wa(tmp_path: Path) -> Iterator[Harness]:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"whatsapp": SETTINGS})
    rt = open_home(home)
    port = free_port()
    with FakeWhatsApp() as fake:
        try:
            with whatsapp_webhook(rt, fake, SECRET, port):
                yield Harness(rt, fake, port)
        finally:
            rt.close()


def _notice(wa: Harness) -> str:
    return str(
        wait_for(
            lambda: next((t for t in wa.texts() if t.startswith("My reply to your message at ")), None),
            15,
            "the notice about the undelivered reply",
        )
    )


def test_reply_refused_with_131047_is_failed_and_the_user_told_when_they_write(wa: Harness) -> None:
    wa.fake.close_window(ALICE)
    reply = wa.rt.queue.responses.enqueue_response(
        ChatAddress("whatsapp", "Alice", conversation=ALICE), "the late answer"
    )
    wait_for(lambda: wa.status(reply.id) == "failed", 15, "the reply marked failed")
    last_error = wa.rt.db.read_scalar("SELECT last_error FROM responses WHERE id = :id", {"id": reply.id})
    assert "131047" in str(last_error) and "24 hours" in str(last_error)
    refused = [c for c in wa.fake.calls if c.path.endswith("/messages") and c.status == 400]
    assert len(refused) == 1  # refused for good: tried once, not 5 times over two minutes
    trace = trace_message(wa.rt.db, reply.message_id)
    assert "could not be delivered" in trace.verdict and "131047" in trace.verdict
    # The user writes again (the 24-hour window reopens): the note comes first, then the message is queued.
    wa.fake.open_window(ALICE)
    assert wa.post(text_message_payload(ALICE, "are you there?")).status_code == 200
    notice = _notice(wa)
    assert "(WhatsApp: more than 24 hours had passed since your last message" in notice
    assert notice.endswith(f"Send it again if you still need it. Ref: {reply.message_id}")
    assert wa.messages() == ["are you there?"]
    assert "the late answer" not in wa.texts()


def test_failed_status_callback_marks_a_sent_reply_failed(wa: Harness) -> None:
    reply = wa.rt.queue.responses.enqueue_response(
        ChatAddress("whatsapp", "Alice", conversation=ALICE), "an answer"
    )
    wait_for(lambda: wa.status(reply.id) == "acked", 15, "the reply sent")
    [sent] = [s for s in wa.fake.sent if s.text == "an answer"]
    # A receipt of another kind changes nothing; a "failed" one for our message marks the reply failed.
    assert wa.post(status_payload(sent.wamid, ALICE, "delivered")).status_code == 200
    assert wa.status(reply.id) == "acked"
    assert wa.post(status_payload(sent.wamid, ALICE, "failed")).status_code == 200
    assert wa.status(reply.id) == "failed"
    last_error = wa.rt.db.read_scalar("SELECT last_error FROM responses WHERE id = :id", {"id": reply.id})
    assert str(last_error).startswith("WhatsApp 131047: Re-engagement message")
    assert wa.post(text_message_payload(ALICE, "hello")).status_code == 200
    assert f"Ref: {reply.message_id}" in _notice(wa)


def test_signed_payloads_of_a_bad_shape_are_acknowledged(wa: Harness) -> None:
    good = {"from": ALICE, "id": "wamid.GOOD1", "type": "text", "text": {"body": "still queued"}}
    odd: list[Any] = [
        {"entry": 5},
        [1, 2],
        {"entry": [{"changes": 7}]},
        {"entry": [{"changes": [{"value": {"messages": [5, {"from": ALICE, "type": "text"}, good]}}]}]},
        {"entry": [{"changes": [{"value": {"statuses": [{"id": 5, "status": "failed", "errors": "x"}]}}]}]},
    ]
    for payload in odd:
        answer = wa.post(payload)
        assert answer.status_code == 200, (payload, answer.status_code, answer.text)
    assert wa.post_raw(b"not json at all").status_code == 200
    assert wa.messages() == ["still queued"]  # the well-formed message beside the odd ones


def _document_and_text(fake: FakeWhatsApp, media_id: str, text_wamid: str) -> dict[str, Any]:
    item = fake.media(media_id)
    assert item is not None
    payload = document_message_payload(
        ALICE, media_id, filename="spec.pdf", mime_type="application/pdf", sha256=item.sha256, caption="read"
    )
    text = text_message_payload(ALICE, "and this", wamid=text_wamid)["entry"][0]["changes"][0]["value"]
    payload["entry"][0]["changes"][0]["value"]["messages"].append(text["messages"][0])
    return payload


def test_webhooks_never_wait_on_media(wa: Harness) -> None:
    wa.fake.media_delay = 3.0
    media = wa.fake.add_media(b"%PDF-1.4 slow", "application/pdf", "spec.pdf")
    started = time.monotonic()
    answer = wa.post(_document_and_text(wa.fake, media, "wamid.TXT1"))
    took = time.monotonic() - started
    assert answer.status_code == 200 and took < 1.5, took
    assert wa.messages() == ["and this"]  # the text of the same POST is queued at once
    wait_for(lambda: len(wa.messages()) == 2, 20, "the document message once fetched")
    document = wa.messages()[1]
    assert document.startswith("read\n[file: ")
    assert Path(document.split("[file: ")[1].rstrip("]")).read_bytes() == b"%PDF-1.4 slow"


def test_a_failed_download_is_told_and_the_message_still_answered(wa: Harness) -> None:
    media = wa.fake.add_media(b"%PDF-1.4 broken", "application/pdf", "spec.pdf")
    wa.fake.fail_media(media, 500)
    answer = wa.post(_document_and_text(wa.fake, media, "wamid.TXT2"))
    assert answer.status_code == 200
    assert wa.messages() == ["and this"]
    wait_for(lambda: len(wa.messages()) == 2, 20, "the document message passed on without its file")
    assert wa.messages()[1] == "read\n(The user sent spec.pdf, but it could not be downloaded.)"
    told = wait_for(lambda: [t for t in wa.texts() if t.startswith("I could not fetch the file")], 15, "told")
    assert "spec.pdf" in told[0]
    # A redelivery of the same POST queues nothing more.
    assert wa.post(_document_and_text(wa.fake, media, "wamid.TXT2")).status_code == 200
    time.sleep(1.0)  # give a wrongly started second job the time to show (a negative check)
    assert len(wa.messages()) == 2


def test_a_redelivery_after_pruning_is_not_queued_again(wa: Harness) -> None:
    payload = text_message_payload(ALICE, "once only", wamid="wamid.ONCE1")
    assert wa.post(payload).status_code == 200
    queue = wa.rt.queue
    # A lone message of a quiet chat is claimable at once (no debounce); a worker takes and completes it.
    [claimed] = wait_for(
        lambda: queue.messages.claim_all_pending_messages("alpha", "w1"), 10, "the message claimed"
    )
    queue.messages.complete_messages([claimed.message_id], "w1", "done")
    # The scheduler's pruning (completed rows past their age: none kept here) removes the row.
    wait_for(
        lambda: queue.admin.prune(completed_older_ms=0, acked_older_ms=10**12)["messages"] == 1,
        5,
        "the row pruned",
    )
    assert count(wa.rt, "SELECT COUNT(*) FROM messages") == 0
    assert wa.post(payload).status_code == 200  # Meta redelivers days later
    assert count(wa.rt, "SELECT COUNT(*) FROM messages") == 0


def test_a_long_reply_goes_as_a_text_file_whatsapp_accepts(wa: Harness) -> None:
    long_text = "\n\n".join(f"part {i} " + "word " * 800 for i in range(6))
    reply = wa.rt.queue.responses.enqueue_response(
        ChatAddress("whatsapp", "Alice", conversation=ALICE), long_text
    )
    wait_for(lambda: wa.status(reply.id) in ("acked", "failed"), 20, "the long reply")
    assert wa.status(reply.id) == "acked"
    [document] = [s for s in wa.fake.sent if s.type == "document"]
    assert document.document is not None and str(document.document["filename"]).endswith(".txt")
    media = wa.fake.media(str(document.document["id"]))
    assert media is not None and media.mime_type == "text/plain"
    assert media.data.decode().strip() == long_text.strip()
    assert json.dumps(document.body)  # a well-formed send


def test_a_media_job_outlives_the_adapter(tmp_path: Path) -> None:
    """The webhook was answered before the download; the adapter stops mid-download; the next one fetches
    the file and queues the message (Meta will not send it again)."""
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"whatsapp": SETTINGS})
    rt = open_home(home)
    port = free_port()
    with FakeWhatsApp() as fake:
        env = whatsapp_env(fake, SECRET, port)
        try:
            fake.media_delay = 4.0
            media = fake.add_media(b"%PDF-1.4 later", "application/pdf", "spec.pdf")
            with whatsapp_webhook(rt, fake, SECRET, port):
                harness = Harness(rt, fake, port)
                assert harness.post(_document_and_text(fake, media, "wamid.TXT3")).status_code == 200
                wait_for(lambda: any(c.path.startswith("/v") for c in fake.calls), 10, "the download begun")
            assert harness.messages() == ["and this"]  # stopped mid-download: the document is not queued yet
            fake.media_delay = 0.0
            with RunningChannel(WhatsAppChannel(rt, env=env)):
                wait_for(lambda: len(harness.messages()) == 2, 15, "the document queued by the next adapter")
            assert harness.messages()[1].startswith("read\n[file: ")
        finally:
            rt.close()


def test_one_chats_throughput_backoff_does_not_delay_another_chat(tmp_path: Path) -> None:
    bob = "15550002222"
    settings = {
        **SETTINGS,
        "allowlist": [ALICE, bob],
        "backoff_base_seconds": 1.0,
        "backoff_max_seconds": 8.0,
    }
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"whatsapp": settings})
    rt = open_home(home)
    with FakeWhatsApp() as fake:
        env = whatsapp_env(fake, SECRET, free_port())
        fake.throttle_recipient(ALICE, times=3)  # Alice's chat backs off ~1 + 2 + 4 s
        try:
            with RunningChannel(WhatsAppChannel(rt, env=env), deliver_only=True):
                rt.queue.responses.enqueue_response(
                    ChatAddress("whatsapp", "Alice", conversation=ALICE), "to alice"
                )
                wait_for(lambda: any(c.status == 400 for c in fake.calls), 10, "Alice's chat throttled")
                started = time.monotonic()
                rt.queue.responses.enqueue_response(
                    ChatAddress("whatsapp", "Bob", conversation=bob), "to bob"
                )
                sent = fake.wait_for(lambda s: s.to == bob, 10)
                latency = sent.at - started
                alice_early = [s for s in fake.sent if s.to == ALICE]
                fake.wait_for(lambda s: s.to == ALICE, 30)
        finally:
            rt.close()
    assert latency < 1.5, f"Bob waited {latency:.1f} s for Alice's backoff"
    assert alice_early == []  # Alice's reply was still backing off when Bob got his
