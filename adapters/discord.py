"""The Discord channel: discord.py, direct messages and guild channels where the bot is mentioned.

Replies go to the channel (or thread) the message came from; the conversation address is the channel id,
and threads are channels in Discord, so a reply lands in the same thread. discord.py's own rate limiting
and retries are used. Progress notes are edited in place (``PATCH /channels/{id}/messages/{id}``). The REST and gateway URLs are internal attributes of discord.py, so they are set in
exactly one place, :func:`point_discord_at`, from ``DISCORD_API_BASE_URL`` (the API root including the
version, e.g. ``https://discord.com/api/v10``) and ``DISCORD_GATEWAY_URL`` (or the settings' ``api_base_url``
and ``gateway_url``); the token comes from ``DISCORD_BOT_TOKEN`` (or the variable named by ``token_env``).

Discord's gateway does not replay events to a new session (only a RESUME of the same session replays its
gap), so after a fresh start the adapter catches up by itself (:mod:`adapters.discord_catch_up`): it keeps the
newest message id it took in per channel (DMs included; :mod:`shared.chat.cursors`) and, once connected, reads
each such channel's history after it (``GET /channels/{id}/messages?after=ID``), bounded by
``catch_up_window_hours`` and ``catch_up_max_per_channel``. Those messages go through the same handling and
duplicate check as live ones, so a message is never taken twice; a reply to one sent more than
``late_message_seconds`` earlier says it arrived while the bot was offline. A DM from someone the bot never
talked with before cannot be found this way (Discord offers bots no list of DM channels).

Order: discord.py runs each incoming message's handler as a task of its own; the messages of one chat are
taken in one at a time, in the order they came (another chat does not wait). Replies of one chat go out in
order, one at a time, through the runner's delivery like every channel's.

Questions (an agent asking before a tool runs) are sent with Allow / Deny / Allow for this chat buttons and
edited to their answer with the buttons removed; a press arrives as a component interaction and is answered
privately to the one who pressed (:mod:`adapters.discord_questions`).

Hygiene: a pairing code for someone who mentions the bot in a guild goes to them by DM (the guild channel gets
a short hint without the code); channels are addressed without a ``GET /channels/{id}`` per send (cached
channels, else a partial channel by id); an unreachable API at start is retried with backoff
(:meth:`adapters.channel_lifecycle.Lifecycle.open_with_retries`), visible in ``agentpost status`` and ``doctor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import mimetypes
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import yarl

from adapters.chat_turns import ChatTurns
from adapters.discord_catch_up import CatchUp
from adapters.discord_questions import question_view, take_press
from adapters.platform import (
    Button,
    ChannelSettings,
    Inbound,
    Platform,
    SendFailure,
    pairing_code_text,
    pause_for_tests_after_fetch,
    run_until_stopped,
    safe_filename,
    upload_folder,
)
from shared.aio import call
from shared.chat import cursors
from shared.chat.address import ChatAddress
from shared.inbound_media import is_recording
from shared.settings.channels import DiscordSettings

with warnings.catch_warnings():
    # discord.py imports the stdlib audioop module, deprecated since Python 3.11.
    warnings.filterwarnings("ignore", message="'audioop' is deprecated", category=DeprecationWarning)
    import discord
    from discord.gateway import DiscordWebSocket

_MENTION_RE = r"<@!?{}>"


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

    async def on_interaction(self, interaction: discord.Interaction[Any]) -> None:
        await take_press(self.adapter.inbox, interaction, self.adapter.log)


class DiscordChannel(Platform):
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
    catch_up_task: asyncio.Task[None] | None = None

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
        if self.catch_up_task is not None:
            self.catch_up_task.cancel()
            with contextlib.suppress(BaseException):
                await self.catch_up_task
            self.catch_up_task = None
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        if self.client_task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.client_task, 5)
        self.client = None
        self.client_task = None

    def is_unreachable(self, exc: BaseException) -> bool:
        if isinstance(exc, discord.HTTPException):
            return exc.status >= 500  # Discord's own trouble; 4xx (a bad token) is a refusal
        return isinstance(
            exc, aiohttp.ClientConnectionError | discord.GatewayNotFound
        ) or super().is_unreachable(exc)

    async def receive(self) -> None:
        assert self.client_task is not None
        if self.config.catch_up:
            catch_up = CatchUp(self, self.config, channel_for=self._channel_for, on_message=self.on_message)
            self.catch_up_task = asyncio.create_task(catch_up.run(), name="discord-catch-up")
        await run_until_stopped(self.client_task, self.inbox.stop_event, "the Discord client")

    # -- receiving -----------------------------------------------------------------------------------------
    async def on_message(self, message: discord.Message, *, guild_id: str = "") -> None:
        """A MESSAGE_CREATE (or a message read back by :class:`adapters.discord_catch_up.CatchUp`): DMs
        always, guild messages only when they mention the bot. ``guild_id`` stands in when the message's
        guild is not cached."""
        client = self.client
        if client is None or client.user is None:
            return
        if message.author.bot or message.author.id == client.user.id:
            return  # our own echoes and other bots
        text = message.content or ""
        guild = str(message.guild.id) if message.guild is not None else guild_id
        if guild:
            if not any(user.id == client.user.id for user in message.mentions):
                return
            text = re.sub(_MENTION_RE.format(client.user.id), "", text).strip()
        conversation = str(message.channel.id)
        # Handlers run as tasks of their own: take the chat's turn before the first await, so one chat's
        # messages are taken in in the order they came (adapters.chat_turns); other chats do not wait.
        async with self._chat_turns.turn(conversation):
            await self._take_in(message, text, guild, conversation)

    @functools.cached_property
    def _chat_turns(self) -> ChatTurns:
        return ChatTurns()

    async def _take_in(self, message: discord.Message, text: str, guild: str, conversation: str) -> None:
        await pause_for_tests_after_fetch(self, "a Discord message")
        sender_id = str(message.author.id)
        files: list[Path] = []
        metadata = {"guild_id": guild, "discord_message_id": str(message.id)}
        if await self.inbox.may_download(sender_id):
            files = await self._save_attachments(message, conversation)
        else:
            if not text:
                text = "(an attachment)"  # a stranger still gets a pairing code, but nothing is downloaded
            if guild:
                metadata["dm_channel"] = await self._dm_channel_of(message.author)
        cursor = (ChatAddress(self.name, conversation=conversation), message.id, guild)
        outcome = await self.inbox.handle(
            Inbound(
                conversation=conversation,
                sender_id=sender_id,
                sender=message.author.name,
                text=text,
                external_id=str(message.id),
                files=files,
                metadata=metadata,
                sent_at=int(message.created_at.timestamp() * 1000),
            ),
            # The chat's catch-up cursor moves in the transaction that takes the message in, so a
            # catch-up after a crash starts after it, never before a message it already has.
            also=lambda tx: cursors.note_seen_in(tx, *cursor),
        )
        if outcome not in ("queued", "command"):  # nothing was committed with the cursor: its own write
            note = functools.partial(call, cursors.note_seen, self.rt.db, *cursor)
            await self.inbox.until_stored(note, f"recording message {message.id}")

    async def _dm_channel_of(self, user: discord.User | discord.Member) -> str:
        """The id of the DM channel with ``user`` ("" when Discord will not open one)."""
        try:
            dm = user.dm_channel or await user.create_dm()
        except discord.HTTPException as exc:
            self.log.info("cannot open a DM with %s: %s", user.id, exc)
            return ""
        return str(dm.id)

    def pairing_replies(self, message: Inbound, code: str) -> list[tuple[ChatAddress, str, str]]:
        """In a guild the code goes by DM and the channel gets a hint without it (anyone can read there)."""
        if not message.metadata.get("guild_id"):
            return super().pairing_replies(message, code)
        here = message.address_on(self.name)
        dm = str(message.metadata.get("dm_channel") or "")
        if not dm:
            hint = (
                f"<@{message.sender_id}> I don't know you yet, and I cannot send you a direct message. "
                "Allow direct messages from this server's members, then mention me again."
            )
            return [(here, hint, "pairing_hint")]
        private = here._replace(conversation=dm)
        hint = (
            f"<@{message.sender_id}> I don't know you yet; I sent you a direct message about getting access."
        )
        return [(private, pairing_code_text(code), "pairing"), (here, hint, "pairing_hint")]

    async def _save_attachments(self, message: discord.Message, conversation: str) -> list[Path]:
        if not message.attachments:
            return []
        folder = upload_folder(self, conversation)
        saved = []
        for attachment in message.attachments:
            name = safe_filename(attachment.filename)
            kind = (attachment.content_type or "").split(";", 1)[0].strip()
            if kind.startswith("audio/") and not is_recording(Path(name)):
                # A voice message is known by its name's suffix (adapters/voice.py): give it one.
                name += mimetypes.guess_extension(kind) or ".ogg"
            path = folder / f"{message.id}-{name}"
            if not path.exists():
                await attachment.save(path)
            saved.append(path)
        return saved

    # -- sending -------------------------------------------------------------------------------------------
    def _channel_for(self, conversation: str, guild_id: str = "") -> Any:
        """A channel to send to, without a request: the cached one (guild channels, threads, DMs opened
        here), else a partial channel by id — DM channels of incoming messages are not cached by
        discord.py, and fetching them cost a ``GET /channels/{id}`` before every send and typing call."""
        assert self.client is not None, "the adapter is not open"
        channel_id = int(conversation)
        found: Any = self.client.get_channel(channel_id)
        if found is None:
            found = self.client.get_partial_messageable(
                channel_id, guild_id=int(guild_id) if guild_id else None
            )
        return found

    async def send_text(self, conversation: str, text: str) -> str:
        channel = self._channel_for(conversation)
        sent = await channel.send(text)
        return str(sent.id)

    #: A progress note is a message like any other (its id kept, so it is edited in place).
    send_note = send_text

    async def send_file(self, conversation: str, path: Path, caption: str) -> str | None:
        channel = self._channel_for(conversation)
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
        channel = self._channel_for(conversation)
        await channel.typing()

    async def edit_text(self, conversation: str, message_id: str, text: str) -> bool:
        channel = self._channel_for(conversation)
        try:
            await channel.get_partial_message(int(message_id)).edit(content=text)
        except (discord.NotFound, discord.Forbidden):
            return False  # deleted, or not ours to edit: send a new note
        return True

    # -- asking (adapters.discord_questions) ---------------------------------------------------------------
    async def send_question(self, conversation: str, text: str, buttons: Sequence[Button]) -> str | None:
        channel = self._channel_for(conversation)
        sent = await channel.send(text, view=question_view(buttons))
        return str(sent.id)

    async def close_question(self, conversation: str, message_id: str, text: str) -> bool:
        channel = self._channel_for(conversation)
        try:
            await channel.get_partial_message(int(message_id)).edit(content=text, view=None)
        except (discord.NotFound, discord.Forbidden):
            return False  # deleted, or not ours to edit: the answer is sent as a new message
        return True
