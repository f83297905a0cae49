"""A small, faithful fake of Discord's REST API and gateway for end-to-end tests.

One ``aiohttp.web`` server on ``127.0.0.1`` (free port) runs in a background thread with its own event loop
and serves both halves:

* REST under ``/api/v10`` (``users/@me``, ``oauth2/applications/@me``, ``gateway[/bot]``, channel messages
  in JSON or multipart form, edits, typing, DM channels, channels, channel history with ``after``/``before``/
  ``limit`` answered newest first as Discord does), with JSON replies whose
  ``Content-Type`` is exactly ``application/json`` as discord.py requires;
* message components: action rows of buttons on message create and edit (checked as Discord checks them,
  kept on the message, ``components: []`` removes them); :meth:`FakeDiscord.press_button` has a user press
  one, dispatched as an ``INTERACTION_CREATE`` of type 3 (MESSAGE_COMPONENT), answered once within 3 s at
  ``POST /interactions/{id}/{token}/callback`` and followed up at ``POST /webhooks/{application_id}/{token}``
  (both authorised by the interaction's token, as on Discord);
* the gateway websocket at ``/gateway``: HELLO (op 10), HEARTBEAT (op 1) → ACK (op 11), IDENTIFY (op 2)
  → READY then one GUILD_CREATE per guild, RESUME (op 6) → replay + RESUMED, REQUEST_GUILD_MEMBERS (op 8)
  → GUILD_MEMBERS_CHUNK. When the client asks for ``compress=zlib-stream`` (discord.py does by default)
  frames are sent zlib-stream compressed, as Discord does; otherwise as text.

Like Discord it echoes the bot's own messages back as MESSAGE_CREATE, honours the GUILD_MESSAGES /
DIRECT_MESSAGES intents and blanks the content of guild messages that do not mention the bot when the
MESSAGE_CONTENT intent is missing.

Point discord.py at it (both are internal attributes; set them before ``Client.start``)::

    discord.http.Route.BASE = fake.api_base                      # "http://127.0.0.1:PORT/api/v10"
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Self, TypeVar

from aiohttp import BodyPartReader, WSMsgType, web

from tests.fakes.http_fake import ContextFake, wait_for_record

JSON = dict[str, Any]
T = TypeVar("T")

DISCORD_EPOCH_MS = 1_420_070_400_000

# Gateway intents (https://discord.com/developers/docs/topics/gateway#gateway-intents).
INTENT_GUILDS = 1 << 0
INTENT_GUILD_MEMBERS = 1 << 1
INTENT_GUILD_PRESENCES = 1 << 8
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_DIRECT_MESSAGES = 1 << 12
INTENT_MESSAGE_CONTENT = 1 << 15
PRIVILEGED_INTENTS = INTENT_GUILD_MEMBERS | INTENT_GUILD_PRESENCES | INTENT_MESSAGE_CONTENT

# Message types and channel types used here.
MESSAGE_DEFAULT = 0
MESSAGE_REPLY = 19
#: Interaction types, callback types and flags used here.
INTERACTION_MESSAGE_COMPONENT = 3
COMPONENT_ACTION_ROW = 1
COMPONENT_BUTTON = 2
CALLBACK_MESSAGE = 4
CALLBACK_DEFERRED_MESSAGE = 5
CALLBACK_DEFERRED_UPDATE = 6
CALLBACK_UPDATE_MESSAGE = 7
FLAG_EPHEMERAL = 1 << 6
#: An interaction must be answered this soon, and may be followed up this long (seconds).
INTERACTION_ANSWER_SECONDS = 3.0
INTERACTION_FOLLOWUP_SECONDS = 15 * 60
CHANNEL_GUILD_TEXT = 0
CHANNEL_DM = 1

_CONTENT_LIMIT = 2000
_FILE_LIMIT = 10
_EVENT_BUFFER = 1000


@dataclass(frozen=True)
class DiscordFile:
    """A file the bot uploaded (one ``files[n]`` part of a multipart message request)."""

    filename: str
    data: bytes
    content_type: str


@dataclass
class DiscordSent:
    """One user-visible thing the bot did: ``kind`` is ``"message"``, ``"edit"``, ``"typing"``,
    ``"interaction_response"`` (the answer to a press, at the callback endpoint; ``payload["type"]`` is the
    callback type) or ``"followup"`` (a message after it, on the interaction's webhook).

    ``payload`` is the decoded JSON body (``payload_json`` for multipart requests); ``message`` is the
    Message object the fake answered with (None for typing and most interaction responses).
    """

    kind: Literal["message", "edit", "typing", "interaction_response", "followup"]
    channel_id: int
    message_id: int | None = None
    content: str | None = None
    attachments: list[DiscordFile] = field(default_factory=list)
    reference_id: int | None = None
    payload: JSON = field(default_factory=dict)
    message: JSON | None = None
    at: float = field(default_factory=time.monotonic)

    @property
    def buttons(self) -> list[tuple[str, str, int]]:
        """``(label, custom_id, style)`` of the buttons the message has after this send or edit."""
        rows = (self.message or {}).get("components") or []
        return [
            (str(b.get("label") or ""), str(b.get("custom_id") or ""), int(b.get("style") or 0))
            for row in rows
            for b in row.get("components", [])
        ]

    @property
    def ephemeral(self) -> bool:
        """Whether only the one who pressed sees it (flag 64 on an interaction answer or followup)."""
        data = self.payload.get("data") if self.kind == "interaction_response" else self.payload
        return bool(int((data or {}).get("flags") or 0) & FLAG_EPHEMERAL)


@dataclass
class DiscordInteraction:
    """A press the fake dispatched (:meth:`FakeDiscord.press_button`) and how the bot answered it."""

    interaction_id: int
    token: str
    channel_id: int
    message_id: int
    custom_id: str
    user_id: int
    created: float = field(default_factory=time.monotonic)
    #: The callback type the bot answered with (None: not answered yet).
    answered_with: int | None = None


@dataclass(frozen=True)
class DiscordRequest:
    """One REST request the client made, with the status the fake answered."""

    method: str
    path: str
    status: int


class DiscordApiError(Exception):
    """An error answer of the REST API (``{"message": ..., "code": ...}``)."""

    def __init__(self, status: int, message: str, code: int = 0, errors: JSON | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: JSON = {"message": message, "code": code}
        if errors is not None:
            self.body["errors"] = errors


@dataclass(eq=False)
class _Connection:
    ws: web.WebSocketResponse
    compressor: Any | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    session: _Session | None = None
    closed_with: int | None = None

    async def send(self, payload: JSON) -> None:
        async with self.lock:
            if self.ws.closed:
                return
            text = json.dumps(payload, separators=(",", ":"))
            try:
                if self.compressor is None:
                    await self.ws.send_str(text)
                else:
                    data = self.compressor.compress(text.encode()) + self.compressor.flush(zlib.Z_SYNC_FLUSH)
                    await self.ws.send_bytes(data)
            except ConnectionResetError:
                # The client went away (a kill -9) and its socket is closing: as for a closed one, the event
                # is not sent; it stays in the session's buffer for a RESUME, as on Discord's gateway.
                return


@dataclass(eq=False)
class _Session:
    session_id: str
    intents: int
    seq: int = 0
    events: list[JSON] = field(default_factory=list)
    connection: _Connection | None = None


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # Exactly "application/json": discord.py compares the header verbatim and treats anything else as text.
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    return web.Response(status=status, body=json.dumps(body).encode(), headers=all_headers)


class FakeDiscord(ContextFake):
    """A fake Discord REST API + gateway running in a background thread on ``127.0.0.1``.

    Use it as a context manager (or :meth:`start` / :meth:`close`). Test-side methods are thread-safe and
    may be called from the test's own event loop thread: they hand work to the fake's loop.
    """

    def __init__(
        self,
        token: str = "MTAwMDAwMDAwMDAwMDAwMDAx.fake.discord-token-for-tests",
        *,
        bot_name: str = "agentpost",
        heartbeat_interval_ms: int = 41_250,
        allow_privileged_intents: bool = True,
        port: int = 0,
    ) -> None:
        self.token = token
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.allow_privileged_intents = allow_privileged_intents
        self._cond = threading.Condition()
        self._snowflake_seq = itertools.count()
        self._last_snowflake = 0
        self.bot_id = self.snowflake()
        self.bot_user: JSON = {
            "id": str(self.bot_id),
            "username": bot_name,
            "discriminator": "0",
            "global_name": None,
            "avatar": None,
            "bot": True,
            "public_flags": 0,
        }
        self._users: dict[int, JSON] = {self.bot_id: self.bot_user}
        self._channels: dict[int, JSON] = {}
        self._guilds: dict[int, JSON] = {}
        self._messages: dict[int, JSON] = {}
        self._files: dict[str, tuple[bytes, str]] = {}
        self._sessions: dict[str, _Session] = {}
        self._connections: set[_Connection] = set()
        self._sent: list[DiscordSent] = []
        self._interactions: dict[int, DiscordInteraction] = {}
        self._requests: list[DiscordRequest] = []
        self._rate_limits: list[float] = []
        #: (text a message's content contains, seconds its creation is held) — see :meth:`slow_message`.
        self._slow: list[tuple[str, float]] = []
        self._creating: dict[int, int] = {}
        #: The most message creations one channel had in flight at once.
        self.most_at_once: dict[int, int] = {}
        #: Message creations per channel in its current rate-limit window (see :meth:`report_rate_limits`).
        self._buckets: dict[int, tuple[float, int]] = {}
        self._bucket_size: tuple[int, float] | None = None
        #: Seconds every attachment download is held (see :meth:`slow_downloads`).
        self.download_delay = 0.0
        #: Seconds a press may wait for its answer before Discord forgets it (3 s; tests shorten it).
        self.answer_within = INTERACTION_ANSWER_SECONDS
        self.identifies = 0
        self.resumes = 0
        self.heartbeats = 0
        self.close_codes: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._port = port  # 0: a free one, chosen at start

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Start the event loop thread and bind a free port."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="fake-discord", daemon=True)
        self._thread.start()
        self._in_loop(self._start_server())
        return self

    def close(self) -> None:
        """Close gateway connections (1001 going away), stop the server and the loop."""
        loop = self._loop
        if loop is None:
            return
        try:
            self._in_loop(self._stop_server())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5)
            loop.close()
            self._loop = None

    async def _start_server(self) -> None:
        app = web.Application(middlewares=[self._record_middleware])
        api = "/api/v10"
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get(f"{api}/gateway", self._get_gateway)
        app.router.add_get(f"{api}/gateway/bot", self._get_gateway_bot)
        app.router.add_get(f"{api}/users/@me", self._get_me)
        app.router.add_get(f"{api}/oauth2/applications/@me", self._get_application)
        app.router.add_post(f"{api}/users/@me/channels", self._open_dm)
        app.router.add_get(f"{api}/channels/{{channel_id}}", self._get_channel)
        app.router.add_post(f"{api}/channels/{{channel_id}}/messages", self._create_message)
        app.router.add_get(f"{api}/channels/{{channel_id}}/messages", self._history)
        app.router.add_get(f"{api}/channels/{{channel_id}}/messages/{{message_id}}", self._get_message)
        app.router.add_patch(f"{api}/channels/{{channel_id}}/messages/{{message_id}}", self._edit_message)
        app.router.add_post(f"{api}/channels/{{channel_id}}/typing", self._typing)
        app.router.add_post(f"{api}/interactions/{{interaction_id}}/{{token}}/callback", self._callback)
        app.router.add_post(f"{api}/webhooks/{{application_id}}/{{token}}", self._followup)
        app.router.add_get("/attachments/{channel_id}/{attachment_id}/{filename}", self._download)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._port))
        self._port = sock.getsockname()[1]
        await web.SockSite(runner, sock).start()
        self._runner = runner

    async def _stop_server(self) -> None:
        for connection in list(self._connections):
            await self._close(connection, 1001, b"fake shutting down")
        if self._runner is not None:
            await self._runner.cleanup()

    def _in_loop(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the fake is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def url(self) -> str:
        """Root URL of the fake, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def api_base(self) -> str:
        """Value for ``discord.http.Route.BASE``."""
        return f"{self.url}/api/v10"

    @property
    def gateway_url(self) -> str:
        """Value for ``DiscordWebSocket.DEFAULT_GATEWAY`` (wrap it in ``yarl.URL``)."""
        return f"ws://127.0.0.1:{self._port}/gateway"

    # ------------------------------------------------------------------ test-side API

    def snowflake(self) -> int:
        """A new, increasing Discord snowflake id."""
        with self._cond:
            stamp = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
            value = max(stamp | (next(self._snowflake_seq) & 0xFFF), self._last_snowflake + 1)
            self._last_snowflake = value
            return value

    def add_user(self, user_id: int, username: str, *, bot: bool = False) -> JSON:
        """Register a user (authors of pushed messages are registered automatically)."""
        user: JSON = {
            "id": str(user_id),
            "username": username,
            "discriminator": "0",
            "global_name": username.title(),
            "avatar": None,
            "bot": bot,
            "public_flags": 0,
        }
        with self._cond:
            self._users.setdefault(user_id, user)
            return dict(self._users[user_id])

    def add_guild(self, guild_id: int, name: str = "Test Guild", channel_ids: Iterable[int] = ()) -> JSON:
        """Add the bot to a guild with text channels; connected clients get a GUILD_CREATE."""
        return self._in_loop(self._add_guild(guild_id, name, list(channel_ids)))

    def push_message(
        self,
        channel_id: int,
        content: str,
        author_id: int,
        author_name: str,
        guild_id: int | None = None,
        mentions: Sequence[int] | None = None,
        attachments: Sequence[tuple[str, bytes, str]] = (),
        reply_to: int | None = None,
    ) -> JSON:
        """Have a user post a message and dispatch MESSAGE_CREATE to connected clients; return the Message.

        With ``guild_id`` None the channel is (or becomes) the DM channel with the author. A guild or
        channel the bot does not know yet is created first (GUILD_CREATE / CHANNEL_CREATE), as when the
        bot is added to a server. ``mentions`` are user ids; when None they are taken from ``<@id>`` in
        ``content`` (mention the bot with ``f"<@{fake.bot_id}>"``). ``attachments`` are
        ``(filename, data, content_type)`` and are downloadable from the fake's CDN URL.
        """
        coro = self._push_message(
            channel_id, content, author_id, author_name, guild_id, mentions, attachments, reply_to
        )
        return self._in_loop(coro)

    def press_button(
        self, message_id: int, custom_id: str, user_id: int, username: str
    ) -> DiscordInteraction:
        """Have a user press the button ``custom_id`` under the message ``message_id``: an
        ``INTERACTION_CREATE`` (type 3, MESSAGE_COMPONENT) goes to connected clients, with the user as
        ``user`` in a DM and as ``member`` in a guild. Only a button the message has now can be pressed."""
        return self._in_loop(self._press_button(message_id, custom_id, user_id, username))

    @property
    def interactions(self) -> list[DiscordInteraction]:
        """The presses dispatched by :meth:`press_button`, oldest first, with how each was answered (copies)."""
        with self._cond:
            return [DiscordInteraction(**i.__dict__) for i in self._interactions.values()]

    def interaction(self, interaction_id: int) -> DiscordInteraction | None:
        """A press dispatched by :meth:`press_button`, with how it was answered (a copy), or None."""
        with self._cond:
            found = self._interactions.get(interaction_id)
            return None if found is None else DiscordInteraction(**found.__dict__)

    def request_reconnect(self) -> None:
        """Send RECONNECT (op 7) to every connected client; discord.py then reconnects and RESUMEs."""
        self._in_loop(self._broadcast_op(7, None))

    def rate_limit_next(self, retry_after: float = 0.2, times: int = 1) -> None:
        """Answer the next ``times`` message creations with a 429 (with ``Via`` so discord.py retries)."""
        with self._cond:
            self._rate_limits.extend([retry_after] * times)

    def report_rate_limits(self, limit: int = 5, window: float = 5.0) -> None:
        """Answer message creations with Discord's rate-limit headers (``limit`` per channel every
        ``window`` seconds), as Discord does. Without them discord.py assumes a limit of 1 and so sends one
        request per channel at a time by itself; with them it sends up to ``limit`` at once."""
        with self._cond:
            self._bucket_size = (limit, window)

    def slow_downloads(self, seconds: float) -> None:
        """Hold every attachment download for ``seconds`` (a slow CDN)."""
        self.download_delay = seconds

    def slow_message(self, containing: str, seconds: float) -> None:
        """Hold the creation of the next message whose content contains ``containing`` for ``seconds``
        before it is created and answered (a slow Discord: the request is in flight all that time)."""
        with self._cond:
            self._slow.append((containing, seconds))

    @property
    def sent(self) -> list[DiscordSent]:
        """Messages, edits and typing the bot produced, oldest first (a copy)."""
        with self._cond:
            return list(self._sent)

    @property
    def requests(self) -> list[DiscordRequest]:
        """Every REST request the client made, oldest first (a copy)."""
        with self._cond:
            return list(self._requests)

    def channel(self, channel_id: int) -> JSON | None:
        """A channel the fake knows, or None."""
        with self._cond:
            found = self._channels.get(channel_id)
            return None if found is None else dict(found)

    def wait_for(self, predicate: Callable[[DiscordSent], bool], timeout: float = 5.0) -> DiscordSent:
        """Block until a record in :attr:`sent` matches ``predicate``; return the first match."""

        def failure() -> str:
            seen = [(r.kind, r.channel_id, r.content) for r in self._sent]
            return f"fake Discord: no matching record after {timeout}s; sent {seen}"

        return wait_for_record(self._cond, lambda: self._sent, predicate, timeout, failure)

    async def wait_for_async(
        self, predicate: Callable[[DiscordSent], bool], timeout: float = 5.0
    ) -> DiscordSent:
        """:meth:`wait_for` for async tests: waits in a worker thread so the event loop keeps running."""
        return await asyncio.to_thread(self.wait_for, predicate, timeout)

    def wait_ready(self, timeout: float = 5.0) -> None:
        """Block until a client has identified and been sent READY (and its GUILD_CREATEs).

        discord.py fires ``on_ready`` only ``guild_ready_timeout`` seconds after the last GUILD_CREATE.
        """
        self._wait_state(lambda: self.identifies > 0, timeout, "IDENTIFY/READY")

    def wait_resumed(self, count: int = 1, timeout: float = 5.0) -> None:
        """Block until ``count`` RESUMEs have succeeded."""
        self._wait_state(lambda: self.resumes >= count, timeout, f"{count} RESUME(s)")

    def _wait_state(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(ready, timeout=timeout):
                raise TimeoutError(f"fake Discord: timed out after {timeout}s waiting for {what}")

    def _record(self, sent: DiscordSent) -> None:
        with self._cond:
            self._sent.append(sent)
            self._cond.notify_all()

    # ------------------------------------------------------------------ objects

    def _guild_channel(self, channel_id: int, guild_id: int, name: str, position: int) -> JSON:
        return {
            "id": str(channel_id),
            "type": CHANNEL_GUILD_TEXT,
            "guild_id": str(guild_id),
            "name": name,
            "position": position,
            "permission_overwrites": [],
            "nsfw": False,
            "parent_id": None,
            "topic": None,
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "flags": 0,
        }

    def _member(self, user: JSON, joined_at: str) -> JSON:
        return {
            "user": user,
            "nick": None,
            "avatar": None,
            "roles": [],
            "joined_at": joined_at,
            "premium_since": None,
            "deaf": False,
            "mute": False,
            "pending": False,
            "flags": 0,
        }

    def _dm_channel(self, user_id: int) -> JSON:
        with self._cond:
            for channel in self._channels.values():
                if channel["type"] == CHANNEL_DM and channel["recipients"][0]["id"] == str(user_id):
                    return channel
            channel = {
                "id": str(self.snowflake()),
                "type": CHANNEL_DM,
                "last_message_id": None,
                "flags": 0,
                "recipients": [self._users[user_id]],
            }
            self._channels[int(channel["id"])] = channel
            return channel

    def _attachment(self, channel_id: int, filename: str, data: bytes, content_type: str) -> JSON:
        attachment_id = self.snowflake()
        path = f"/attachments/{channel_id}/{attachment_id}/{filename}"
        with self._cond:
            self._files[path] = (data, content_type)
        return {
            "id": str(attachment_id),
            "filename": filename,
            "size": len(data),
            "url": f"{self.url}{path}",
            "proxy_url": f"{self.url}{path}",
            "content_type": content_type,
        }

    def _message(
        self,
        channel: JSON,
        author: JSON,
        content: str,
        mentions: Sequence[int],
        attachments: list[JSON],
        reference: JSON | None,
        *,
        store: bool = True,
    ) -> JSON:
        message: JSON = {
            "id": str(self.snowflake()),
            "channel_id": channel["id"],
            "author": author,
            "content": content,
            "timestamp": _now_iso(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [self._users[m] for m in mentions if m in self._users],
            "mention_roles": [],
            "attachments": attachments,
            "embeds": [],
            "pinned": False,
            "type": MESSAGE_DEFAULT,
            "flags": 0,
            "components": [],
        }
        if "guild_id" in channel:
            message["guild_id"] = channel["guild_id"]
            member = self._member(author, _now_iso())
            del member["user"]
            message["member"] = member
        if reference is not None:
            message["type"] = MESSAGE_REPLY
            message["message_reference"] = {
                "type": 0,
                "message_id": reference["id"],
                "channel_id": reference["channel_id"],
                **({"guild_id": reference["guild_id"]} if "guild_id" in reference else {}),
            }
            message["referenced_message"] = {k: v for k, v in reference.items() if k != "referenced_message"}
        if store:
            with self._cond:
                self._messages[int(message["id"])] = message
                channel["last_message_id"] = message["id"]
        return message

    # ------------------------------------------------------------------ loop-side state changes

    async def _add_guild(self, guild_id: int, name: str, channel_ids: list[int]) -> JSON:
        with self._cond:
            guild = self._guilds.get(guild_id)
            if guild is None:
                joined = _now_iso()
                guild = {
                    "id": str(guild_id),
                    "name": name,
                    "icon": None,
                    "owner_id": str(self.bot_id),
                    "afk_timeout": 300,
                    "verification_level": 0,
                    "default_message_notifications": 0,
                    "explicit_content_filter": 0,
                    "features": [],
                    "mfa_level": 0,
                    "system_channel_id": None,
                    "premium_tier": 0,
                    "preferred_locale": "en-US",
                    "nsfw_level": 0,
                    "joined_at": joined,
                    "large": False,
                    "member_count": 1,
                    "roles": [
                        {
                            "id": str(guild_id),
                            "name": "@everyone",
                            "permissions": "2248473465835073",
                            "position": 0,
                            "color": 0,
                            "hoist": False,
                            "managed": False,
                            "mentionable": False,
                            "flags": 0,
                        }
                    ],
                    "emojis": [],
                    "stickers": [],
                    "channels": [],
                    "members": [self._member(self.bot_user, joined)],
                    "voice_states": [],
                    "presences": [],
                    "threads": [],
                    "stage_instances": [],
                    "guild_scheduled_events": [],
                    "soundboard_sounds": [],
                }
                self._guilds[guild_id] = guild
                new_guild = True
            else:
                new_guild = False
            new_channels = []
            for channel_id in channel_ids:
                if channel_id in self._channels:
                    continue
                channel = self._guild_channel(channel_id, guild_id, f"channel-{len(guild['channels'])}", 0)
                channel["position"] = len(guild["channels"])
                self._channels[channel_id] = channel
                guild["channels"].append(channel)
                new_channels.append(channel)
        if new_guild:
            await self._dispatch("GUILD_CREATE", guild)
        else:
            for channel in new_channels:
                await self._dispatch("CHANNEL_CREATE", channel)
        return guild

    async def _push_message(
        self,
        channel_id: int,
        content: str,
        author_id: int,
        author_name: str,
        guild_id: int | None,
        mentions: Sequence[int] | None,
        attachments: Sequence[tuple[str, bytes, str]],
        reply_to: int | None,
    ) -> JSON:
        author = self.add_user(author_id, author_name)
        if guild_id is None:
            with self._cond:
                channel = self._channels.get(channel_id)
                if channel is None:
                    channel = {
                        "id": str(channel_id),
                        "type": CHANNEL_DM,
                        "last_message_id": None,
                        "flags": 0,
                        "recipients": [author],
                    }
                    self._channels[channel_id] = channel
            if channel["type"] != CHANNEL_DM:
                raise ValueError(f"channel {channel_id} is a guild channel; pass its guild_id")
        else:
            await self._add_guild(guild_id, f"Guild {guild_id}", [channel_id])
            with self._cond:
                channel = self._channels[channel_id]
                guild = self._guilds[guild_id]
                if not any(m["user"]["id"] == str(author_id) for m in guild["members"]):
                    guild["members"].append(self._member(author, _now_iso()))
            if channel.get("guild_id") != str(guild_id):
                raise ValueError(f"channel {channel_id} does not belong to guild {guild_id}")
        if mentions is None:
            mentions = _mentioned_ids(content)
        reference = None
        if reply_to is not None:
            with self._cond:
                reference = self._messages.get(reply_to)
            if reference is None:
                raise ValueError(f"unknown message {reply_to}")
        files = [self._attachment(channel_id, name, data, kind) for name, data, kind in attachments]
        message = self._message(channel, author, content, mentions, files, reference)
        await self._dispatch("MESSAGE_CREATE", message)
        return message

    async def _press_button(
        self, message_id: int, custom_id: str, user_id: int, username: str
    ) -> DiscordInteraction:
        author = self.add_user(user_id, username)
        with self._cond:
            message = self._messages.get(message_id)
            channel = None if message is None else self._channels.get(int(message["channel_id"]))
            if message is None or channel is None:
                raise ValueError(f"unknown message {message_id}")
            ids = [b.get("custom_id") for row in message["components"] for b in row["components"]]
            if custom_id not in ids:
                raise ValueError(f"message {message_id} has no button {custom_id!r} (it has {ids})")
            snapshot = dict(message)
        pressed = DiscordInteraction(
            interaction_id=self.snowflake(),
            token=f"aW50ZXJhY3Rpb24.{uuid.uuid4().hex}",
            channel_id=int(channel["id"]),
            message_id=message_id,
            custom_id=custom_id,
            user_id=user_id,
        )
        payload: JSON = {
            "id": str(pressed.interaction_id),
            "application_id": str(self.bot_id),
            "type": INTERACTION_MESSAGE_COMPONENT,
            "data": {"custom_id": custom_id, "component_type": COMPONENT_BUTTON},
            "channel": dict(channel),
            "channel_id": channel["id"],
            "message": snapshot,
            "token": pressed.token,
            "version": 1,
            "app_permissions": "2248473465835073",
            "locale": "en-US",
            "entitlements": [],
            "authorizing_integration_owners": {"0": str(channel.get("guild_id") or user_id)},
            "attachment_size_limit": 10 * 1024 * 1024,
        }
        if "guild_id" in channel:
            payload["guild_id"] = channel["guild_id"]
            payload["guild_locale"] = "en-US"
            payload["member"] = self._member(author, _now_iso()) | {"permissions": "2248473465835073"}
            payload["context"] = 0
        else:
            payload["user"] = author
            payload["context"] = 1
        with self._cond:
            self._interactions[pressed.interaction_id] = pressed
        await self._dispatch("INTERACTION_CREATE", payload)
        return DiscordInteraction(**pressed.__dict__)

    async def _broadcast_op(self, op: int, data: Any) -> None:
        for connection in list(self._connections):
            await connection.send({"op": op, "d": data, "s": None, "t": None})

    async def _dispatch(self, event: str, data: JSON, only: _Session | None = None) -> None:
        """Sequence ``event`` for every session (buffered for RESUME) and send it to connected ones."""
        targets = [only] if only is not None else list(self._sessions.values())
        for session in targets:
            shaped = _shape_for_intents(event, data, session.intents, self.bot_id)
            if shaped is None:
                continue
            session.seq += 1
            payload = {"op": 0, "t": event, "s": session.seq, "d": shaped}
            session.events.append(payload)
            del session.events[:-_EVENT_BUFFER]
            if session.connection is not None:
                await session.connection.send(payload)

    # ------------------------------------------------------------------ gateway

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        compress = request.query.get("compress") == "zlib-stream"
        connection = _Connection(ws=ws, compressor=zlib.compressobj() if compress else None)
        self._connections.add(connection)
        try:
            if request.query.get("encoding", "json") != "json":
                await self._close(connection, 4002, b"Error while decoding payload.")
                return ws
            hello = {"heartbeat_interval": self.heartbeat_interval_ms, "_trace": ["fake-gateway"]}
            await connection.send({"op": 10, "d": hello, "s": None, "t": None})
            async for frame in ws:
                if frame.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    break
                try:
                    payload = json.loads(frame.data)
                    op = payload["op"]
                except (ValueError, KeyError, TypeError):
                    await self._close(connection, 4002, b"Error while decoding payload.")
                    break
                await self._on_gateway_op(connection, op, payload.get("d"))
        finally:
            self._connections.discard(connection)
            if connection.session is not None and connection.session.connection is connection:
                connection.session.connection = None
            if connection.closed_with is None and ws.close_code is not None:
                with self._cond:  # closed by the client
                    self.close_codes.append(ws.close_code)
                    self._cond.notify_all()
        return ws

    async def _close(self, connection: _Connection, code: int, reason: bytes) -> None:
        """Close a gateway connection with ``code``, recorded before the client can react to it."""
        if connection.closed_with is None:
            connection.closed_with = code
            with self._cond:
                self.close_codes.append(code)
                self._cond.notify_all()
        await connection.ws.close(code=code, message=reason)

    async def _on_gateway_op(self, connection: _Connection, op: int, data: Any) -> None:
        if op == 1:
            with self._cond:
                self.heartbeats += 1
            await connection.send({"op": 11, "d": None, "s": None, "t": None})
        elif op == 2:
            await self._identify(connection, data)
        elif op == 6:
            await self._resume(connection, data)
        elif op == 8:
            if connection.session is None:
                await self._close(connection, 4003, b"Not authenticated.")
                return
            guild = self._guilds.get(int(data["guild_id"]))
            chunk = {
                "guild_id": data["guild_id"],
                "members": list(guild["members"]) if guild else [],
                "chunk_index": 0,
                "chunk_count": 1,
                "not_found": [],
            }
            if data.get("nonce") is not None:
                chunk["nonce"] = data["nonce"]
            await self._dispatch("GUILD_MEMBERS_CHUNK", chunk, only=connection.session)
        elif op in (3, 4):
            return  # presence / voice state updates: accepted and ignored
        else:
            await self._close(connection, 4001, b"Unknown opcode.")

    async def _identify(self, connection: _Connection, data: JSON) -> None:
        if connection.session is not None:
            await self._close(connection, 4005, b"Already authenticated.")
            return
        if data.get("token") != self.token:
            await self._close(connection, 4004, b"Authentication failed.")
            return
        intents = data.get("intents")
        if not isinstance(intents, int) or intents < 0:
            await self._close(connection, 4013, b"Invalid intent(s).")
            return
        if intents & PRIVILEGED_INTENTS and not self.allow_privileged_intents:
            await self._close(connection, 4014, b"Disallowed intent(s).")
            return
        session = _Session(session_id=uuid.uuid4().hex, intents=intents, connection=connection)
        connection.session = session
        self._sessions[session.session_id] = session
        ready = {
            "v": 10,
            "user": self.bot_user,
            "guilds": [{"id": g["id"], "unavailable": True} for g in self._guilds.values()],
            "session_id": session.session_id,
            "resume_gateway_url": self.gateway_url,
            "session_type": "normal",
            "application": {"id": str(self.bot_id), "flags": self._application_flags()},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": ["fake"],
            "user_settings": {},
            "_trace": ["fake-gateway"],
        }
        await self._dispatch("READY", ready, only=session)
        for guild in list(self._guilds.values()):
            await self._dispatch("GUILD_CREATE", dict(guild, unavailable=False), only=session)
        with self._cond:
            self.identifies += 1
            self._cond.notify_all()

    async def _resume(self, connection: _Connection, data: JSON) -> None:
        if data.get("token") != self.token:
            await self._close(connection, 4004, b"Authentication failed.")
            return
        session = self._sessions.get(str(data.get("session_id")))
        if session is None:
            await connection.send({"op": 9, "d": False, "s": None, "t": None})
            return
        if session.connection is not None and session.connection is not connection:
            await self._close(session.connection, 4009, b"Session resumed elsewhere.")
        session.connection = connection
        connection.session = session
        last_seen = data.get("seq") or 0
        for payload in list(session.events):
            if payload["s"] > last_seen:
                await connection.send(payload)
        await self._dispatch("RESUMED", {"_trace": ["fake-gateway"]}, only=session)
        with self._cond:
            self.resumes += 1
            self._cond.notify_all()

    def _application_flags(self) -> int:
        # GATEWAY_MESSAGE_CONTENT (1 << 18) when the privileged intent is enabled for the app.
        return (1 << 18) if self.allow_privileged_intents else 0

    # ------------------------------------------------------------------ REST

    @web.middleware
    async def _record_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        path = request.path
        try:
            # An interaction's callback and followups are authorised by its token in the path, not the bot's.
            by_token = path.startswith(("/api/v10/interactions/", "/api/v10/webhooks/"))
            needs_auth = path.startswith("/api/") and path != "/api/v10/gateway" and not by_token
            if needs_auth and request.headers.get("Authorization") != f"Bot {self.token}":
                raise DiscordApiError(401, "401: Unauthorized")
            response = await handler(request)
        except DiscordApiError as exc:
            response = _json_response(exc.body, exc.status)
        except web.HTTPNotFound:
            response = _json_response({"message": "404: Not Found", "code": 0}, 404)
        except web.HTTPMethodNotAllowed:
            response = _json_response({"message": "405: Method Not Allowed", "code": 0}, 405)
        if path != "/gateway":
            with self._cond:
                self._requests.append(DiscordRequest(request.method, path, response.status))
                self._cond.notify_all()
        return response

    async def _get_gateway(self, request: web.Request) -> web.Response:
        return _json_response({"url": self.gateway_url})

    async def _get_gateway_bot(self, request: web.Request) -> web.Response:
        limit = {"total": 1000, "remaining": 999, "reset_after": 86_400_000, "max_concurrency": 1}
        return _json_response({"url": self.gateway_url, "shards": 1, "session_start_limit": limit})

    async def _get_me(self, request: web.Request) -> web.Response:
        me = dict(self.bot_user, verified=True, mfa_enabled=False, flags=0, email=None, locale="en-US")
        return _json_response(me)

    async def _get_application(self, request: web.Request) -> web.Response:
        owner = self.add_user(self.bot_id - 1, "owner")
        return _json_response(
            {
                "id": str(self.bot_id),
                "name": self.bot_user["username"],
                "icon": None,
                "description": "",
                "summary": "",
                "type": None,
                "hook": True,
                "bot_public": True,
                "bot_require_code_grant": False,
                "verify_key": "0" * 64,
                "owner": owner,
                "team": None,
                "flags": self._application_flags(),
                "bot": self.bot_user,
                "redirect_uris": [],
                "interactions_endpoint_url": None,
            }
        )

    async def _open_dm(self, request: web.Request) -> web.Response:
        body = await request.json()
        recipient = int(body.get("recipient_id", 0))
        with self._cond:
            known = recipient in self._users and recipient != self.bot_id
        if not known:
            raise DiscordApiError(400, "Invalid Recipient(s)", 50033)
        return _json_response(self._dm_channel(recipient))

    def _known_channel(self, request: web.Request) -> JSON:
        with self._cond:
            channel = self._channels.get(int(request.match_info["channel_id"]))
        if channel is None:
            raise DiscordApiError(404, "Unknown Channel", 10003)
        return channel

    def _known_message(self, channel: JSON, message_id: str) -> JSON:
        with self._cond:
            message = self._messages.get(int(message_id))
        if message is None or message["channel_id"] != channel["id"]:
            raise DiscordApiError(404, "Unknown Message", 10008)
        return message

    async def _get_channel(self, request: web.Request) -> web.Response:
        return _json_response(self._known_channel(request))

    async def _history(self, request: web.Request) -> web.Response:
        """``GET /channels/{id}/messages``: at most ``limit`` (1-100, default 50) messages, newest first.
        With ``after``: the oldest ones after that id (still answered newest first); with ``before`` (or
        neither): the newest ones before it."""
        channel = self._known_channel(request)
        try:
            limit = int(request.query.get("limit", "50"))
            after = int(request.query["after"]) if "after" in request.query else None
            before = int(request.query["before"]) if "before" in request.query else None
        except ValueError:
            raise DiscordApiError(400, "Invalid Form Body", 50035) from None
        if not 1 <= limit <= 100:
            raise DiscordApiError(400, "Invalid Form Body", 50035)
        with self._cond:
            found = sorted(
                (m for m in self._messages.values() if m["channel_id"] == channel["id"]),
                key=lambda m: int(m["id"]),
            )
        if before is not None:
            found = [m for m in found if int(m["id"]) < before]
        # After an id: the oldest ones after it; otherwise the newest ones.
        found = [m for m in found if int(m["id"]) > after][:limit] if after is not None else found[-limit:]
        # Over REST a message carries no guild_id (only gateway events do).
        return _json_response([{k: v for k, v in m.items() if k != "guild_id"} for m in reversed(found)])

    async def _get_message(self, request: web.Request) -> web.Response:
        channel = self._known_channel(request)
        return _json_response(self._known_message(channel, request.match_info["message_id"]))

    async def _read_message_body(self, request: web.Request) -> tuple[JSON, list[DiscordFile]]:
        if request.content_type == "multipart/form-data":
            payload: JSON = {}
            indexed: dict[int, DiscordFile] = {}
            reader = await request.multipart()
            while True:
                part = await reader.next()
                if part is None:
                    break
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name == "payload_json":
                    payload = json.loads(await part.text())
                elif part.name and part.name.startswith("files[") and part.filename is not None:
                    index = int(part.name[len("files[") : -1])
                    kind = part.headers.get("Content-Type", "application/octet-stream")
                    indexed[index] = DiscordFile(part.filename, bytes(await part.read()), kind)
            return payload, [indexed[i] for i in sorted(indexed)]
        if request.content_type == "application/json":
            return await request.json(), []
        raise DiscordApiError(400, "Invalid Form Body", 50035)

    def _validate_content(self, payload: JSON, files: list[DiscordFile]) -> None:
        if "components" in payload:
            _check_components(payload["components"])
        content = payload.get("content")
        if content is not None and len(str(content)) > _CONTENT_LIMIT:
            errors = {
                "content": {
                    "_errors": [
                        {"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}
                    ]
                }
            }
            raise DiscordApiError(400, "Invalid Form Body", 50035, errors)
        if len(files) > _FILE_LIMIT:
            errors = {
                "files": {
                    "_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 10 or fewer in length."}]
                }
            }
            raise DiscordApiError(400, "Invalid Form Body", 50035, errors)

    async def _create_message(self, request: web.Request) -> web.Response:
        channel = self._known_channel(request)
        payload, files = await self._read_message_body(request)
        channel_id = int(channel["id"])
        content = str(payload.get("content") or "")
        with self._cond:
            self._creating[channel_id] = self._creating.get(channel_id, 0) + 1
            self.most_at_once[channel_id] = max(
                self.most_at_once.get(channel_id, 0), self._creating[channel_id]
            )
            slow = next((item for item in self._slow if item[0] in content), None)
            if slow is not None:
                self._slow.remove(slow)
        try:
            if slow is not None:
                await asyncio.sleep(slow[1])
            response = await self._create_message_now(channel, payload, files)
            self._add_rate_limit_headers(channel_id, response)
            return response
        finally:
            with self._cond:
                self._creating[channel_id] -= 1

    def _add_rate_limit_headers(self, channel_id: int, response: web.Response) -> None:
        with self._cond:
            if self._bucket_size is None:
                return
            limit, window = self._bucket_size
            now = time.time()
            start, used = self._buckets.get(channel_id, (now, 0))
            if now - start >= window:
                start, used = now, 0
            used += 1
            self._buckets[channel_id] = (start, used)
        response.headers.update(
            {
                "X-RateLimit-Limit": str(limit),
                "X-RateLimit-Remaining": str(max(0, limit - used)),
                "X-RateLimit-Reset": f"{start + window:.3f}",
                "X-RateLimit-Reset-After": f"{max(0.001, start + window - now):.3f}",
                # One bucket hash for the route, limits per channel (Discord's "major parameter").
                "X-RateLimit-Bucket": "fake-create-message",
            }
        )

    async def _create_message_now(
        self, channel: JSON, payload: JSON, files: list[DiscordFile]
    ) -> web.Response:
        with self._cond:
            retry_after = self._rate_limits.pop(0) if self._rate_limits else None
        if retry_after is not None:
            headers = {
                "Via": "1.1 google",
                "Retry-After": str(max(1, round(retry_after))),
                "X-RateLimit-Scope": "user",
            }
            body = {"message": "You are being rate limited.", "retry_after": retry_after, "global": False}
            return _json_response(body, 429, headers)
        self._validate_content(payload, files)
        content = str(payload.get("content") or "")
        if not content and not files and not payload.get("embeds") and not payload.get("sticker_ids"):
            raise DiscordApiError(400, "Cannot send an empty message", 50006)
        components = list(payload.get("components") or [])
        reference = None
        ref_payload = payload.get("message_reference")
        if isinstance(ref_payload, dict) and ref_payload.get("message_id") is not None:
            with self._cond:
                reference = self._messages.get(int(ref_payload["message_id"]))
            if reference is None and ref_payload.get("fail_if_not_exists", True):
                errors = {
                    "message_reference": {
                        "_errors": [
                            {"code": "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "message": "Unknown message"}
                        ]
                    }
                }
                raise DiscordApiError(400, "Invalid Form Body", 50035, errors)
        attachments = [
            self._attachment(int(channel["id"]), f.filename, f.data, f.content_type) for f in files
        ]
        mentions = _mentioned_ids(content)
        message = self._message(channel, self.bot_user, content, mentions, attachments, reference)
        message["components"] = components
        self._record(
            DiscordSent(
                kind="message",
                channel_id=int(channel["id"]),
                message_id=int(message["id"]),
                content=content,
                attachments=files,
                reference_id=None if reference is None else int(reference["id"]),
                payload=payload,
                message=dict(message),  # as sent: a later edit changes the stored one
            )
        )
        await self._dispatch("MESSAGE_CREATE", message)
        return _json_response(message)

    async def _edit_message(self, request: web.Request) -> web.Response:
        channel = self._known_channel(request)
        message = self._known_message(channel, request.match_info["message_id"])
        if message["author"]["id"] != str(self.bot_id):
            raise DiscordApiError(403, "Cannot edit a message authored by another user", 50005)
        payload, files = await self._read_message_body(request)
        self._validate_content(payload, files)
        with self._cond:
            if "content" in payload:
                message["content"] = str(payload["content"] or "")
            if "components" in payload:
                message["components"] = list(payload["components"] or [])
            if files:
                message["attachments"] = [
                    self._attachment(int(channel["id"]), f.filename, f.data, f.content_type) for f in files
                ]
            message["edited_timestamp"] = _now_iso()
            snapshot = dict(message)
        self._record(
            DiscordSent(
                kind="edit",
                channel_id=int(channel["id"]),
                message_id=int(message["id"]),
                content=snapshot["content"],
                attachments=files,
                payload=payload,
                message=snapshot,
            )
        )
        await self._dispatch("MESSAGE_UPDATE", snapshot)
        return _json_response(snapshot)

    def _pressed(self, request: web.Request, key: str) -> DiscordInteraction:
        """The interaction a callback or followup names (by id or application id) with its token."""
        token = request.match_info["token"]
        with self._cond:
            if key == "interaction_id":
                found = self._interactions.get(int(request.match_info[key]))
            else:
                found = next((i for i in self._interactions.values() if i.token == token), None)
                if request.match_info[key] != str(self.bot_id):
                    found = None
        if found is None or found.token != token:
            if key == "interaction_id":
                raise DiscordApiError(404, "Unknown interaction", 10062)
            raise DiscordApiError(404, "Unknown Webhook", 10015)
        return found

    async def _callback(self, request: web.Request) -> web.Response:
        """``POST /interactions/{id}/{token}/callback``: the one answer to a press, within 3 s."""
        pressed = self._pressed(request, "interaction_id")
        if time.monotonic() - pressed.created > self.answer_within:
            raise DiscordApiError(404, "Unknown interaction", 10062)
        payload, files = await self._read_message_body(request)
        kind = payload.get("type")
        if kind not in (
            CALLBACK_MESSAGE,
            CALLBACK_DEFERRED_MESSAGE,
            CALLBACK_DEFERRED_UPDATE,
            CALLBACK_UPDATE_MESSAGE,
        ):
            raise DiscordApiError(400, "Invalid Form Body", 50035)
        data = payload.get("data") or {}
        self._validate_content(data, files)
        if kind == CALLBACK_MESSAGE and not data.get("content") and not data.get("embeds"):
            raise DiscordApiError(400, "Cannot send an empty message", 50006)
        with self._cond:
            if pressed.answered_with is not None:
                raise DiscordApiError(400, "Interaction has already been acknowledged.", 40060)
            pressed.answered_with = int(kind)
            channel = self._channels[pressed.channel_id]
            target = self._messages.get(pressed.message_id)
        resource: JSON | None = None
        if kind == CALLBACK_UPDATE_MESSAGE and target is not None:
            with self._cond:
                for key in ("content", "components"):
                    if key in data:
                        target[key] = data[key] if key == "components" else str(data[key] or "")
                target["edited_timestamp"] = _now_iso()
                resource = dict(target)
        elif kind == CALLBACK_MESSAGE:
            resource = self._message(
                channel, self.bot_user, str(data.get("content") or ""), [], [], None, store=False
            )
            resource["flags"] = int(data.get("flags") or 0)
        self._record(
            DiscordSent(
                kind="interaction_response",
                channel_id=pressed.channel_id,
                message_id=pressed.message_id,
                content=None if "content" not in data else str(data["content"] or ""),
                payload=payload,
                message=resource,
            )
        )
        if kind == CALLBACK_UPDATE_MESSAGE and resource is not None:
            await self._dispatch("MESSAGE_UPDATE", resource)
        if request.query.get("with_response") not in ("1", "true", "True"):
            return web.Response(status=204)
        flags = int(data.get("flags") or 0)
        answer: JSON = {
            "interaction": {
                "id": str(pressed.interaction_id),
                "type": INTERACTION_MESSAGE_COMPONENT,
                "response_message_loading": kind == CALLBACK_DEFERRED_MESSAGE,
                "response_message_ephemeral": bool(flags & FLAG_EPHEMERAL),
            }
        }
        if resource is not None:
            answer["interaction"]["response_message_id"] = resource["id"]
            answer["resource"] = {"type": kind, "message": resource}
        return _json_response(answer)

    async def _followup(self, request: web.Request) -> web.Response:
        """``POST /webhooks/{application_id}/{token}``: a message after the answer to a press (for 15 min).
        An ephemeral one (flag 64) is seen only by the one who pressed: not in the channel, no event."""
        pressed = self._pressed(request, "application_id")
        if pressed.answered_with is None or time.monotonic() - pressed.created > INTERACTION_FOLLOWUP_SECONDS:
            raise DiscordApiError(404, "Unknown Webhook", 10015)
        payload, files = await self._read_message_body(request)
        self._validate_content(payload, files)
        content = str(payload.get("content") or "")
        if not content and not files and not payload.get("embeds"):
            raise DiscordApiError(400, "Cannot send an empty message", 50006)
        with self._cond:
            channel = self._channels[pressed.channel_id]
        flags = int(payload.get("flags") or 0)
        ephemeral = bool(flags & FLAG_EPHEMERAL)
        message = self._message(channel, self.bot_user, content, [], [], None, store=not ephemeral)
        message.update(
            flags=flags, webhook_id=str(self.bot_id), components=list(payload.get("components") or [])
        )
        self._record(
            DiscordSent(
                kind="followup",
                channel_id=pressed.channel_id,
                message_id=int(message["id"]),
                content=content,
                payload=payload,
                message=message,
            )
        )
        if not ephemeral:
            await self._dispatch("MESSAGE_CREATE", message)
        if request.query.get("wait") not in ("1", "true", "True"):
            return web.Response(status=204)
        return _json_response(message)

    async def _typing(self, request: web.Request) -> web.Response:
        channel = self._known_channel(request)
        self._record(DiscordSent(kind="typing", channel_id=int(channel["id"])))
        return web.Response(status=204)

    async def _download(self, request: web.Request) -> web.Response:
        with self._cond:
            found = self._files.get(request.path)
        if found is None:
            raise DiscordApiError(404, "404: Not Found")
        data, content_type = found
        if self.download_delay:
            await asyncio.sleep(self.download_delay)
        return web.Response(body=data, headers={"Content-Type": content_type})


def _check_components(rows: Any) -> None:
    """Refuse components Discord would refuse (Invalid Form Body): at most 5 action rows of at most 5
    buttons, each with a style; a label of at most 80 characters; a ``custom_id`` of at most 100 characters
    on every button but links, unique in the message."""

    def invalid(why: str) -> DiscordApiError:
        errors = {"components": {"_errors": [{"code": "COMPONENT_INVALID", "message": why}]}}
        return DiscordApiError(400, "Invalid Form Body", 50035, errors)

    if not isinstance(rows, list) or len(rows) > 5:
        raise invalid("Must be 5 or fewer in length.")
    seen: set[str] = set()
    for row in rows:
        if not isinstance(row, dict) or row.get("type") != COMPONENT_ACTION_ROW:
            raise invalid("Top-level components must be action rows.")
        buttons = row.get("components")
        if not isinstance(buttons, list) or not 1 <= len(buttons) <= 5:
            raise invalid("An action row holds 1 to 5 components.")
        for button in buttons:
            if not isinstance(button, dict) or button.get("type") != COMPONENT_BUTTON:
                raise invalid("Only buttons are supported by this fake.")
            style = button.get("style")
            if style not in (1, 2, 3, 4, 5):
                raise invalid("Value must be one of {1, 2, 3, 4, 5}.")
            if len(str(button.get("label") or "")) > 80:
                raise invalid("Must be 80 or fewer in length.")
            custom_id = button.get("custom_id")
            if style == 5:
                if not button.get("url") or custom_id is not None:
                    raise invalid("A link button has a url and no custom_id.")
                continue
            if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 100:
                raise invalid("A button needs a custom_id of 1 to 100 characters.")
            if custom_id in seen:
                raise invalid("Component custom id cannot be duplicated")
            seen.add(custom_id)


def _mentioned_ids(content: str) -> list[int]:
    ids: list[int] = []
    for token in content.split("<@")[1:]:
        digits = token.removeprefix("!").split(">", 1)[0]
        if digits.isdigit() and int(digits) not in ids:
            ids.append(int(digits))
    return ids


def _shape_for_intents(event: str, data: JSON, intents: int, bot_id: int) -> JSON | None:
    """Filter and redact an event the way Discord does for a session with ``intents``; None drops it."""
    if event in ("GUILD_CREATE", "CHANNEL_CREATE") and not intents & INTENT_GUILDS:
        return None
    if event not in ("MESSAGE_CREATE", "MESSAGE_UPDATE"):
        return data
    in_guild = "guild_id" in data
    if not intents & (INTENT_GUILD_MESSAGES if in_guild else INTENT_DIRECT_MESSAGES):
        return None
    mentioned = any(user["id"] == str(bot_id) for user in data.get("mentions", []))
    own = data["author"]["id"] == str(bot_id)
    if in_guild and not own and not mentioned and not intents & INTENT_MESSAGE_CONTENT:
        return dict(data, content="", embeds=[], attachments=[], components=[])
    return data
