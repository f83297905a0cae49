"""The Discord channel: discord.py, direct messages and guild channels where the bot is mentioned.

Replies go to the channel (or thread) the message came from; the conversation address is the channel id,
and threads are channels in Discord, so a reply lands in the same thread. discord.py's own rate limiting
and retries are used. Progress notes are edited in place (``PATCH /channels/{id}/messages/{id}``). The REST and gateway URLs are internal attributes of discord.py, so they are set in
exactly one place, :func:`point_discord_at`, from ``DISCORD_API_BASE_URL`` (the API root including the
version, e.g. ``https://discord.com/api/v10``) and ``DISCORD_GATEWAY_URL`` (or the settings' ``api_base_url``
and ``gateway_url``); the token comes from ``DISCORD_BOT_TOKEN`` (or the variable named by ``token_env``).

Discord's gateway does not replay events to a new session, so a message that arrives while the adapter is
down is not seen (unlike Telegram's polling and WhatsApp's redelivered webhooks).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import warnings
from pathlib import Path
from typing import Any, ClassVar

import yarl
from pydantic import Field

from adapters.base import Channel, ChannelSettings, Inbound, safe_filename
from adapters.delivery import SendFailure

with warnings.catch_warnings():
    # discord.py imports the stdlib audioop module, deprecated since Python 3.11.
    warnings.filterwarnings("ignore", message="'audioop' is deprecated", category=DeprecationWarning)
    import discord
    from discord.gateway import DiscordWebSocket

_MENTION_RE = r"<@!?{}>"


class DiscordSettings(ChannelSettings):
    """``[channels.discord]``."""

    token_env: str = Field(default="DISCORD_BOT_TOKEN", description="variable holding the bot token")
    api_base_url: str = Field(default="", description="REST root with version; DISCORD_API_BASE_URL wins")
    gateway_url: str = Field(default="", description="gateway websocket URL; DISCORD_GATEWAY_URL wins")
    guild_ready_timeout_seconds: float = Field(default=2.0, ge=0)
    ready_timeout_seconds: float = Field(default=60.0, gt=0)


def point_discord_at(api_base: str, gateway: str) -> None:
    """Point discord.py at another REST root and gateway (tests: the fake). The one place we touch them."""
    if api_base:
        discord.http.Route.BASE = api_base.rstrip("/")
    if gateway:
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway)


class _Client(discord.Client):
    def __init__(self, adapter: DiscordChannel, **options: Any) -> None:
        super().__init__(**options)
        self.adapter = adapter

    async def on_ready(self) -> None:
        self.adapter.ready.set()

    async def on_message(self, message: discord.Message) -> None:
        await self.adapter.on_message(message)


class DiscordChannel(Channel):
    """The Discord adapter (``agentpost run discord``)."""

    name: ClassVar[str] = "discord"
    prefix: ClassVar[str] = "discord"
    limit: ClassVar[int] = 2000
    settings_model: ClassVar[type[ChannelSettings]] = DiscordSettings
    can_edit: ClassVar[bool] = True
    platform_label: ClassVar[str] = "Discord"
    long_reply_suffix: ClassVar[str] = ".md"

    config: DiscordSettings
    client: _Client | None = None
    client_task: asyncio.Task[None] | None = None

    def read_secrets(self) -> None:
        self.token = self.require_env(self.config.token_env, "a bot token (Discord developer portal)")
        self.api_base = self.env.get("DISCORD_API_BASE_URL") or self.config.api_base_url
        self.gateway = self.env.get("DISCORD_GATEWAY_URL") or self.config.gateway_url

    async def open(self) -> None:
        point_discord_at(self.api_base, self.gateway)
        intents = discord.Intents.default()
        intents.message_content = True
        self.ready = asyncio.Event()
        self.client = _Client(
            self,
            intents=intents,
            guild_ready_timeout=self.config.guild_ready_timeout_seconds,
            allowed_mentions=discord.AllowedMentions(everyone=False, roles=False, users=True),
        )
        self.client_task = asyncio.create_task(self.client.start(self.token), name="discord-client")
        ready = asyncio.create_task(self.ready.wait())
        done, _ = await asyncio.wait(
            {self.client_task, ready},
            timeout=self.config.ready_timeout_seconds,
            return_when=asyncio.FIRST_COMPLETED,
        )
        ready.cancel()
        if self.client_task in done:
            self.client_task.result()  # re-raises why the client stopped (a bad token: LoginFailure)
            raise RuntimeError("the Discord client stopped before it was ready")
        if not done:
            raise TimeoutError(f"Discord was not ready within {self.config.ready_timeout_seconds} s")

    async def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        if self.client_task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.client_task, 5)
        self.client = None
        self.client_task = None

    async def receive(self) -> None:
        assert self.client_task is not None
        stop = asyncio.create_task(self.stop_event.wait())
        done, _ = await asyncio.wait({self.client_task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if self.client_task in done:
            self.client_task.result()
            raise RuntimeError("the Discord client stopped")

    # -- receiving -----------------------------------------------------------------------------------------
    async def on_message(self, message: discord.Message) -> None:
        """A MESSAGE_CREATE: DMs always, guild messages only when they mention the bot."""
        client = self.client
        if client is None or client.user is None:
            return
        if message.author.bot or message.author.id == client.user.id:
            return  # our own echoes and other bots
        text = message.content or ""
        if message.guild is not None:
            if not any(user.id == client.user.id for user in message.mentions):
                return
            text = re.sub(_MENTION_RE.format(client.user.id), "", text).strip()
        await self.test_pause_after_fetch("a Discord message")
        conversation = str(message.channel.id)
        files: list[Path] = []
        if await self.may_download(str(message.author.id)):
            files = await self._save_attachments(message, conversation)
        elif not text:
            text = "(an attachment)"  # a stranger still gets a pairing code, but nothing is downloaded
        await self.handle(
            Inbound(
                conversation=conversation,
                sender_id=str(message.author.id),
                sender=message.author.name,
                text=text,
                external_id=str(message.id),
                files=files,
                metadata={
                    "guild_id": str(message.guild.id) if message.guild else "",
                    "discord_message_id": str(message.id),
                },
            )
        )

    async def _save_attachments(self, message: discord.Message, conversation: str) -> list[Path]:
        if not message.attachments:
            return []
        folder = self.settings.home / "files" / self.name / safe_filename(conversation)
        folder.mkdir(parents=True, exist_ok=True)
        saved = []
        for attachment in message.attachments:
            path = folder / f"{message.id}-{safe_filename(attachment.filename)}"
            if not path.exists():
                await attachment.save(path)
            saved.append(path)
        return saved

    # -- sending -------------------------------------------------------------------------------------------
    async def _channel(self, conversation: str) -> Any:
        assert self.client is not None, "the adapter is not open"
        channel_id = int(conversation)
        found = self.client.get_channel(channel_id)
        if found is None:
            found = await self.client.fetch_channel(channel_id)
        return found

    async def send_text(self, conversation: str, text: str) -> str | None:
        channel = await self._channel(conversation)
        sent = await channel.send(text)
        return str(sent.id)

    async def send_file(self, conversation: str, path: Path, caption: str) -> str | None:
        channel = await self._channel(conversation)
        sent = await channel.send(content=caption or None, file=discord.File(path, filename=path.name))
        return str(sent.id)

    def classify_send_error(self, exc: Exception) -> SendFailure:
        reason = f"Discord: {exc}"
        if isinstance(exc, discord.Forbidden):
            return SendFailure(True, reason, "the bot may not post in this channel or to this user")
        if isinstance(exc, discord.NotFound):
            return SendFailure(True, reason, "the channel no longer exists")
        if isinstance(exc, discord.HTTPException) and 400 <= exc.status < 500 and exc.status != 429:
            return SendFailure(True, reason, "Discord refused the message")
        return SendFailure(False, reason)

    async def send_typing(self, conversation: str) -> None:
        channel = await self._channel(conversation)
        await channel.typing()

    async def send_note(self, conversation: str, text: str) -> str:
        channel = await self._channel(conversation)
        sent = await channel.send(text)
        return str(sent.id)

    async def edit_text(self, conversation: str, message_id: str, text: str) -> bool:
        channel = await self._channel(conversation)
        try:
            await channel.get_partial_message(int(message_id)).edit(content=text)
        except (discord.NotFound, discord.Forbidden):
            return False  # deleted, or not ours to edit: send a new note
        return True
