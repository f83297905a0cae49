"""A small, faithful fake of Slack for end-to-end tests: the Web API, signed event delivery, Socket Mode.

Three parts:

* :class:`FakeSlack`, an HTTP server on ``127.0.0.1`` (free port, background thread) answering the Web API
  methods the adapter calls at ``POST|GET /api/{method}`` as Slack does: parameters in the query string, a
  form or a JSON body; the token as ``Authorization: Bearer`` (or a ``token`` parameter); every answer
  ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``, HTTP 200 either way except a rate limit
  (429 with ``Retry-After``). Methods: ``auth.test`` (with the ``x-oauth-scopes`` header), ``chat.postMessage``,
  ``chat.update``, ``chat.postEphemeral``, ``users.info``, ``apps.connections.open`` (the app-level token;
  answers the Socket Mode URL), and the three steps of a file upload (``files.getUploadURLExternal``, a POST
  of the bytes to the URL it gave, ``files.completeUploadExternal``); ``GET /files/{id}/{name}`` serves a
  file a test added, to the bot token only. Channels can be archived or left (``is_archived``,
  ``not_in_channel``), a method rate-limited or failed for the next calls, and the N-th ``chat.postMessage``
  held in flight (:meth:`FakeSlack.hold_post`). :attr:`FakeSlack.sent` records every send and edit that
  Slack accepted, in order; :attr:`FakeSlack.calls` every call.
* A Socket Mode WebSocket server (the ``websockets`` library, its own thread and loop): a connection gets a
  ``hello``; :meth:`FakeSlack.push_event` and :meth:`FakeSlack.push_slash` send envelopes; acknowledgements
  are recorded (:attr:`FakeSlack.acks`), and an envelope not acknowledged is sent again, with its
  ``retry_attempt`` counted, to the next connection (as Slack redelivers).
* Builders for the Events API: :func:`message_event`, :func:`event_callback`, :func:`slash_form`, and
  :func:`signed_headers` / :func:`post_signed`, which sign a raw body as Slack does
  (``X-Slack-Signature: v0=<hex HMAC-SHA256(secret, "v0:{timestamp}:{body}")>``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
from websockets.asyncio.server import Server, ServerConnection, serve

from tests.fakes.http_fake import RoutedHandler, ThreadedHttpFake, wait_for_record

JSON = dict[str, Any]

#: The scopes the adapter needs (docs/slack.md); auth.test reports them in ``x-oauth-scopes``.
BOT_SCOPES = "chat:write,channels:history,groups:history,im:history,mpim:history,files:read,files:write,users:read,commands"


@dataclass(frozen=True)
class SlackSent:
    """One thing Slack accepted and a person sees: ``post`` (chat.postMessage), ``update`` (chat.update),
    ``ephemeral`` (chat.postEphemeral: only ``user`` sees it) or ``file`` (a completed upload)."""

    kind: str
    channel: str
    text: str
    ts: str
    thread_ts: str | None = None
    user: str | None = None
    filename: str = ""
    data: bytes = b""
    #: Block Kit blocks sent with it (a question's buttons are in an ``actions`` block).
    blocks: tuple[JSON, ...] = ()
    at: float = field(default_factory=time.monotonic)

    @property
    def buttons(self) -> list[JSON]:
        """The buttons among :attr:`blocks`."""
        return [e for b in self.blocks if b.get("type") == "actions" for e in b.get("elements") or ()]


@dataclass(frozen=True)
class SlackCall:
    """One Web API request with what the fake answered (``error`` empty when ``ok``)."""

    method: str
    params: JSON
    status: int
    error: str
    at: float = field(default_factory=time.monotonic)


@dataclass
class _Envelope:
    envelope_id: str
    body: JSON
    deliveries: int = 0


class FakeSlack(ThreadedHttpFake):
    """The fake Slack (see the module docstring). ``with FakeSlack() as slack:`` starts both servers."""

    handler_class = RoutedHandler
    thread_name = "fake-slack"

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-test-token",
        app_token: str = "xapp-test-token",
        bot_user_id: str = "UBOT",
        team_id: str = "T0001",
        scopes: str = BOT_SCOPES,
    ) -> None:
        super().__init__()
        self.bot_token, self.app_token, self.bot_user_id = bot_token, app_token, bot_user_id
        self.team_id, self.scopes = team_id, scopes
        self._cond = threading.Condition()
        self.sent: list[SlackSent] = []
        self.calls: list[SlackCall] = []
        #: Ids of the files downloaded with the bot token, in order.
        self.downloads: list[str] = []
        self.users: dict[str, str] = {}
        self.archived: set[str] = set()
        self.not_member: set[str] = set()
        self._messages: dict[str, dict[str, str]] = {}
        self._files: dict[str, tuple[str, bytes]] = {}
        self._uploads: dict[str, tuple[str, bytes | None]] = {}
        self._failures: list[tuple[str, int, str, float]] = []
        self._ids = itertools.count(1)
        self._hold_at: int | None = None
        self._posts_seen = 0
        self.held = threading.Event()
        self._release = threading.Event()
        # Socket Mode
        self.acks: list[str] = []
        self.connections = 0
        self._envelopes: dict[str, _Envelope] = {}
        self._ws_loop: asyncio.AbstractEventLoop | None = None
        self._ws_server: Server | None = None
        self._ws_thread: threading.Thread | None = None
        self._ws_current: ServerConnection | None = None
        self._ws_port = 0

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> Self:
        super().start()
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._ws_loop = loop

            async def main() -> None:
                self._ws_server = await serve(self._socket_session, "127.0.0.1", 0)
                self._ws_port = next(iter(self._ws_server.sockets)).getsockname()[1]
                ready.set()
                await self._ws_server.wait_closed()

            loop.run_until_complete(main())
            loop.close()

        self._ws_thread = threading.Thread(target=run, name="fake-slack-socket", daemon=True)
        self._ws_thread.start()
        ready.wait(10)
        return self

    def close(self) -> None:
        self._release.set()
        if self._ws_loop is not None and self._ws_server is not None:
            self._ws_loop.call_soon_threadsafe(self._ws_server.close)
        if self._ws_thread is not None:
            self._ws_thread.join(5)
        super().close()

    @property
    def api_url(self) -> str:
        """The Web API root to give the SDK (``SLACK_API_URL``)."""
        return f"{self.url}/api/"

    @property
    def socket_url(self) -> str:
        return f"ws://127.0.0.1:{self._ws_port}/link/"

    # -- what a test arranges ----------------------------------------------------------------------------------
    def add_user(self, user_id: str, name: str) -> None:
        with self._cond:
            self.users[user_id] = name

    def add_file(self, name: str, data: bytes, mimetype: str = "text/plain") -> JSON:
        """A file a user shared: the object Slack puts in a message event's ``files``."""
        with self._cond:
            file_id = f"F{next(self._ids):08d}"
            self._files[file_id] = (name, data)
        return {
            "id": file_id,
            "name": name,
            "title": name,
            "mimetype": mimetype,
            "size": len(data),
            "url_private": f"{self.url}/files/{file_id}/{name}",
            "url_private_download": f"{self.url}/files/{file_id}/download/{name}",
        }

    def fail_next(
        self, method: str, error: str, *, status: int = 200, retry_after: float = 0, times: int = 1
    ) -> None:
        """The next ``times`` calls of ``method`` fail with ``error`` (``status`` 429 sends ``Retry-After``)."""
        with self._cond:
            self._failures.extend([(method, status, error, retry_after)] * times)

    def rate_limit_next(self, method: str, retry_after: float = 1, times: int = 1) -> None:
        self.fail_next(method, "ratelimited", status=429, retry_after=retry_after, times=times)

    def hold_post(self, nth: int) -> None:
        """Hold the ``nth`` chat.postMessage from now on until :meth:`release`; it then fails with 502 and
        is not recorded (as if it never reached Slack: the adapter was killed while it was in flight)."""
        with self._cond:
            self._hold_at, self._posts_seen = nth, 0
            self.held.clear()
            self._release.clear()

    def release(self) -> None:
        self._release.set()

    # -- what a test reads ------------------------------------------------------------------------------------
    def texts(
        self, channel: str, thread_ts: str | None = None, kinds: tuple[str, ...] = ("post",)
    ) -> list[str]:
        """Texts of ``kinds`` sent to ``channel`` (and ``thread_ts``: None means top level), oldest first."""
        with self._cond:
            return [
                s.text
                for s in self.sent
                if s.kind in kinds and s.channel == channel and s.thread_ts == thread_ts
            ]

    def shown(self, channel: str, ts: str) -> str | None:
        """The text a message shows now (after its edits)."""
        with self._cond:
            return self._messages.get(channel, {}).get(ts)

    def wait_sent(self, predicate: Callable[[SlackSent], bool], timeout: float = 30.0) -> SlackSent:
        return wait_for_record(
            self._cond, lambda: list(self.sent), predicate, timeout, lambda: f"not sent; sent: {self.sent!r}"
        )

    def wait_ack(self, envelope_id: str, timeout: float = 30.0) -> None:
        wait_for_record(
            self._cond,
            lambda: list(self.acks),
            lambda a: a == envelope_id,
            timeout,
            lambda: f"no ack of {envelope_id}",
        )

    def wait_connected(self, connections: int = 1, timeout: float = 30.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.connections >= connections, timeout):
                raise TimeoutError(f"{self.connections} Socket Mode connections, waited for {connections}")

    # -- the Web API ------------------------------------------------------------------------------------------
    def answer(
        self, verb: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        url = urlsplit(target)
        path = url.path
        if path.startswith("/upload/") and verb == "POST":
            return self._upload(path.removeprefix("/upload/"), body)
        if path.startswith("/files/") and verb == "GET":
            return self._download(path, headers)
        if not path.startswith("/api/"):
            return 404, b"not found", {"Content-Type": "text/plain"}
        method = path.removeprefix("/api/")
        params: JSON = dict(parse_qsl(url.query, keep_blank_values=True))
        content_type = headers.get("content-type", "")
        if body and content_type.startswith("application/json"):
            params.update(json.loads(body))
        elif body:
            params.update(parse_qsl(body.decode(), keep_blank_values=True))
        token = headers.get("authorization", "").removeprefix("Bearer ").strip() or str(
            params.pop("token", "")
        )
        status, answer, extra = self._api(method, params, token)
        with self._cond:
            self.calls.append(
                SlackCall(method, params, status, "" if answer.get("ok") else str(answer.get("error")))
            )
            self._cond.notify_all()
        return (
            status,
            json.dumps(answer).encode(),
            {"Content-Type": "application/json; charset=utf-8", **extra},
        )

    def _api(self, method: str, params: JSON, token: str) -> tuple[int, JSON, dict[str, str]]:
        expected = self.app_token if method == "apps.connections.open" else self.bot_token
        if token != expected:
            return 200, {"ok": False, "error": "invalid_auth" if token else "not_authed"}, {}
        if method == "chat.postMessage" and self._hold_if_asked():
            return 502, {"ok": False, "error": "bad_gateway"}, {}
        with self._cond:
            failure = next((f for f in self._failures if f[0] == method), None)
            if failure is not None:
                self._failures.remove(failure)
        if failure is not None:
            _, status, error, retry_after = failure
            extra = {"Retry-After": f"{retry_after:g}"} if status == 429 else {}
            return status, {"ok": False, "error": error}, extra
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            return 200, {"ok": False, "error": "unknown_method"}, {}
        try:
            result: JSON = handler(params)
        except _Refused as refused:
            return 200, {"ok": False, "error": refused.error}, {}
        extra = {"x-oauth-scopes": self.scopes} if method == "auth.test" else {}
        return 200, {"ok": True, **result}, extra

    def _hold_if_asked(self) -> bool:
        with self._cond:
            self._posts_seen += 1
            hold = self._hold_at is not None and self._posts_seen == self._hold_at
            if hold:
                self._hold_at = None
        if hold:
            self.held.set()
            self._release.wait(30)
        return hold

    def _ts(self) -> str:
        return new_ts()  # one counter with the tests' own timestamps: never the same ts twice

    def _writable(self, channel: str) -> None:
        if not channel:
            raise _Refused("channel_not_found")
        if channel in self.archived:
            raise _Refused("is_archived")
        if channel in self.not_member:
            raise _Refused("not_in_channel")

    def _record(self, sent: SlackSent) -> None:
        with self._cond:
            self.sent.append(sent)
            if sent.kind in ("post", "update"):
                self._messages.setdefault(sent.channel, {})[sent.ts] = sent.text
            self._cond.notify_all()

    def _m_auth_test(self, params: JSON) -> JSON:
        return {
            "url": "https://fake.slack.test/",
            "team": "Fake team",
            "user": "agentpost",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": "B" + self.bot_user_id,
        }

    def _m_chat_postMessage(self, params: JSON) -> JSON:
        channel, text = str(params.get("channel") or ""), str(params.get("text") or "")
        self._writable(channel)
        if not text and not params.get("blocks"):
            raise _Refused("no_text")
        thread = str(params.get("thread_ts") or "") or None
        ts = self._ts()
        self._record(SlackSent("post", channel, text, ts, thread, blocks=_blocks(params)))
        return {"channel": channel, "ts": ts, "message": {"text": text, "ts": ts, "user": self.bot_user_id}}

    def _m_chat_update(self, params: JSON) -> JSON:
        channel, ts, text = (
            str(params.get("channel") or ""),
            str(params.get("ts") or ""),
            str(params.get("text") or ""),
        )
        self._writable(channel)
        with self._cond:
            if ts not in self._messages.get(channel, {}):
                raise _Refused("message_not_found")
        self._record(SlackSent("update", channel, text, ts, blocks=_blocks(params)))
        return {"channel": channel, "ts": ts, "text": text}

    def _m_chat_postEphemeral(self, params: JSON) -> JSON:
        channel, user = str(params.get("channel") or ""), str(params.get("user") or "")
        self._writable(channel)
        ts = self._ts()
        thread = str(params.get("thread_ts") or "") or None
        self._record(SlackSent("ephemeral", channel, str(params.get("text") or ""), ts, thread, user))
        return {"message_ts": ts}

    def _m_users_info(self, params: JSON) -> JSON:
        user = str(params.get("user") or "")
        with self._cond:
            name = self.users.get(user)
        if name is None:
            raise _Refused("user_not_found")
        return {
            "user": {"id": user, "name": name.lower(), "profile": {"display_name": name, "real_name": name}}
        }

    def _m_apps_connections_open(self, params: JSON) -> JSON:
        return {"url": f"{self.socket_url}?ticket={uuid.uuid4()}&app_id=A0001"}

    def _m_files_getUploadURLExternal(self, params: JSON) -> JSON:
        name, length = str(params.get("filename") or ""), int(params.get("length") or 0)
        if not name or length <= 0:
            raise _Refused("invalid_arguments")
        with self._cond:
            file_id = f"F{next(self._ids):08d}"
            self._uploads[file_id] = (name, None)
        return {"upload_url": f"{self.url}/upload/{file_id}", "file_id": file_id}

    def _upload(self, file_id: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        with self._cond:
            if file_id not in self._uploads:
                return 404, b"unknown upload", {"Content-Type": "text/plain"}
            self._uploads[file_id] = (self._uploads[file_id][0], body)
        return 200, f"OK - {len(body)}".encode(), {"Content-Type": "text/plain"}

    def _m_files_completeUploadExternal(self, params: JSON) -> JSON:
        files = json.loads(str(params.get("files") or "[]"))
        channel = str(params.get("channel_id") or "")
        self._writable(channel)
        thread = str(params.get("thread_ts") or "") or None
        done = []
        for item in files:
            with self._cond:
                name, data = self._uploads.pop(str(item.get("id")), ("", None))
            if data is None:
                raise _Refused("file_not_found")
            ts = self._ts()
            comment = str(params.get("initial_comment") or "")
            self._record(SlackSent("file", channel, comment, ts, thread, filename=name, data=data))
            done.append({"id": item["id"], "name": name, "title": item.get("title") or name})
        return {"files": done}

    def _download(self, path: str, headers: Mapping[str, str]) -> tuple[int, bytes, dict[str, str]]:
        file_id = path.split("/")[2]
        if headers.get("authorization", "") != f"Bearer {self.bot_token}":
            return 403, b"<html>sign in</html>", {"Content-Type": "text/html"}
        with self._cond:
            found = self._files.get(file_id)
            if found is not None:
                self.downloads.append(file_id)
        if found is None:
            return 404, b"not found", {"Content-Type": "text/plain"}
        return 200, found[1], {"Content-Type": "application/octet-stream"}

    # -- Socket Mode --------------------------------------------------------------------------------------------
    def push_event(self, event: JSON) -> str:
        """Send an Events API envelope carrying ``event``; returns its envelope id."""
        return self._push("events_api", event_callback(event, team=self.team_id))

    def push_slash(self, command: str, text: str, *, channel: str, user: str) -> str:
        return self._push("slash_commands", slash_form(command, text, channel=channel, user=user))

    def drop_socket(self) -> None:
        """Close the Socket Mode connection and hand out no new one (``apps.connections.open`` fails)."""
        self.fail_next("apps.connections.open", "internal_error", times=10_000)
        assert self._ws_loop is not None

        async def close() -> None:
            if self._ws_current is not None:
                await self._ws_current.close()

        asyncio.run_coroutine_threadsafe(close(), self._ws_loop).result(10)

    def ask_to_reconnect(self) -> None:
        """Tell the connected client to reconnect (Slack does so every few hours: ``refresh_requested``)."""
        assert self._ws_loop is not None

        async def send() -> None:
            if self._ws_current is not None:
                await self._ws_current.send(json.dumps({"type": "disconnect", "reason": "refresh_requested"}))

        asyncio.run_coroutine_threadsafe(send(), self._ws_loop).result(10)

    def push_press(self, message: SlackSent, button: JSON, *, user: str) -> str:
        """``user`` presses ``button`` under ``message`` (a ``block_actions`` interaction)."""
        return self._push(
            "interactive",
            block_actions(message.channel, message.ts, button, user=user, thread_ts=message.thread_ts),
        )

    def _push(self, kind: str, payload: JSON) -> str:
        envelope_id = str(uuid.uuid4())
        body = {
            "envelope_id": envelope_id,
            "type": kind,
            "payload": payload,
            "accepts_response_payload": False,
        }
        with self._cond:
            self._envelopes[envelope_id] = _Envelope(envelope_id, body)
        assert self._ws_loop is not None
        asyncio.run_coroutine_threadsafe(self._send_pending(), self._ws_loop).result(10)
        return envelope_id

    async def _send_pending(self) -> None:
        connection = self._ws_current
        if connection is None:
            return  # sent when a client connects
        with self._cond:
            waiting = [
                e for e in self._envelopes.values() if e.envelope_id not in self.acks and e.deliveries == 0
            ]
            for envelope in waiting:
                envelope.deliveries += 1
        for envelope in waiting:
            await connection.send(json.dumps({**envelope.body, "retry_attempt": 0, "retry_reason": ""}))

    async def _socket_session(self, connection: ServerConnection) -> None:
        with self._cond:
            self.connections += 1
            self._cond.notify_all()
            again = [e for e in self._envelopes.values() if e.envelope_id not in self.acks]
            for envelope in again:
                envelope.deliveries += 1
        self._ws_current = connection
        await connection.send(
            json.dumps({"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A0001"}})
        )
        for envelope in again:  # not acknowledged on an earlier connection: Slack sends it again
            retry = envelope.deliveries - 1
            reason = "timeout" if retry else ""
            await connection.send(
                json.dumps({**envelope.body, "retry_attempt": retry, "retry_reason": reason})
            )
        try:
            async for raw in connection:
                message = json.loads(raw)
                if isinstance(message, dict) and message.get("envelope_id"):
                    with self._cond:
                        self.acks.append(str(message["envelope_id"]))
                        self._cond.notify_all()
        except Exception:
            pass  # the client went away (killed): its unacknowledged envelopes wait for the next one
        finally:
            if self._ws_current is connection:
                self._ws_current = None


def _blocks(params: JSON) -> tuple[JSON, ...]:
    blocks = params.get("blocks")
    if isinstance(blocks, str):  # form-encoded calls send them as JSON text
        blocks = json.loads(blocks)
    return tuple(b for b in blocks or () if isinstance(b, dict))


class _Refused(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


# -- the Events API, from Slack's side ---------------------------------------------------------------------------
_ts_counter = itertools.count(1)


def new_ts() -> str:
    """A message timestamp as Slack makes them (seconds.micro), unique in the test run."""
    return f"{int(time.time())}.{next(_ts_counter):06d}"


def message_event(
    channel: str,
    user: str,
    text: str,
    *,
    ts: str | None = None,
    thread_ts: str | None = None,
    channel_type: str = "im",
    files: list[JSON] | None = None,
    subtype: str | None = None,
    bot_id: str | None = None,
) -> JSON:
    """A ``message`` event as Slack sends it (``message.im``, ``message.channels`` ...)."""
    event: JSON = {
        "type": "message",
        "channel": channel,
        "user": user,
        "text": text,
        "ts": ts or new_ts(),
        "channel_type": channel_type,
        "client_msg_id": str(uuid.uuid4()),
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    if files:
        event["files"] = files
        event["subtype"] = "file_share"
    if subtype:
        event["subtype"] = subtype
    if bot_id:
        event["bot_id"] = bot_id
    return event


def event_callback(event: JSON, *, team: str = "T0001") -> JSON:
    """The Events API body that carries ``event``."""
    return {
        "token": "deprecated-verification-token",
        "team_id": team,
        "api_app_id": "A0001",
        "event": {**event, "team": team},
        "type": "event_callback",
        "event_id": f"Ev{uuid.uuid4().hex[:10].upper()}",
        "event_time": int(time.time()),
    }


def slash_form(command: str, text: str, *, channel: str, user: str) -> JSON:
    """A slash command's fields (form-encoded over HTTP, a dict in a Socket Mode envelope)."""
    return {
        "command": command,
        "text": text,
        "channel_id": channel,
        "user_id": user,
        "user_name": user.lower(),
        "team_id": "T0001",
        "trigger_id": uuid.uuid4().hex,
        "response_url": "http://127.0.0.1:9/commands/response",
    }


def block_actions(
    channel: str, message_ts: str, button: JSON, *, user: str, thread_ts: str | None = None
) -> JSON:
    """The interaction payload of a press of ``button`` under the message ``message_ts``."""
    message: JSON = {"type": "message", "ts": message_ts, "user": "UBOT"}
    container: JSON = {
        "type": "message",
        "message_ts": message_ts,
        "channel_id": channel,
        "is_ephemeral": False,
    }
    if thread_ts:
        message["thread_ts"] = container["thread_ts"] = thread_ts
    return {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": "T0001"},
        "api_app_id": "A0001",
        "container": container,
        "trigger_id": uuid.uuid4().hex,
        "team": {"id": "T0001"},
        "channel": {"id": channel, "name": "chat"},
        "message": message,
        "response_url": "http://127.0.0.1:9/actions/response",
        "actions": [
            {
                "type": "button",
                "action_id": button.get("action_id"),
                "block_id": "agentpost-question",
                "text": button.get("text"),
                "value": button.get("value"),
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }


def signed_headers(secret: str, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    """Slack's signature headers for ``body`` (``timestamp`` defaults to now)."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), f"v0:{stamp}:".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": f"v0={digest}"}


def post_signed(
    url: str,
    secret: str,
    payload: JSON,
    *,
    form: bool = False,
    timestamp: int | None = None,
    retry_num: int | None = None,
    timeout: float = 30.0,
) -> httpx.Response:
    """POST ``payload`` to the adapter's events URL, signed with ``secret`` (JSON, or a form for a slash
    command); ``retry_num`` marks it as Slack's retry."""
    body = urlencode(payload).encode() if form else json.dumps(payload).encode()
    headers = signed_headers(secret, body, timestamp=timestamp)
    headers["Content-Type"] = "application/x-www-form-urlencoded" if form else "application/json"
    if retry_num is not None:
        headers["X-Slack-Retry-Num"] = str(retry_num)
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    return httpx.post(url, content=body, headers=headers, timeout=timeout)
