"""The Slack channel: Slack's own Python SDK (``slack_sdk``), Socket Mode or the Events API over HTTP.

Receiving, one of two ways:

- **Socket Mode** when ``SLACK_APP_TOKEN`` is set (an app-level token with ``connections:write``): the adapter
  opens a WebSocket to Slack (``apps.connections.open``), so no public URL is needed — the self-hosted
  default. Each envelope is acknowledged only after the message it carries is committed
  (:meth:`adapters.intake.Intake.handle` returned); an envelope not acknowledged (the process was killed) is
  delivered again by Slack and is then a duplicate or taken in for the first time.
- **The Events API over HTTP** when ``SLACK_SIGNING_SECRET`` is set: ``POST /slack/events`` on
  ``SLACK_WEBHOOK_PORT`` (default 8788; slash commands may use the same URL or ``/slack/commands``). Every
  request's ``X-Slack-Signature`` and ``X-Slack-Request-Timestamp`` are checked
  (:class:`slack_sdk.signature.SignatureVerifier`: HMAC-SHA256 of ``v0:{timestamp}:{body}``, at most five
  minutes old) before the body is read as anything; a bad or old one is answered 401 and changes nothing.
  ``url_verification`` is answered with its challenge. Slack's retries (``X-Slack-Retry-Num``) carry the
  same event and are duplicates.

Either way :mod:`adapters.slack_intake` takes them in, read by :mod:`adapters.slack_events` (a direct
message always, elsewhere a mention of the bot; threads are conversations of their own), one chat's
messages one at a time in order. Files a known sender shares are downloaded with the bot token.

Sending: ``chat.postMessage`` (in the thread the message came from), live previews and progress notes edited
with ``chat.update``, files with the SDK's ``files_upload_v2`` (``files.getUploadURLExternal``, the upload,
``files.completeUploadExternal``), a pairing code in a channel as an ephemeral message only its sender sees,
an agent's question before a tool runs with Block Kit buttons (a press comes back as a ``block_actions``
interaction; the question is edited to its answer, its buttons gone).
A call Slack rate-limits (429) is sent again by the SDK after its ``Retry-After``
(``rate_limit_retries``); still refused, the reply waits at least that long before its next try. A channel
that is gone, archived or without the app, and a revoked token, fail the reply for good
(:func:`adapters.slack_events.classify_send_error`).

Environment: ``SLACK_BOT_TOKEN`` (always), ``SLACK_APP_TOKEN`` or ``SLACK_SIGNING_SECRET``, ``SLACK_API_URL``
(the Web API root, default ``https://slack.com/api/``), ``SLACK_WEBHOOK_PORT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

import aiohttp
import httpx
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from adapters import slack_events
from adapters.platform import (
    Button,
    ChannelSettings,
    Inbound,
    MissingSecret,
    Platform,
    SendFailure,
    run_until_stopped,
)
from adapters.slack_events import ephemeral, split_conversation
from adapters.slack_intake import SlackIntake
from adapters.web.limits import EmbeddedServer, start_webhook_server
from shared.chat.address import ChatAddress
from shared.settings.channels import SlackSettings
from shared.settings.model import SettingsError

DEFAULT_API = "https://slack.com/api/"
#: Slack's event payloads are small; anything larger is refused unread.
WEBHOOK_MAX_BODY_BYTES = 1024 * 1024
#: How long opening the Socket Mode connection may take before the start counts as failed (and is retried).
SOCKET_CONNECT_SECONDS = 30.0


class SlackChannel(Platform):
    """The Slack adapter (``agentpost run slack``)."""

    name: ClassVar[str] = "slack"
    prefix: ClassVar[str] = "slack"
    # Slack truncates text past 40,000 characters and advises 4,000; escaping (&lt;) adds a little.
    limit: ClassVar[int] = 3900
    settings_model: ClassVar[type[ChannelSettings]] = SlackSettings
    can_edit: ClassVar[bool] = True
    platform_label: ClassVar[str] = "Slack"
    long_reply_suffix: ClassVar[str] = ".md"

    config: SlackSettings
    web: AsyncWebClient | None = None
    socket: SocketModeClient | None = None
    files_http: httpx.AsyncClient | None = None
    server: EmbeddedServer | None = None
    server_task: asyncio.Task[None] | None = None
    #: The receiving half, made in :meth:`open`.
    intake: SlackIntake

    def read_secrets(self) -> None:
        self.bot_token = self.require_env("SLACK_BOT_TOKEN", "a bot token (xoxb-…, OAuth & Permissions)")
        self.app_token = self.env.get("SLACK_APP_TOKEN", "").strip()
        self.signing_secret = self.env.get("SLACK_SIGNING_SECRET", "").strip()
        if not (self.app_token or self.signing_secret):
            raise MissingSecret(
                "the slack adapter needs a way to receive messages: set SLACK_APP_TOKEN (Socket Mode: an "
                "app-level token with connections:write) or SLACK_SIGNING_SECRET (the Events API over HTTP)"
            )
        #: How messages arrive: ``socket`` (Socket Mode) or ``http`` (the Events API).
        self.mode = "socket" if self.app_token else "http"
        api = self.env.get("SLACK_API_URL") or self.config.api_url or DEFAULT_API
        self.api_url = api.rstrip("/") + "/"
        port_text = self.env.get("SLACK_WEBHOOK_PORT")
        try:
            self.port = int(port_text) if port_text else self.config.webhook_port
        except ValueError:
            raise SettingsError(f"SLACK_WEBHOOK_PORT={port_text!r} is not a port number") from None

    @property
    def client(self) -> AsyncWebClient:
        assert self.web is not None, "the adapter is not open"
        return self.web

    # -- lifecycle -----------------------------------------------------------------------------------------
    async def open(self) -> None:
        self.web = AsyncWebClient(
            token=self.bot_token,
            base_url=self.api_url,
            retry_handlers=[
                AsyncConnectionErrorRetryHandler(),
                AsyncRateLimitErrorRetryHandler(max_retry_count=self.config.rate_limit_retries),
            ],
        )
        me = await self.web.auth_test()
        self.files_http = httpx.AsyncClient(timeout=60.0, follow_redirects=True)
        self.intake = SlackIntake(
            self,
            self.config,
            web=self.web,
            files=self.files_http,
            bot_token=self.bot_token,
            bot_user_id=str(me.get("user_id") or ""),
            verifier=None if self.mode == "socket" else SignatureVerifier(self.signing_secret),
            # Slack's file host, and the Web API's when it is not Slack's (a proxy, a test's fake).
            file_hosts=frozenset({"files.slack.com", urlparse(self.api_url).hostname or "files.slack.com"}),
        )
        if self.mode == "socket":
            await self._open_socket()
        else:
            await self._open_http()

    async def _open_socket(self) -> None:
        self.socket = SocketModeClient(app_token=self.app_token, web_client=self.client)
        self.socket.socket_mode_request_listeners.append(self.intake.on_socket_request)
        # Asked here, once: a refused app token raises now instead of being retried inside connect().
        self.socket.wss_uri = await self.socket.issue_new_wss_url()
        await asyncio.wait_for(self.socket.connect(), SOCKET_CONNECT_SECONDS)  # type: ignore[no-untyped-call]
        self.log.info("Slack Socket Mode connected as %s", self.intake.bot_user_id)

    async def _open_http(self) -> None:
        self.server, self.server_task = await start_webhook_server(
            self.intake.events_app(),
            self.settings.api,
            host=self.config.webhook_host,
            port=self.port,
            max_body=WEBHOOK_MAX_BODY_BYTES,
            name="slack-events",
        )
        self.log.info("Slack events listening on %s:%s/slack/events", self.config.webhook_host, self.port)

    async def close(self) -> None:
        if self.socket is not None:
            with contextlib.suppress(Exception):
                await self.socket.close()  # type: ignore[no-untyped-call]
        if self.server is not None:
            self.server.should_exit = True
        if self.server_task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.server_task, 5)
        if self.files_http is not None:
            await self.files_http.aclose()
        if self.web is not None and self.web.session is not None:
            await self.web.session.close()
        self.socket = self.server = self.server_task = self.files_http = self.web = None

    def is_unreachable(self, exc: BaseException) -> bool:
        if isinstance(exc, SlackApiError):
            status, _, _ = slack_events.error_code(exc)
            return status >= 500 or status == 429  # Slack's trouble; a refused token is not
        return isinstance(exc, aiohttp.ClientConnectionError) or super().is_unreachable(exc)

    async def receive(self) -> None:
        if self.server_task is not None:
            await run_until_stopped(self.server_task, self.inbox.stop_event, "the Slack events server")
            return
        # The SDK's client reconnects by itself (Slack asks it to every few hours). A connection that stays
        # down ends the adapter, so its health says so and the supervisor starts it afresh.
        assert self.socket is not None
        limit = self.config.socket_down_seconds
        down_since: float | None = None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.inbox.stop_event.wait(), min(5.0, limit / 2))
                return
            if await self.socket.is_connected():
                down_since = None
                continue
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since >= limit:
                raise ConnectionError(f"the Slack Socket Mode connection has been down for {limit:g} s")

    def pairing_replies(self, message: Inbound, code: str) -> list[tuple[ChatAddress, str, str]]:
        """In a channel the code goes as a message only its sender sees (an ephemeral one)."""
        if message.metadata.get("channel_type") == "im":
            return super().pairing_replies(message, code)
        here = message.address_on(self.name)
        private = here._replace(conversation=ephemeral(message.conversation, message.sender_id))
        return [(private, super().pairing_replies(message, code)[0][1], "pairing")]

    # -- sending -------------------------------------------------------------------------------------------
    async def _post(self, conversation: str, text: str) -> str | None:
        channel, thread, user = split_conversation(conversation)
        if user:
            sent = await self.client.chat_postEphemeral(
                channel=channel, user=user, text=slack_events.escape(text), thread_ts=thread
            )
            return str(sent.get("message_ts") or "") or None
        posted = await self.client.chat_postMessage(
            channel=channel, text=text, thread_ts=thread, unfurl_links=False, unfurl_media=False
        )
        return str(posted.get("ts") or "") or None

    async def send_text(self, conversation: str, text: str) -> str | None:
        return await self._post(conversation, slack_events.to_mrkdwn(text))

    async def send_note(self, conversation: str, text: str) -> str:
        # Plain: a note quotes the agent's last step, which need not be valid Markdown.
        return await self._post(conversation, slack_events.escape(text)) or ""

    async def send_file(self, conversation: str, path: Path, caption: str) -> str | None:
        channel, thread, _ = split_conversation(conversation)
        done = await self.client.files_upload_v2(
            channel=channel,
            file=path.read_bytes(),
            filename=path.name,
            title=path.name,
            initial_comment=slack_events.escape(caption) if caption else None,
            thread_ts=thread,
        )
        files = done.get("files") or []
        return str(files[0].get("id") or "") or None if files else None

    async def edit_text(self, conversation: str, message_id: str, text: str) -> bool:
        return await self._update(conversation, message_id, slack_events.escape(text))

    async def edit_reply(self, conversation: str, message_id: str, text: str) -> bool:
        return await self._update(conversation, message_id, slack_events.to_mrkdwn(text))

    async def _update(
        self, conversation: str, message_id: str, text: str, blocks: list[dict[str, Any]] | None = None
    ) -> bool:
        channel, _, user = split_conversation(conversation)
        if user:
            return False  # an ephemeral message cannot be edited
        try:
            await self.client.chat_update(channel=channel, ts=message_id, text=text, blocks=blocks)
        except SlackApiError as exc:
            if slack_events.error_code(exc)[1] in slack_events.NOT_EDITABLE:
                return False
            raise
        return True

    async def send_question(self, conversation: str, text: str, buttons: Sequence[Button]) -> str | None:
        # Block Kit buttons; a press comes back as a block_actions interaction (adapters.slack_intake).
        channel, thread, _ = split_conversation(conversation)
        posted = await self.client.chat_postMessage(
            channel=channel,
            thread_ts=thread,
            text=slack_events.escape(text),  # shown in notifications
            blocks=slack_events.question_blocks(text, list(buttons)),
        )
        return str(posted.get("ts") or "") or None

    async def close_question(self, conversation: str, message_id: str, text: str) -> bool:
        # The buttons go with the blocks replaced by the answer's text.
        return await self._update(
            conversation, message_id, slack_events.escape(text), slack_events.text_blocks(text)
        )

    def preview_edit_seconds(self, conversation: str) -> float:
        return self.config.preview_edit_seconds

    def classify_send_error(self, exc: Exception) -> SendFailure:
        return slack_events.classify_send_error(exc)
