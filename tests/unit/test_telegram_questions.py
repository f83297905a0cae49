"""The Telegram question helpers: the keyboard's rows, an answer to a press kept within Telegram's 200
characters, and the conversation a message is in (forum topics included)."""

from __future__ import annotations

import datetime as dtm

import pytest
from telegram import Chat, InaccessibleMessage, Message

from adapters.approval_prompts import buttons_for
from adapters.chunking import utf16_len
from adapters.telegram_questions import ANSWER_LIMIT, answer_text, conversation_of, inline_keyboard

pytestmark = pytest.mark.unit


def test_allow_and_deny_share_a_row_allow_for_this_chat_has_its_own() -> None:
    rows = inline_keyboard(buttons_for("apr_1")).inline_keyboard
    assert [[(b.text, b.callback_data) for b in row] for row in rows] == [
        [("Allow", "apr_1:allow"), ("Deny", "apr_1:deny")],
        [("Allow for this chat", "apr_1:chat")],
    ]


def test_an_answer_is_cut_to_telegrams_limit_in_its_own_units() -> None:
    assert answer_text("This request has expired.") == "This request has expired."
    long = "This request was already answered: ✅ Allowed by ann — Bash: " + "🙂" * 150
    cut = answer_text(long)
    assert utf16_len(cut) <= ANSWER_LIMIT and cut.endswith("…") and long.startswith(cut[:-1])
    assert utf16_len(answer_text("x" * 200)) == 200 and answer_text("x" * 201) == "x" * 199 + "…"


def test_the_conversation_of_a_message_names_its_forum_topic() -> None:
    group = Chat(-1001, "supergroup", is_forum=True)
    when = dtm.datetime(2026, 1, 1, tzinfo=dtm.UTC)
    topic = Message(5, when, group, message_thread_id=7, is_topic_message=True)
    assert conversation_of(topic) == "-1001:7"
    # A reply thread in a plain group is not a topic: the chat's messages are all one conversation.
    reply = Message(6, when, Chat(-2002, "supergroup"), message_thread_id=3)
    assert conversation_of(reply) == "-2002"
    assert conversation_of(InaccessibleMessage(Chat(42, "private"), 9)) == "42"
