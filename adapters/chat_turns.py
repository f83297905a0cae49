"""One chat's inbound messages taken in one at a time, in the order they came, while other chats go on.

Platform libraries that run each incoming event's handler as a task of its own (discord.py, Slack's Socket
Mode client, a webhook server's requests) would otherwise take two messages of one chat in side by side, and
either could be queued first (one with an attachment to download, say, is overtaken by the next). Taking the
chat's turn before the handler's first ``await`` keeps the order they came in: asyncio's lock wakes its
waiters first come, first served.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class ChatTurns:
    """Per chat being taken in: its lock and how many handlers hold or wait for it (the lock goes when
    nobody does)."""

    def __init__(self) -> None:
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def turn(self, conversation: str) -> AsyncIterator[None]:
        """Hold ``conversation``'s turn: handlers of one chat run one at a time, in the order they asked."""
        turns = self._turns
        lock, users = turns.get(conversation, (asyncio.Lock(), 0))
        turns[conversation] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = turns[conversation]
            if users == 1:
                del turns[conversation]
            else:
                turns[conversation] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._turns)
