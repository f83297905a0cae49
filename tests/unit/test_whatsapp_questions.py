"""WhatsApp's side of questions, without I/O (:mod:`adapters.whatsapp_graph`): the reply-button message a
question becomes (within the Cloud API's limits, or None), and a press read back from a webhook."""

from __future__ import annotations

import logging

import pytest

from adapters.platform import Button, Press
from adapters.whatsapp_graph import parse_messages, question_message
from tests.fakes.whatsapp_api import button_reply_payload

pytestmark = pytest.mark.unit

BUTTONS = [
    Button("Allow", "apr_1:allow"),
    Button("Deny", "apr_1:deny"),
    Button("Allow for this chat", "apr_1:chat"),
]
LOG = logging.getLogger("test")


def test_a_question_becomes_a_reply_button_message() -> None:
    body = question_message("111", "Allow it?", BUTTONS)
    assert body is not None
    assert (body["to"], body["type"]) == ("111", "interactive")
    interactive = body["interactive"]
    assert interactive["type"] == "button" and interactive["body"] == {"text": "Allow it?"}
    assert interactive["action"]["buttons"] == [
        {"type": "reply", "reply": {"id": b.data, "title": b.label}} for b in BUTTONS
    ]


def test_what_does_not_fit_a_button_message_is_none_and_titles_are_cut_to_twenty() -> None:
    assert question_message("111", "x" * 1024, BUTTONS) is not None
    assert question_message("111", "x" * 1025, BUTTONS) is None  # never cut: asked otherwise
    assert question_message("111", "q", [*BUTTONS, Button("Later", "apr_1:later")]) is None
    assert question_message("111", "q", [Button("Allow", "x" * 257)]) is None
    long = question_message("111", "q", [Button("Allow for the rest of this chat", "apr_1:chat")])
    assert long is not None
    assert long["interactive"]["action"]["buttons"][0]["reply"]["title"] == "Allow for the rest o"


def test_a_button_reply_is_read_as_a_press_from_its_sender() -> None:
    payload = button_reply_payload(
        "111", "apr_1:deny", "Deny", context_wamid="wamid.Q", wamid="wamid.P", name="Ann"
    )
    (parsed,) = parse_messages(payload["entry"][0]["changes"][0]["value"], LOG)
    assert parsed.press == Press(conversation="111", sender_id="111", sender="Ann", data="apr_1:deny")
    assert parsed.inbound.external_id == "wamid.P" and parsed.media is None


def test_other_interactive_replies_are_skipped() -> None:
    payload = button_reply_payload("111", "x", "X", context_wamid="wamid.Q")
    message = payload["entry"][0]["changes"][0]["value"]["messages"][0]
    message["interactive"] = {"type": "list_reply", "list_reply": {"id": "row-1", "title": "Row"}}
    assert list(parse_messages(payload["entry"][0]["changes"][0]["value"], LOG)) == []
