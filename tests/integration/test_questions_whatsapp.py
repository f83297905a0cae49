"""An agent's question in WhatsApp (``permission_mode = "ask"``), through the real channel runner against the
fake Graph API with signed webhooks: the question arrives as an interactive message with reply buttons; a
press by someone else changes nothing (they are told); the asker's press decides the request, and the
decision comes as a new message (WhatsApp cannot edit one). Where Meta refuses buttons, the question is
asked as text, answered with /allow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.approval_support import COMMAND, ask_for_bash, status_of
from tests.channel_support import channel_home, open_home, wait_for, whatsapp_webhook
from tests.fakes.whatsapp_api import (
    FakeWhatsApp,
    WhatsAppSent,
    button_reply_payload,
    signed_webhook,
    text_message_payload,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SECRET = "s3cret"
ANN, BOB = "111", "222"


def _post(url: str, payload: dict[str, Any]) -> None:
    body, headers = signed_webhook(SECRET, payload)
    assert httpx.post(url, content=body, headers=headers).status_code == 200


def _chat(fake: FakeWhatsApp, number: str) -> list[tuple[str, str | None, list[tuple[str, str]]]]:
    return [(s.type, s.text, s.buttons) for s in fake.sent if s.to == number]


def _all_sent(rt: Runtime, number: str) -> list[str]:
    """The kinds of everything queued to ``number``'s chat, once every one of them went out."""
    chat = {"c": number}
    sent = "SELECT COUNT(*) FROM responses WHERE conversation = :c AND status = 'acked'"
    every = "SELECT COUNT(*) FROM responses WHERE conversation = :c"
    wait_for(lambda: rt.db.read_scalar(sent, chat) == rt.db.read_scalar(every, chat), 10, "all sent")
    rows = rt.db.read("SELECT metadata FROM responses WHERE conversation = :c ORDER BY id", chat)
    return [json.loads(r["metadata"] or "{}").get("kind", "") for r in rows]


def _home(tmp_path: Path) -> Runtime:
    channels = {"whatsapp": {"allowlist": [ANN, BOB], "typing": False, "read_receipts": False}}
    return open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels))


def _asked(rt: Runtime, url: str, command: str = COMMAND) -> str:
    """Ann writes; the agent asks her about ``command``. Returns the request's id."""
    _post(url, text_message_payload(ANN, "clean up", name="Ann"))
    message_id = wait_for(lambda: rt.db.read_scalar("SELECT id FROM messages"), 10, "the message queued")
    chat = ChatAddress("whatsapp", "Ann", sender_id=ANN, conversation=ANN)
    return ask_for_bash(rt, chat, str(message_id), command=command).id


def test_a_button_press_answers_the_question_only_for_its_asker(tmp_path: Path) -> None:
    rt = _home(tmp_path)
    try:
        with FakeWhatsApp() as fake, whatsapp_webhook(rt, fake, SECRET) as url:
            request = _asked(rt, url)
            question: WhatsAppSent = fake.wait_for(lambda s: s.type == "interactive", 10)
            _post(
                url,
                button_reply_payload(
                    BOB, f"{request}:allow", "Allow", context_wamid=question.wamid, name="Bob"
                ),
            )
            fake.wait_for(lambda s: s.to == BOB, 10)
            assert status_of(rt, request) == "pending"
            _post(
                url,
                button_reply_payload(
                    ANN, f"{request}:allow", "Allow", context_wamid=question.wamid, name="Ann"
                ),
            )
            # The webhook was answered once the press was applied and anything it says queued.
            assert status_of(rt, request) == "allowed"
            queued = _all_sent(rt, ANN)
            ann, bob = _chat(fake, ANN), _chat(fake, BOB)
    finally:
        rt.close()
    decided = f"✅ Allowed by Ann — Bash: {COMMAND}"
    assert ann[0][0] == "interactive" and COMMAND in (ann[0][1] or "")
    assert ann == [
        (
            "interactive",
            ann[0][1],
            [
                (f"{request}:allow", "Allow"),
                (f"{request}:deny", "Deny"),
                (f"{request}:chat", "Allow for this chat"),
            ],
        ),
        # The decision, as a new message (the question cannot be edited); it is also what Ann's press did,
        # so she is not told it twice.
        ("text", decided, []),
    ]
    assert queued == ["approval", "approval_closed"]
    assert bob == [("text", "Only Ann can answer this request.", [])]


def test_a_question_refused_with_buttons_is_asked_as_text(tmp_path: Path) -> None:
    rt = _home(tmp_path)
    try:
        with FakeWhatsApp() as fake, whatsapp_webhook(rt, fake, SECRET) as url:
            fake.refuse_interactive()
            request = _asked(rt, url)
            asked = fake.wait_for(lambda s: s.to == ANN, 10)
            _post(url, text_message_payload(ANN, "/allow", name="Ann"))
            wait_for(lambda: status_of(rt, request) == "allowed", 10, "the request allowed")
            wait_for(lambda: len(_chat(fake, ANN)) == 3, 10, "the decision and the answer to /allow")
            ann = _chat(fake, ANN)
            refused = [
                c.status for c in fake.calls if c.body is not None and c.body.get("type") == "interactive"
            ]
    finally:
        rt.close()
    decided = f"✅ Allowed by Ann — Bash: {COMMAND}"
    assert refused == [400]  # refused for good: not retried with buttons
    assert asked.type == "text" and "/allow" in (asked.text or "") and COMMAND in (asked.text or "")
    # The decision as a new message, and the answer to /allow (a chat command is always answered).
    assert ann[1:] == [("text", decided, []), ("text", decided, [])]


def test_a_question_too_long_for_buttons_is_sent_whole_then_asked_with_them(tmp_path: Path) -> None:
    # A button message holds 1,024 characters; the command is never cut short where it is allowed.
    command = "printf '%s\\n' " + " ".join(f"line-{i:04d}" for i in range(120))
    rt = _home(tmp_path)
    try:
        with FakeWhatsApp() as fake, whatsapp_webhook(rt, fake, SECRET) as url:
            request = _asked(rt, url, command)
            question = fake.wait_for(lambda s: s.type == "interactive", 10)
            _post(
                url,
                button_reply_payload(
                    ANN, f"{request}:deny", "Deny", context_wamid=question.wamid, name="Ann"
                ),
            )
            assert status_of(rt, request) == "denied"
            assert _all_sent(rt, ANN) == ["approval", "approval_closed"]
            ann = _chat(fake, ANN)
    finally:
        rt.close()
    assert len(command) > 1024
    lead, ask = ann[0], ann[1]
    assert lead[0] == "text" and command in (lead[1] or "") and lead[2] == []
    assert ask[0] == "interactive" and (ask[1] or "").startswith("Allow it? Without an answer within 10 min")
    assert [title for _, title in ask[2]] == ["Allow", "Deny", "Allow for this chat"]
    ((kind, text, _),) = ann[2:]
    assert kind == "text" and (text or "").startswith("🚫 Denied by Ann — not run: Bash: printf")
