"""Telegram's flood limits, kept per chat: the rate limiter the Telegram plugin gives python-telegram-bot.

The library's own ``AIORateLimiter`` answers a ``429 Too Many Requests`` (``RetryAfter``) by holding back
*every* request of the bot until the wait is over: one chat told to wait 30 s kept every other chat's replies
waiting 30 s too. Telegram's flood waits are mostly about one chat (a group that got too many messages), so
here only the request that was told to wait waits and is sent again; the other chats' replies go on. The
overall pace stays within Telegram's documented limits (about 30 messages a second in all, 20 a minute into
one group), as the library's limiter keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dtm
import logging
import warnings
from collections.abc import Callable, Coroutine
from typing import Any

from aiolimiter import AsyncLimiter
from telegram.error import RetryAfter
from telegram.ext import BaseRateLimiter
from telegram.warnings import PTBDeprecationWarning

log = logging.getLogger("agentpost.channel.telegram")

#: Telegram's documented pace: about 30 messages a second overall, and 20 a minute into one group.
OVERALL_PER_SECOND = 30
GROUP_PER_MINUTE = 20

JSON = bool | dict[str, Any] | list[dict[str, Any]]


def retry_after_seconds(exc: RetryAfter) -> float:
    """How long Telegram asked to wait, in seconds (the library gives a number or a timedelta)."""
    with warnings.catch_warnings():  # the number form is deprecated; either is read the same
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        wait = exc.retry_after
    return wait.total_seconds() if isinstance(wait, dtm.timedelta) else float(wait)


class ChatRateLimiter(BaseRateLimiter[int]):
    """Paces requests within Telegram's limits and retries one told to wait (``RetryAfter``) up to
    ``retries`` times after the wait, holding back only that request (see the module docstring)."""

    def __init__(self, retries: int) -> None:
        self.retries = retries
        self._overall = AsyncLimiter(OVERALL_PER_SECOND, 1)
        self._groups: dict[int | str, AsyncLimiter] = {}

    async def initialize(self) -> None:
        """Nothing to set up."""

    async def shutdown(self) -> None:
        """Nothing to tear down."""

    def _group(self, chat_id: object) -> AsyncLimiter | None:
        # Negative ids are groups and channels; a string id only names a channel or supergroup.
        if (isinstance(chat_id, int) and chat_id < 0) or isinstance(chat_id, str):
            if chat_id not in self._groups:
                if len(self._groups) > 512:  # forget the idle ones rather than grow without end
                    self._groups = {
                        k: v for k, v in self._groups.items() if not v.has_capacity(GROUP_PER_MINUTE)
                    }
                self._groups[chat_id] = AsyncLimiter(GROUP_PER_MINUTE, 60)
            return self._groups[chat_id]
        return None

    async def process_request(
        self,
        callback: Callable[..., Coroutine[Any, Any, JSON]],
        args: Any,
        kwargs: dict[str, Any],
        endpoint: str,
        data: dict[str, Any],
        rate_limit_args: int | None,
    ) -> JSON:
        """Send one request within the pace; after a ``RetryAfter``, wait as asked and send it again."""
        retries = self.retries if rate_limit_args is None else rate_limit_args
        chat_id = data.get("chat_id")
        with contextlib.suppress(ValueError, TypeError):
            chat_id = int(chat_id)  # type: ignore[arg-type]
        group = self._group(chat_id)
        attempt = 0
        while True:
            try:
                async with contextlib.AsyncExitStack() as paced:
                    if chat_id is not None:
                        await paced.enter_async_context(self._overall)
                    if group is not None:
                        await paced.enter_async_context(group)
                    return await callback(*args, **kwargs)
            except RetryAfter as exc:
                if attempt >= retries:
                    raise
                attempt += 1
                wait = retry_after_seconds(exc) + 0.1
                log.info(
                    "Telegram asked %s to wait %.1f s before %s; only that chat waits",
                    chat_id,
                    wait,
                    endpoint,
                )
                await asyncio.sleep(wait)
