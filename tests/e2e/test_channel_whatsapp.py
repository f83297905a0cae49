"""The WhatsApp adapter as a real process (``agentpost run whatsapp``): signed webhook posts in, the fake
Graph API out, a real processor in between; forged posts refused; two instances never send one reply twice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.chat.address import ChatAddress
from tests.channel_support import Proc, channel_home, count, free_port, open_home, wait_for, whatsapp_env
from tests.fakes.whatsapp_api import (
    FakeWhatsApp,
    signed_webhook,
    status_payload,
    text_message_payload,
    verification_params,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

SECRET = "app-secret-for-tests"
VERIFY = "verify-me"
ALICE, BOB = "15550001111", "15550002222"


@pytest.fixture
def fake() -> Iterator[FakeWhatsApp]:
    with FakeWhatsApp() as server:
        yield server


def _env(fake: FakeWhatsApp, port: int) -> dict[str, str]:
    return whatsapp_env(fake, SECRET, port, verify=VERIFY)


def _post(port: int, payload: dict[str, object], secret: str = SECRET) -> httpx.Response:
    body, headers = signed_webhook(secret, payload)
    return httpx.post(f"http://127.0.0.1:{port}/webhook", content=body, headers=headers, timeout=10)


def _texts(fake: FakeWhatsApp, to: str) -> list[str]:
    return [s.text or "" for s in fake.sent if s.to == to and s.type == "text"]


CHANNELS = {"whatsapp": {"allowlist": [ALICE, BOB], "backoff_base_seconds": 0.05}}


def test_webhook_roundtrip_forgery_receipts_and_backoff(tmp_path: Path, fake: FakeWhatsApp) -> None:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", CHANNELS)
    port = free_port()
    adapter = Proc("whatsapp", home, _env(fake, port), tmp_path / "whatsapp.log")
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    rt = open_home(home)
    try:
        adapter.wait_output("webhook listening")
        url = f"http://127.0.0.1:{port}/webhook"
        assert httpx.get(url, params=verification_params(VERIFY, "4242")).text == "4242"
        assert httpx.get(url, params=verification_params("wrong", "4242")).status_code == 403
        # A forged post (wrong secret) and an unsigned one are refused and queue nothing.
        forged = _post(port, text_message_payload(ALICE, "forged long=20"), secret="not-the-secret")
        assert forged.status_code == 403
        body = json.dumps(text_message_payload(ALICE, "unsigned")).encode()
        unsigned = httpx.post(url, content=body, headers={"Content-Type": "application/json"})
        assert unsigned.status_code == 403
        assert count(rt, "SELECT COUNT(*) FROM messages") == 0
        # A receipt is ignored; a real message is queued once even when Meta redelivers it.
        assert _post(port, status_payload("wamid.OLD", ALICE)).status_code == 200
        fake.throttle_next(130429, times=2)  # the first sends hit the throughput limit and back off
        first = text_message_payload(ALICE, "hello long=15", wamid="wamid.AAA1")
        assert _post(port, first).status_code == 200
        assert _post(port, first).status_code == 200
        assert (
            _post(port, text_message_payload(BOB, "give file=a.txt", wamid="wamid.BBB1")).status_code == 200
        )
        wait_for(lambda: any("[end 15]" in t for t in _texts(fake, ALICE)), 40, "the long reply to Alice")
        wait_for(lambda: any(s.to == BOB and s.type == "document" for s in fake.sent), 30, "Bob's document")
        stored = rt.db.read("SELECT message, sender_id, external_id FROM messages ORDER BY id")
    finally:
        rt.close()
        adapter.stop()
        processor.stop()
    assert [(r["message"], r["external_id"]) for r in stored] == [
        ("hello long=15", "wamid.AAA1"),
        ("give file=a.txt", "wamid.BBB1"),
    ]
    texts = _texts(fake, ALICE)
    assert len(texts) == 2 and all(len(t) <= 4096 for t in texts)
    assert sum(1 for c in fake.calls if c.status == 400) == 2  # two throttled attempts, then success
    document = next(s for s in fake.sent if s.type == "document")
    media = fake.media(str(document.document["id"])) if document.document else None
    assert media is not None and media.filename == "a.txt" and media.data == b"file a.txt made by alpha\n"
    assert all("forged" not in t for s in fake.sent for t in [s.text or ""])


def test_killed_before_enqueue_then_redelivered(tmp_path: Path, fake: FakeWhatsApp) -> None:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", CHANNELS)
    port = free_port()
    log = tmp_path / "whatsapp.log"
    adapter = Proc("whatsapp", home, {**_env(fake, port), "AGENTPOST_TEST_PAUSE_AFTER_FETCH": "60"}, log)
    rt = open_home(home)
    try:
        adapter.wait_output("webhook listening")
        payload = text_message_payload(ALICE, "keep me", wamid="wamid.KEEP")
        body, headers = signed_webhook(SECRET, payload)
        with httpx.Client() as client:
            import threading

            outcome: list[object] = []

            def post() -> None:
                try:
                    outcome.append(
                        client.post(
                            f"http://127.0.0.1:{port}/webhook", content=body, headers=headers, timeout=30
                        )
                    )
                except httpx.HTTPError as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=post)
            thread.start()
            adapter.wait_output("test hook: paused")
            adapter.kill()
            thread.join(10)
        assert outcome and isinstance(outcome[0], httpx.HTTPError)  # never acknowledged: Meta redelivers
        assert count(rt, "SELECT COUNT(*) FROM messages") == 0
        restarted = Proc("whatsapp", home, _env(fake, port), log)
        try:
            restarted.wait_output("webhook listening", 60)
            wait_for(lambda: "webhook listening" in restarted.output().split("test hook")[-1], 20, "restart")
            assert _post(port, payload).status_code == 200
            assert _post(port, payload).status_code == 200
        finally:
            restarted.stop()
        assert count(rt, "SELECT COUNT(*) FROM messages WHERE external_id = 'wamid.KEEP'") == 1
    finally:
        rt.close()


def test_two_instances_never_send_the_same_response(tmp_path: Path, fake: FakeWhatsApp) -> None:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", CHANNELS)
    ports = [free_port(), free_port()]
    procs = [Proc("whatsapp", home, _env(fake, p), tmp_path / f"wa{i}.log") for i, p in enumerate(ports)]
    rt = open_home(home)
    try:
        for proc in procs:
            proc.wait_output("webhook listening")
        for i in range(40):
            rt.queue.responses.enqueue_response(
                ChatAddress("whatsapp", "alice", sender_id=ALICE, conversation=ALICE), f"reply number {i}"
            )
        wait_for(
            lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'acked'") == 40, 40, "all acked"
        )
        deliverers = {r["claimed_by"] for r in rt.db.read("SELECT claimed_by FROM responses")}
    finally:
        rt.close()
        for proc in procs:
            proc.stop()
    texts = _texts(fake, ALICE)
    assert sorted(texts) == sorted(f"reply number {i}" for i in range(40))  # each exactly once
    assert len(deliverers) >= 1
