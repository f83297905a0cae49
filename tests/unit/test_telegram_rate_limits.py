"""The Telegram plugin's rate limiter: a chat told to wait (RetryAfter) waits alone, and is sent again."""

from __future__ import annotations

import asyncio
import datetime as dtm
import time
from typing import Any

import pytest
from telegram.error import RetryAfter

from adapters.telegram_rate_limits import ChatRateLimiter

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _timedelta_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")  # as the plugin sets it before the library makes any error


def test_a_flood_wait_in_one_chat_holds_back_only_that_chat() -> None:
    limiter = ChatRateLimiter(retries=2)
    sent: list[tuple[int, float]] = []
    told_to_wait: set[int] = set()
    start = time.monotonic()

    async def send(chat: int) -> dict[str, Any]:
        if chat == 42 and chat not in told_to_wait:
            told_to_wait.add(chat)
            raise RetryAfter(dtm.timedelta(seconds=1))
        sent.append((chat, time.monotonic() - start))
        return {"ok": True}

    async def go() -> None:
        waiting = asyncio.create_task(
            limiter.process_request(send, (42,), {}, "sendMessage", {"chat_id": 42}, None)
        )
        await asyncio.sleep(0.1)  # chat 42 has been told to wait by now
        await limiter.process_request(send, (43,), {}, "sendMessage", {"chat_id": 43}, None)
        assert [c for c, _ in sent] == [43]  # sent while 42 still waits
        await waiting

    asyncio.run(go())
    (chat_43,) = [t for c, t in sent if c == 43]
    (chat_42,) = [t for c, t in sent if c == 42]
    assert chat_43 < 0.5 and chat_42 >= 1.0  # 42 sent again after its wait, 43 never held back


def test_a_chat_told_to_wait_more_often_than_the_retries_gets_the_error() -> None:
    limiter = ChatRateLimiter(retries=1)
    calls = 0

    async def send() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        raise RetryAfter(dtm.timedelta(seconds=0))

    with pytest.raises(RetryAfter):
        asyncio.run(limiter.process_request(send, (), {}, "sendMessage", {"chat_id": -100}, None))
    assert calls == 2  # the first try and one retry
