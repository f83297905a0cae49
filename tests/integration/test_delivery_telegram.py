"""Delivery by the real Telegram adapter against the fake Bot API: one chat's retries (our backoff after a
502, the library's wait after a 429) never hold up another chat; a reply Telegram refuses for good is marked
failed with Telegram's reason, not retried, and the user is told the next time they write."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adapters.telegram import TelegramChannel
from shared.chat.address import ChatAddress
from shared.reads.trace import trace_message
from shared.runtime import Runtime
from tests.channel_support import HoldingTelegram, RunningChannel, channel_home, count, open_home, wait_for
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SETTINGS = {
    "allowlist": ["41", "42", "43", "44"],
    "poll_timeout_seconds": 1,
    "typing": False,
    "delivery_backoff_base_seconds": 4.0,
}


def _channel(rt: Runtime, fake: HoldingTelegram) -> TelegramChannel:
    env = {"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url}
    return TelegramChannel(rt, env=env)


def _status(rt: Runtime, response_id: int) -> str:
    return str(rt.db.read_scalar("SELECT status FROM responses WHERE id = :id", {"id": response_id}))


@pytest.mark.serial  # a wall-clock bound (1.5 s); its 4.1 s misses were the library pausing every chat for a 429
def test_one_chats_retries_do_not_delay_another_chat(
    tmp_path: Path, fake: HoldingTelegram, db_url: str
) -> None:
    rt = open_home(channel_home(tmp_path, db_url, {"telegram": SETTINGS}))
    for chat in (41, 42, 43):
        fake.add_chat(chat)
    fake.fail_in_chat(41, "sendMessage", error_code=502, description="Bad Gateway")
    fake.fail_in_chat(42, "sendMessage", error_code=429, description="Too Many Requests", retry_after=4)
    try:
        with RunningChannel(_channel(rt, fake), deliver_only=True):
            slow = [
                rt.queue.responses.enqueue_response(
                    ChatAddress("telegram", "ann", conversation=str(c)), f"to chat {c}"
                ).id
                for c in (41, 42)
            ]
            fake.wait_for_call(lambda c: c.chat_id == 42 and not c.ok, 10)  # chat 42 is being held back
            fake.wait_for_call(lambda c: c.chat_id == 41 and not c.ok, 10)  # chat 41 is backing off
            started = time.monotonic()
            rt.queue.responses.enqueue_response(
                ChatAddress("telegram", "bob", conversation="43"), "to chat 43"
            )
            sent = fake.wait_for(lambda c: c.method == "sendMessage" and c.chat_id == 43, 10)
            latency = sent.at - started
            waiting = [_status(rt, r) for r in slow]
            early = fake.texts(41) + fake.texts(42)
            wait_for(lambda: all(_status(rt, r) == "acked" for r in slow), 30, "the held-back replies")
    finally:
        rt.close()
    assert latency < 1.5, f"chat 43 waited {latency:.1f} s for other chats' retries"
    # Both were still on their way (backing off, or held by Telegram's rate limit) when chat 43 got its reply.
    assert "acked" not in waiting and early == [], (waiting, early)
    assert fake.texts(41) == ["to chat 41"] and fake.texts(42) == ["to chat 42"]  # once each, in the end


def test_a_refused_reply_is_failed_and_the_user_told_when_they_write(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    rt = open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"telegram": SETTINGS}))
    fake.add_chat(44)
    fake.fail_in_chat(44, "sendMessage", error_code=403, description="Forbidden: bot was blocked by the user")
    try:
        with RunningChannel(_channel(rt, fake)):
            reply = rt.queue.responses.enqueue_response(
                ChatAddress("telegram", "ann", conversation="44"), "the answer"
            )
            wait_for(lambda: _status(rt, reply.id) == "failed", 15, "the reply marked failed")
            attempts = [c for c in fake.calls if c.method == "sendMessage" and c.chat_id == 44]
            fake.push_text(44, "hello again")
            notice = fake.wait_for(lambda c: c.method == "sendMessage" and c.chat_id == 44, 15)
            wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 1, 10, "the new message queued")
        last_error = rt.db.read_scalar("SELECT last_error FROM responses WHERE id = :id", {"id": reply.id})
        trace = trace_message(rt.db, reply.message_id)
    finally:
        rt.close()
    assert len(attempts) == 1  # refused for good: not retried
    assert "blocked" in str(last_error)
    text = notice.text or ""
    assert text.startswith("My reply to your message at ") and "could not be delivered" in text
    assert "(Telegram: the bot was blocked or removed from this chat)" in text
    assert text.endswith(f"Ref: {reply.message_id}")
    assert "could not be delivered" in trace.verdict and "blocked" in trace.verdict
    assert fake.texts(44) == [text]  # the refused reply never reached the chat; the notice did, once


def test_a_reply_to_an_unknown_chat_is_failed_with_telegrams_reason(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    rt = open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"telegram": SETTINGS}))
    try:
        with RunningChannel(_channel(rt, fake), deliver_only=True):
            reply = rt.queue.responses.enqueue_response(
                ChatAddress("telegram", "ann", conversation="9999"), "hello"
            )
            wait_for(lambda: _status(rt, reply.id) == "failed", 15, "the reply marked failed")
        last_error = rt.db.read_scalar("SELECT last_error FROM responses WHERE id = :id", {"id": reply.id})
    finally:
        rt.close()
    assert "chat not found" in str(last_error).lower()
    assert len([c for c in fake.calls if c.method == "sendMessage"]) == 1
