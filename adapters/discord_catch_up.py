"""The Discord channel's catch-up of messages sent while it was down (a part of :mod:`adapters.discord`).

Discord's gateway does not replay events to a new session (only a RESUME of the same session replays its
gap), so after a fresh start the adapter catches up by itself: it keeps the newest message id it took in per
channel (DMs included; :mod:`shared.chat.cursors`, moved in the transaction that takes each message in) and,
once connected, reads each such channel's history after it (``GET /channels/{id}/messages?after=ID``),
bounded by ``catch_up_window_hours`` and ``catch_up_max_per_channel``. Those messages go through the same
handling and duplicate check as live ones, so a message is never taken twice.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from adapters.platform import Platform
from shared.aio import call
from shared.chat import cursors
from shared.settings.channels import DiscordSettings

with warnings.catch_warnings():
    # discord.py imports the stdlib audioop module, deprecated since Python 3.11.
    warnings.filterwarnings("ignore", message="'audioop' is deprecated", category=DeprecationWarning)
    import discord

#: Discord snowflakes count milliseconds since 2015-01-01, shifted left by 22 bits.
_DISCORD_EPOCH_MS = 1_420_070_400_000
#: Catch-up re-reads this much before a channel's record: messages handled side by side may have been
#: recorded out of order when the adapter died (the duplicate check drops what was taken already).
_CATCH_UP_MARGIN_MS = 60_000

#: A channel to read history from, without a request: ``channel_for(conversation, guild_id)``.
ChannelFor = Callable[[str, str], Any]


class OnMessage(Protocol):
    """Handles a message read back like a live one (:meth:`adapters.discord.DiscordChannel.on_message`);
    ``guild_id`` stands in when the message's guild is not cached."""

    def __call__(self, message: discord.Message, *, guild_id: str) -> Awaitable[None]: ...


def snowflake_at(epoch_ms: int) -> int:
    """The smallest Discord id of a message sent at ``epoch_ms``."""
    return max(0, epoch_ms - _DISCORD_EPOCH_MS) << 22


class CatchUp:
    """Reads back what the Discord channel missed while it was down (see the module docstring).

    Given the channel (its database, name, log and stop event), its settings, how to address a channel
    without a request, and the channel's handler of incoming messages (the live one, with its checks)."""

    def __init__(
        self, channel: Platform, config: DiscordSettings, *, channel_for: ChannelFor, on_message: OnMessage
    ) -> None:
        self.channel = channel
        self.config = config
        self.channel_for = channel_for
        self.on_message = on_message

    async def run(self) -> None:
        """Read what arrived while the adapter was down in every channel it has talked in, oldest first,
        and handle it like a live message; returns when done or when the channel stops."""
        platform, log = self.channel, self.channel.log
        now = int(time.time() * 1000)
        oldest = snowflake_at(now - int(self.config.catch_up_window_hours * 3_600_000))
        margin = _CATCH_UP_MARGIN_MS << 22
        taken = 0
        for cursor in await call(cursors.cursors, platform.rt.db, platform.name):
            if platform.inbox.stop_event.is_set():
                return
            after = max(oldest, cursor.last_id - margin)
            channel = self.channel_for(cursor.conversation, cursor.note)
            try:
                async for message in channel.history(
                    limit=self.config.catch_up_max_per_channel,
                    after=discord.Object(id=after),
                    oldest_first=True,
                ):
                    await self.on_message(message, guild_id=cursor.note)
                    taken += 1
            except Exception as exc:  # one channel gone or forbidden must not stop the others
                log.warning("catching up in channel %s failed: %s", cursor.conversation, exc)
        log.info("caught up: read %s messages sent while the adapter was down (or just before)", taken)
