"""The receiving half of the Slack channel (:mod:`adapters.slack`): Socket Mode envelopes and Events API
requests, read by :mod:`adapters.slack_events` and handed to the channel runner's intake.

Each Socket Mode envelope is acknowledged only after its message is committed; each HTTP request's signature
and timestamp are checked first (401 otherwise) and it is answered 200 only once its message is committed.
One chat's messages are taken in one at a time, in the order they came (:mod:`adapters.chat_turns`).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import aiohttp
import httpx
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from adapters import slack_events
from adapters.chat_turns import ChatTurns
from adapters.platform import Platform, pause_for_tests_after_fetch, safe_filename, upload_folder
from adapters.slack_events import SlackMessage
from shared.settings.channels import SlackSettings

#: Sender names looked up (``users.info``) are kept this long.
NAME_TTL_SECONDS = 3600.0


class SlackIntake:
    """Takes in what Slack sends to ``platform`` (whose ``inbox`` is the runner's intake): ``web`` looks up
    senders' names, ``files`` downloads what they share with ``bot_token`` from ``file_hosts``;
    ``verifier`` checks Events API requests (None with Socket Mode)."""

    def __init__(
        self,
        platform: Platform,
        config: SlackSettings,
        *,
        web: AsyncWebClient,
        files: httpx.AsyncClient,
        bot_token: str,
        bot_user_id: str,
        verifier: SignatureVerifier | None = None,
        file_hosts: frozenset[str] = frozenset({"files.slack.com"}),
    ) -> None:
        self.platform = platform
        self.config = config
        self.web = web
        self.files_http = files
        self.bot_token = bot_token
        self.bot_user_id = bot_user_id
        self.verifier = verifier
        #: Hosts the bot token is shown to for a download (Slack's own file host).
        self.file_hosts = file_hosts
        self.log = platform.log
        self.turns = ChatTurns()
        self._names: dict[str, tuple[str, float]] = {}

    # -- receiving: Socket Mode ------------------------------------------------------------------------------
    async def on_socket_request(self, client: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        """One envelope: take its message in, then acknowledge it. An error leaves it unacknowledged, so
        Slack delivers it again."""
        if request.type == "events_api":
            await self._on_event_callback(request.payload)
        elif request.type == "slash_commands":
            await self._on_slash(request.payload)
        elif request.type == "interactive":
            await self._on_interaction(request.payload)
        else:
            self.log.info("ignored a Socket Mode envelope of type %s", request.type)
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    # -- receiving: the Events API over HTTP -----------------------------------------------------------------
    def events_app(self) -> Starlette:
        """The ASGI app serving ``/slack/events`` (and ``/slack/commands``)."""
        return Starlette(
            routes=[
                Route("/slack/events", self._http_request, methods=["POST"]),
                Route("/slack/commands", self._http_request, methods=["POST"]),
            ]
        )

    async def _http_request(self, request: Request) -> Response:
        body = await request.body()
        if self.verifier is None or not self.verifier.is_valid_request(body, dict(request.headers)):
            self.log.warning("refused a Slack request with a bad, missing or old signature")
            return PlainTextResponse("invalid signature", status_code=401)
        retry = request.headers.get("x-slack-retry-num")
        if retry:
            self.log.info("Slack retry %s (%s)", retry, request.headers.get("x-slack-retry-reason", ""))
        form: dict[str, str] = {}
        payload: Any = None
        try:
            if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
                form = {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
            else:
                payload = json.loads(body)
        except ValueError as exc:
            # Signed by Slack but not what we understand: a retry would not help, so acknowledge.
            self.log.warning("ignored a signed Slack request of unexpected shape (%s)", exc)
            return Response(status_code=200)
        kind = payload.get("type") if isinstance(payload, dict) else None
        if kind == "url_verification":
            return JSONResponse({"challenge": str(payload.get("challenge") or "")})
        try:
            if "payload" in form:
                await self._on_interaction(json.loads(form["payload"]))
            elif "command" in form:
                await self._on_slash(form)
            elif kind == "event_callback":
                await self._on_event_callback(payload)
        except Exception:
            # Not committed: not acknowledged, so Slack sends it again.
            self.log.exception("could not take in a Slack event; Slack will retry it")
            return PlainTextResponse("try again", status_code=503, headers={"Retry-After": "5"})
        return Response(status_code=200)

    # -- receiving: both -----------------------------------------------------------------------------------
    async def _on_event_callback(self, payload: dict[str, Any]) -> None:
        event = payload.get("event")
        parsed = slack_events.parse_event(event, self.bot_user_id) if isinstance(event, dict) else None
        if parsed is None:
            return
        # Taken before the first await: one chat's messages in the order they came.
        async with self.turns.turn(parsed.inbound.conversation):
            await pause_for_tests_after_fetch(self.platform, "a Slack message")
            await self._take_in(parsed)

    async def _on_slash(self, payload: dict[str, Any]) -> None:
        inbound = slack_events.parse_slash(payload, self.config.slash_command)
        if inbound is None:
            return
        async with self.turns.turn(inbound.conversation):
            await self.platform.inbox.handle(inbound)

    async def _on_interaction(self, payload: dict[str, Any]) -> None:
        """A button pressed under a question: answered (by the runner), and the one who pressed told what it
        did, in a message only they see."""
        for press in slack_events.parse_presses(payload):
            told = (await self.platform.inbox.press(press)).text
            channel, thread, _ = slack_events.split_conversation(press.conversation)
            try:
                await self.web.chat_postEphemeral(
                    channel=channel, user=press.sender_id, text=slack_events.escape(told), thread_ts=thread
                )
            except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
                self.log.info("could not tell %s what their press did: %s", press.sender_id, exc)

    async def _take_in(self, parsed: SlackMessage) -> None:
        inbound = parsed.inbound
        sender = await self._name_of(inbound.sender_id)
        text, files = inbound.text, list[Path]()
        if parsed.files and await self.platform.inbox.may_download(inbound.sender_id):
            files, missed = await self._save_files(parsed)
            if missed:
                text = f"{text}\n(could not download: {', '.join(missed)})".strip()
        elif parsed.files and not text:
            text = "(an attachment)"  # a stranger still gets a pairing code, but nothing is downloaded
        await self.platform.inbox.handle(replace(inbound, sender=sender, text=text, files=files))

    async def _name_of(self, user: str) -> str:
        """The sender's display name (``users.info``, kept a while); their id when Slack does not say."""
        known = self._names.get(user)
        if known is not None and time.monotonic() - known[1] < NAME_TTL_SECONDS:
            return known[0]
        try:
            info = await self.web.users_info(user=user)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            self.log.info("could not look up Slack user %s: %s", user, exc)
            return user
        person = info.get("user") or {}
        profile = person.get("profile") or {}
        name = str(
            profile.get("display_name") or profile.get("real_name") or person.get("name") or user
        ).strip()
        if len(self._names) > 5000:
            self._names.clear()
        self._names[user] = (name, time.monotonic())
        return name

    async def _save_files(self, parsed: SlackMessage) -> tuple[list[Path], list[str]]:
        """Download the message's files (with the bot token, and only from Slack's own file host) into the
        chat's upload folder, once each; returns the files saved and the names of those that were not."""
        folder = upload_folder(self.platform, parsed.inbound.conversation)
        saved, missed = [], []
        for info in parsed.files:
            url = str(info.get("url_private_download") or info.get("url_private") or "")
            size = int(info.get("size") or 0)
            name = safe_filename(str(info.get("name") or info.get("title") or "file"))
            if urlparse(url).hostname not in self.file_hosts or size > self.config.download_max_bytes:
                self.log.info("not downloading Slack file %s (%s, %s bytes)", info.get("id"), url, size)
                missed.append(name)
                continue
            path = folder / f"{safe_filename(str(info.get('id') or 'file'))}-{name}"
            if not path.exists():
                try:
                    response = await self.files_http.get(
                        url, headers={"Authorization": f"Bearer {self.bot_token}"}
                    )
                    response.raise_for_status()
                except httpx.HTTPError as exc:
                    # The message is still taken in (and answered), without this file: a retry of the
                    # event would fail the same way, and the message would never be taken.
                    self.log.warning("could not download Slack file %s: %s", info.get("id"), exc)
                    missed.append(name)
                    continue
                tmp = path.with_name(path.name + ".part")
                tmp.write_bytes(response.content)
                tmp.replace(path)
            saved.append(path)
        return saved, missed
