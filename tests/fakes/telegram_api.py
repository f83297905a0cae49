"""A small, faithful fake of the Telegram Bot API for end-to-end tests.

The fake listens on ``127.0.0.1`` on a free port and answers the subset of the Bot API that agentpost's
Telegram adapter uses, in the shape the real server does: every call is ``POST /bot{token}/{method}``
(form-encoded, or multipart when a file is attached), values arrive as strings, and every reply is
``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code": N, "description": "..."}`` with the
HTTP status equal to ``error_code``.

Point python-telegram-bot at it with::

    Application.builder().token(fake.token)
        .base_url(fake.base_url).base_file_url(fake.base_file_url)

Tests drive it from the other side: :meth:`FakeTelegram.push_text` and :meth:`FakeTelegram.push_document`
enqueue updates for ``getUpdates``, :meth:`FakeTelegram.push_callback_query` a press of an inline keyboard's
button; :attr:`FakeTelegram.sent` holds what the bot successfully did in chats (:meth:`FakeTelegram.chat_log`
reads it as the chat saw it, keyboards included), :attr:`FakeTelegram.calls` every request it made, and the
``wait_*`` helpers block on a condition variable with a deadline instead of sleeping.

As the real server: ``allowed_updates`` of the latest ``getUpdates`` decides which kinds of update are kept
for the bot (a press is dropped unless ``callback_query`` is asked for); an inline keyboard (``reply_markup``)
is checked (button data 1-64 bytes) and returned with the message; an ``editMessageText`` without
``reply_markup`` removes the keyboard, and one changing neither text nor keyboard is refused as "not
modified"; a callback query is answered at most once (``answerCallbackQuery``, text up to 200 characters).
Forum topics: a message pushed with ``thread_id`` is a topic message, and a send with ``message_thread_id``
lands in that topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from tests.fakes.http_fake import QuietHandler, QuietServer, ThreadedHttpFake, wait_for_record

JSON = dict[str, Any]

#: Methods whose successful calls are visible to the user and so are recorded in ``sent``.
OUTGOING_METHODS = frozenset(
    {
        "sendMessage",
        "editMessageText",
        "sendDocument",
        "sendChatAction",
        "setMyCommands",
        "answerCallbackQuery",
    }
)
#: Update kinds delivered when a bot never named its ``allowed_updates`` (or named none), as Telegram does.
_DEFAULT_UPDATE_KINDS = frozenset(
    {"message", "edited_message", "channel_post", "edited_channel_post", "callback_query", "inline_query"}
)

_CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)
_MARKDOWN_MODES = frozenset({"markdown", "markdownv2"})
_JSON_PARAMS = frozenset(
    {
        "reply_parameters",
        "reply_markup",
        "entities",
        "caption_entities",
        "commands",
        "allowed_updates",
        "scope",
    }
)
_COMMAND_RE = re.compile(r"^[a-z0-9_]{1,32}$")
_MENTION_RE = re.compile(r"(?<![\w@])@[A-Za-z][A-Za-z0-9_]{2,31}")
_BOT_COMMAND_RE = re.compile(r"(?<!\S)/[A-Za-z0-9_]{1,32}(?:@[A-Za-z][A-Za-z0-9_]{2,31})?")
_METHOD_PATH_RE = re.compile(r"^/bot(?P<token>[^/]+)/(?P<method>[A-Za-z]+)/?$")
_FILE_PATH_RE = re.compile(r"^/file/bot(?P<token>[^/]+)/(?P<path>.+)$")


def utf16_len(text: str) -> int:
    """Return the length of ``text`` in UTF-16 code units, the unit Telegram counts offsets and limits in."""
    return len(text.encode("utf-16-le")) // 2


class TelegramApiError(Exception):
    """An error answer of the Bot API: raised inside the fake, turned into a ``{"ok": false}`` reply."""

    def __init__(self, error_code: int, description: str, parameters: JSON | None = None) -> None:
        super().__init__(description)
        self.error_code = error_code
        self.description = description
        self.parameters = parameters

    def to_json(self) -> JSON:
        """Render the error as the Bot API's reply body."""
        body: JSON = {"ok": False, "error_code": self.error_code, "description": self.description}
        if self.parameters:
            body["parameters"] = self.parameters
        return body


@dataclass(frozen=True)
class UploadedFile:
    """One file part of a multipart request."""

    field: str
    filename: str
    content_type: str
    data: bytes


@dataclass
class TelegramCall:
    """One request the client made, with the fake's answer.

    ``params`` holds the form values as sent (strings); JSON-valued parameters such as
    ``reply_parameters`` are decoded. ``result`` is the ``result`` of a successful reply, ``error`` the
    body of a failed one.
    """

    method: str
    params: dict[str, Any]
    files: dict[str, UploadedFile] = field(default_factory=dict)
    result: Any = None
    error: JSON | None = None
    at: float = field(default_factory=time.monotonic)

    @property
    def ok(self) -> bool:
        """Whether the fake answered the call successfully."""
        return self.error is None

    def _str_param(self, name: str) -> str | None:
        value = self.params.get(name)
        return None if value is None else str(value)

    @property
    def chat_id(self) -> int | str | None:
        """The ``chat_id`` parameter, as an int when numeric."""
        raw = self.params.get("chat_id")
        if raw is None:
            return None
        text = str(raw)
        return int(text) if re.fullmatch(r"-?\d+", text) else text

    @property
    def text(self) -> str | None:
        """The ``text`` parameter (sendMessage, editMessageText)."""
        return self._str_param("text")

    @property
    def caption(self) -> str | None:
        """The ``caption`` parameter (sendDocument)."""
        return self._str_param("caption")

    @property
    def parse_mode(self) -> str | None:
        """The ``parse_mode`` parameter, or None for plain text."""
        return self._str_param("parse_mode")

    @property
    def reply_to_message_id(self) -> int | None:
        """The message replied to, from ``reply_parameters`` or the legacy ``reply_to_message_id``."""
        reply = self.params.get("reply_parameters")
        if isinstance(reply, dict) and "message_id" in reply:
            return int(reply["message_id"])
        legacy = self.params.get("reply_to_message_id")
        return None if legacy is None else int(legacy)

    @property
    def document(self) -> UploadedFile | None:
        """The uploaded ``document`` file part, if any."""
        return self.files.get("document")

    @property
    def keyboard(self) -> list[list[tuple[str, str]]] | None:
        """The inline keyboard sent with the call as rows of ``(label, callback_data)``, or None."""
        return _keyboard_rows(self.params.get("reply_markup"))


@dataclass
class _StoredFile:
    file_id: str
    file_unique_id: str
    file_path: str
    filename: str
    mime_type: str
    data: bytes


def _parse_content_disposition(value: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in value.split(";")[1:]:
        key, _, raw = item.strip().partition("=")
        key = key.strip().lower()
        raw = raw.strip()
        if key.endswith("*"):
            # RFC 5987: charset'lang'percent-encoded
            charset, _, rest = raw.partition("'")
            _, _, encoded = rest.partition("'")
            params[key[:-1]] = unquote(encoded, encoding=charset or "utf-8")
        else:
            if len(raw) >= 2 and raw[0] == raw[-1] == '"':
                raw = raw[1:-1].replace('\\"', '"')
            params.setdefault(key, raw)
    return params


def parse_form_body(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, UploadedFile]]:
    """Parse a form-encoded or multipart/form-data body into (fields, files)."""
    media_type, _, rest = content_type.partition(";")
    media_type = media_type.strip().lower()
    if media_type == "multipart/form-data":
        match = re.search(r'boundary="?([^";]+)"?', rest)
        if match is None:
            raise TelegramApiError(400, "Bad Request: multipart boundary is missing")
        delimiter = b"--" + match.group(1).encode("latin-1")
        fields: dict[str, str] = {}
        files: dict[str, UploadedFile] = {}
        for chunk in body.split(delimiter)[1:]:
            if chunk.startswith(b"--"):
                break
            chunk = chunk.removeprefix(b"\r\n").removesuffix(b"\r\n")
            head, _, data = chunk.partition(b"\r\n\r\n")
            headers: dict[str, str] = {}
            for line in head.decode("utf-8", "replace").split("\r\n"):
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            disposition = _parse_content_disposition(headers.get("content-disposition", ""))
            name = disposition.get("name", "")
            if "filename" in disposition:
                files[name] = UploadedFile(
                    field=name,
                    filename=disposition["filename"],
                    content_type=headers.get("content-type", "application/octet-stream"),
                    data=data,
                )
            else:
                fields[name] = data.decode("utf-8")
        return fields, files
    if media_type == "application/json":
        decoded = json.loads(body or b"{}")
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in decoded.items()}, {}
    return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True)), {}


class _Server(QuietServer):
    # Clients (PTB on shutdown) drop long-poll connections; QuietServer does not print them.
    fake: FakeTelegram


class _Handler(QuietHandler):
    server: _Server

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _dispatch(self, verb: str) -> None:
        url = urlsplit(self.path)
        body = self._read_body() if verb == "POST" else b""
        fake = self.server.fake
        file_match = _FILE_PATH_RE.match(url.path)
        if verb == "GET" and file_match:
            # PTB percent-encodes the download URL (the token's ":" arrives as %3A).
            token, path = unquote(file_match["token"]), unquote(file_match["path"])
            status, data, content_type = fake._download(token, path)
            self._reply(status, data, content_type)
            return
        method_match = _METHOD_PATH_RE.match(url.path)
        if method_match is None:
            payload = TelegramApiError(404, "Not Found").to_json()
            self._reply(404, json.dumps(payload).encode(), "application/json")
            return
        try:
            fields, files = parse_form_body(self.headers.get("Content-Type", ""), body)
        except (ValueError, TelegramApiError) as exc:
            status, payload = 400, TelegramApiError(400, f"Bad Request: {exc}").to_json()
        else:
            fields.update(dict(parse_qsl(url.query, keep_blank_values=True)))
            status, payload = fake._call(
                unquote(method_match["token"]), method_match["method"], fields, files
            )
        self._reply(status, json.dumps(payload).encode(), "application/json")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_GET(self) -> None:
        self._dispatch("GET")


class FakeTelegram(ThreadedHttpFake):
    """A fake Telegram Bot API server running in a background thread on ``127.0.0.1``.

    Use it as a context manager (or call :meth:`start` and :meth:`close`). Thread-safe: the test thread
    pushes updates while the server threads answer the client.

    Set :attr:`reject_markdown` to make every ``Markdown``/``MarkdownV2`` text or caption fail with the real
    ``400 Bad Request: can't parse entities`` error, to exercise a plain-text fallback.
    """

    server_class = _Server
    handler_class = _Handler
    thread_name = "fake-telegram"

    def __init__(
        self, token: str = "123456789:AAFakeTokenForAgentpostTests", bot_username: str = "agentpost_bot"
    ) -> None:
        super().__init__()
        if not re.fullmatch(r"\d+:[A-Za-z0-9_-]+", token):
            raise ValueError("a bot token looks like '<bot id>:<secret>'")
        self.token = token
        self.bot_username = bot_username
        self.bot_id = int(token.split(":", 1)[0])
        self.reject_markdown = False
        self._cond = threading.Condition()
        self._closed = False
        self._updates: list[JSON] = []
        self._update_ids = itertools.count(100_000_001)
        self._confirmed_offset = 0
        self._poll_generation = 0
        self._waiting_pollers = 0
        self._chats: dict[int, JSON] = {}
        self._messages: dict[tuple[int, int], JSON] = {}
        self._message_ids: dict[int, itertools.count[int]] = {}
        self._files: dict[str, _StoredFile] = {}
        self._file_numbers = itertools.count(1)
        self._failures: dict[str, list[TelegramApiError]] = {}
        self._sent: list[TelegramCall] = []
        self._calls: list[TelegramCall] = []
        self.commands: list[JSON] = []
        #: Seconds every sendMessage/sendDocument takes before it is carried out (a slow Telegram). The send
        #: is carried out even if the client has gone meanwhile, as a real server would: its fate is then
        #: unknown to the client.
        self.send_delay = 0.0
        self._sends_started = 0
        self._chat_failures: dict[tuple[str, int], list[TelegramApiError]] = {}
        self._allowed_updates: frozenset[str] = _DEFAULT_UPDATE_KINDS
        self._queries: dict[str, JSON] = {}
        self._query_numbers = itertools.count(1)
        #: Every button data a bot message ever carried: a client still showing an old keyboard may press it.
        self._pressable: dict[tuple[int, int], set[str]] = {}

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Release waiting long polls and stop the server."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        super().close()

    @property
    def base_url(self) -> str:
        """Value for PTB's ``base_url`` (the token is appended by PTB)."""
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        """Value for PTB's ``base_file_url`` (the token is appended by PTB)."""
        return f"{self.url}/file/bot"

    # ------------------------------------------------------------------ test-side API

    @property
    def bot_user(self) -> JSON:
        """The bot's User object, as getMe returns it."""
        return {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": "Agentpost",
            "username": self.bot_username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }

    def add_chat(
        self,
        chat_id: int,
        chat_type: Literal["private", "group", "supergroup"] = "private",
        *,
        title: str | None = None,
        username: str | None = None,
        first_name: str | None = None,
    ) -> JSON:
        """Make a chat known to the fake, as pushing a message does; unknown chats give 'chat not found'."""
        if chat_type == "private":
            chat: JSON = {"id": chat_id, "type": "private", "first_name": first_name or username or "User"}
            if username:
                chat["username"] = username
        else:
            chat = {"id": chat_id, "type": chat_type, "title": title or f"Group {chat_id}"}
        with self._cond:
            self._chats.setdefault(chat_id, chat)
            return dict(self._chats[chat_id])

    def push_text(
        self,
        chat_id: int,
        text: str,
        *,
        user_id: int | None = None,
        username: str | None = "alice",
        first_name: str = "Alice",
        chat_type: Literal["private", "group", "supergroup"] = "private",
        chat_title: str | None = None,
        entities: list[JSON] | None = None,
        reply_to_message_id: int | None = None,
        thread_id: int | None = None,
    ) -> JSON:
        """Enqueue an Update carrying a text message from a user and return it.

        In a private chat the user id defaults to the chat id, as in Telegram. When ``entities`` is None
        the fake derives ``mention`` (``@name``) and ``bot_command`` (``/cmd``) entities from the text with
        UTF-16 offsets, as the real server does. ``thread_id``: the message is in that forum topic (the
        chat, a supergroup, is a forum).
        """
        message = self._user_message(
            chat_id, user_id, username, first_name, chat_type, chat_title, reply_to_message_id
        )
        message["text"] = text
        if thread_id is not None:
            if chat_type != "supergroup":
                raise ValueError("forum topics exist only in supergroups")
            with self._cond:
                self._chats[chat_id]["is_forum"] = True
                message["chat"] = dict(self._chats[chat_id])
            message["message_thread_id"] = thread_id
            message["is_topic_message"] = True
        found = _derive_entities(text) if entities is None else entities
        if found:
            message["entities"] = found
        return self._enqueue(message)

    def push_document(
        self,
        chat_id: int,
        filename: str,
        data: bytes,
        *,
        mime_type: str = "application/octet-stream",
        caption: str | None = None,
        user_id: int | None = None,
        username: str | None = "alice",
        first_name: str = "Alice",
        chat_type: Literal["private", "group", "supergroup"] = "private",
        chat_title: str | None = None,
    ) -> JSON:
        """Enqueue an Update carrying a document (downloadable through getFile) and return it."""
        message = self._user_message(chat_id, user_id, username, first_name, chat_type, chat_title, None)
        stored = self._store_file(filename, mime_type, data)
        message["document"] = _document_json(stored)
        if caption is not None:
            message["caption"] = caption
            entities = _derive_entities(caption)
            if entities:
                message["caption_entities"] = entities
        return self._enqueue(message)

    def push_photo(
        self,
        chat_id: int,
        data: bytes,
        *,
        width: int = 3,
        height: int = 2,
        caption: str | None = None,
        user_id: int | None = None,
        username: str | None = "alice",
        first_name: str = "Alice",
        chat_type: Literal["private", "group", "supergroup"] = "private",
        chat_title: str | None = None,
    ) -> JSON:
        """Enqueue an Update carrying a photo (one ``PhotoSize``, downloadable through getFile; Telegram
        sends photos without a file name) and return it."""
        message = self._user_message(chat_id, user_id, username, first_name, chat_type, chat_title, None)
        stored = self._store_file("photo.jpg", "image/jpeg", data)
        message["photo"] = [
            {
                "file_id": stored.file_id,
                "file_unique_id": stored.file_unique_id,
                "width": width,
                "height": height,
                "file_size": len(data),
            }
        ]
        if caption is not None:
            message["caption"] = caption
        return self._enqueue(message)

    def push_callback_query(
        self,
        chat_id: int,
        message_id: int,
        data: str,
        *,
        user_id: int,
        username: str | None = "alice",
        first_name: str = "Alice",
    ) -> JSON:
        """Enqueue the Update of user ``user_id`` pressing the button with ``data`` under the bot's message
        ``message_id`` and return it (the message rides along as the chat shows it now).

        The button must be one the message carries, or carried earlier (a client that had not yet seen an
        edit may still press an old button). The update is dropped, as by Telegram, when the bot's
        ``allowed_updates`` leave out ``callback_query``.
        """
        with self._cond:
            message = self._messages.get((chat_id, message_id))
            if message is None or message["from"]["id"] != self.bot_id:
                raise ValueError(f"no message {message_id} of the bot in chat {chat_id}")
            if data not in self._pressable.get((chat_id, message_id), set()):
                raise ValueError(f"message {message_id} never had a button with data {data!r}")
            sender: JSON = {"id": user_id, "is_bot": False, "first_name": first_name, "language_code": "en"}
            if username:
                sender["username"] = username
            query: JSON = {
                "id": f"{self.bot_id}{next(self._query_numbers):010d}",
                "from": sender,
                "message": dict(message),
                "chat_instance": f"-{abs(chat_id)}77",
                "data": data,
            }
            self._queries[query["id"]] = {"user_id": user_id, "chat_id": chat_id, "answered": False}
            return self._add_update({"callback_query": query})

    def delete_message(self, chat_id: int, message_id: int) -> None:
        """Someone in the chat deleted a message (an admin, or the user in a private chat): editing it fails
        from now on with Telegram's "message to edit not found"."""
        with self._cond:
            if self._messages.pop((chat_id, message_id), None) is None:
                raise ValueError(f"no message {message_id} in chat {chat_id}")

    @property
    def callback_answers(self) -> list[JSON]:
        """The answers to callback queries, oldest first: ``{"query_id", "user_id", "chat_id", "text",
        "show_alert"}`` (``text`` None when the answer showed nothing)."""
        found = []
        for c in self.sent:
            if c.method != "answerCallbackQuery":
                continue
            query_id = str(c.params.get("callback_query_id"))
            with self._cond:
                query = self._queries[query_id]
            found.append(
                {
                    "query_id": query_id,
                    "user_id": query["user_id"],
                    "chat_id": query["chat_id"],
                    "text": c.text,
                    "show_alert": str(c.params.get("show_alert", "")).lower() == "true",
                }
            )
        return found

    def push_voice(
        self,
        chat_id: int,
        data: bytes,
        *,
        duration: int = 3,
        caption: str | None = None,
        user_id: int | None = None,
        username: str | None = "alice",
        first_name: str = "Alice",
        chat_type: Literal["private", "group", "supergroup"] = "private",
        chat_title: str | None = None,
    ) -> JSON:
        """Enqueue an Update carrying a voice note (OGG/Opus, no file name, downloadable through getFile
        as ``voice/file_N.oga``, as Telegram stores them) and return it."""
        message = self._user_message(chat_id, user_id, username, first_name, chat_type, chat_title, None)
        stored = self._store_file("voice.oga", "audio/ogg", data, folder="voice")
        message["voice"] = {
            "file_id": stored.file_id,
            "file_unique_id": stored.file_unique_id,
            "duration": duration,
            "mime_type": "audio/ogg",
            "file_size": len(data),
        }
        if caption is not None:
            message["caption"] = caption
        return self._enqueue(message)

    def fail_next(
        self,
        method: str,
        *,
        error_code: int = 400,
        description: str = "Bad Request: injected failure",
        retry_after: int | None = None,
        times: int = 1,
    ) -> None:
        """Make the next ``times`` calls of ``method`` fail with the given Bot API error."""
        parameters = {"retry_after": retry_after} if retry_after is not None else None
        with self._cond:
            queue = self._failures.setdefault(method.lower(), [])
            queue.extend(TelegramApiError(error_code, description, parameters) for _ in range(times))

    def fail_in_chat(
        self,
        chat_id: int,
        method: str,
        *,
        error_code: int = 400,
        description: str = "Bad Request: injected failure",
        retry_after: int | None = None,
        times: int = 1,
    ) -> None:
        """Make the next ``times`` calls of ``method`` to ``chat_id`` fail (other chats are unaffected)."""
        parameters = {"retry_after": retry_after} if retry_after is not None else None
        with self._cond:
            queue = self._chat_failures.setdefault((method.lower(), chat_id), [])
            queue.extend(TelegramApiError(error_code, description, parameters) for _ in range(times))

    def rate_limit_next(self, method: str, *, retry_after: int = 1, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` fail with 429 Too Many Requests and ``retry_after``."""
        self.fail_next(
            method,
            error_code=429,
            description=f"Too Many Requests: retry after {retry_after}",
            retry_after=retry_after,
            times=times,
        )

    @property
    def sent(self) -> list[TelegramCall]:
        """Successful user-visible calls (see :data:`OUTGOING_METHODS`), oldest first (a copy)."""
        with self._cond:
            return list(self._sent)

    @property
    def calls(self) -> list[TelegramCall]:
        """Every request the client made, successful or not, oldest first (a copy)."""
        with self._cond:
            return list(self._calls)

    @property
    def confirmed_offset(self) -> int:
        """The highest ``offset`` the client has passed to getUpdates (updates below it are dropped)."""
        with self._cond:
            return self._confirmed_offset

    @property
    def pending_updates(self) -> list[JSON]:
        """Updates not yet confirmed by the client (a copy)."""
        with self._cond:
            return list(self._updates)

    def message(self, chat_id: int, message_id: int) -> JSON | None:
        """The current state of a message the fake knows (pushed or sent), or None."""
        with self._cond:
            found = self._messages.get((chat_id, message_id))
            return None if found is None else dict(found)

    def bot_messages(self, chat_id: int) -> list[JSON]:
        """The bot's messages in a chat as the chat shows them now (edits applied), oldest first."""
        with self._cond:
            found = [
                dict(m)
                for (chat, _), m in self._messages.items()
                if chat == chat_id and m["from"]["id"] == self.bot_id
            ]
        return sorted(found, key=lambda m: int(m["message_id"]))

    def transcript(self, chat_id: int, since: float = 0.0) -> str:
        """Every send and edit the fake accepted in a chat, in order, one line each with its time after
        ``since`` (a ``time.monotonic()``): what a failing test prints."""
        lines = []
        for c in self.sent:
            if c.chat_id != chat_id or c.method not in ("sendMessage", "editMessageText"):
                continue
            target = c.params.get("message_id") or (c.result or {}).get("message_id")
            buttons = f" {[[label for label, _ in row] for row in c.keyboard]}" if c.keyboard else ""
            lines.append(f"+{c.at - since:6.2f}s {c.method} #{target}: {(c.text or '')!r}{buttons}")
        return "\n".join(lines)

    def chat_log(self, chat_id: int) -> list[tuple[str, int, str, list[list[tuple[str, str]]] | None]]:
        """Every send and edit of a text the fake accepted in a chat, in order, as ``(method, message id,
        text, keyboard)``: the keyboard as rows of ``(label, data)`` the message shows after the call (None:
        no keyboard, as after an edit without ``reply_markup``)."""
        return [
            (c.method, int(c.params.get("message_id") or c.result["message_id"]), c.text or "", c.keyboard)
            for c in self.sent
            if c.chat_id == chat_id and c.method in ("sendMessage", "editMessageText")
        ]

    def wait_for(self, predicate: Callable[[TelegramCall], bool], timeout: float = 5.0) -> TelegramCall:
        """Block until a record in :attr:`sent` matches ``predicate`` and return the first match."""
        return self._wait_record(self._sent, predicate, timeout, "sent")

    def wait_for_call(self, predicate: Callable[[TelegramCall], bool], timeout: float = 5.0) -> TelegramCall:
        """Block until a record in :attr:`calls` (including failed calls) matches ``predicate``."""
        return self._wait_record(self._calls, predicate, timeout, "calls")

    async def wait_for_async(
        self, predicate: Callable[[TelegramCall], bool], timeout: float = 5.0
    ) -> TelegramCall:
        """:meth:`wait_for` for async tests: waits in a worker thread so the event loop keeps running."""
        return await asyncio.to_thread(self.wait_for, predicate, timeout)

    def wait_for_offset(self, offset: int, timeout: float = 5.0) -> int:
        """Block until the client has confirmed ``offset`` (or a higher one); return the confirmed offset."""
        self._wait_state(lambda: self._confirmed_offset >= offset, timeout, f"confirmed offset >= {offset}")
        return self.confirmed_offset

    @property
    def sends_started(self) -> int:
        """How many sendMessage/sendDocument requests have arrived (finished or still in flight)."""
        with self._cond:
            return self._sends_started

    def wait_sends_started(self, count: int, timeout: float = 10.0) -> int:
        """Block until at least ``count`` sends have arrived; return how many have."""
        self._wait_state(lambda: self._sends_started >= count, timeout, f"{count} sends started")
        return self.sends_started

    def wait_for_poller(self, timeout: float = 5.0) -> None:
        """Block until a getUpdates long poll is parked on the server waiting for updates."""
        self._wait_state(lambda: self._waiting_pollers > 0, timeout, "a waiting getUpdates long poll")

    # ------------------------------------------------------------------ internals: waiting

    def _wait_state(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(ready, timeout=timeout):
                raise TimeoutError(f"fake Telegram: timed out after {timeout}s waiting for {what}")

    def _wait_record(
        self,
        records: list[TelegramCall],
        predicate: Callable[[TelegramCall], bool],
        timeout: float,
        name: str,
    ) -> TelegramCall:
        def failure() -> str:
            seen = [(r.method, r.chat_id, r.text or r.caption, r.error) for r in records]
            return f"fake Telegram: no matching record in {name} after {timeout}s; saw {seen}"

        return wait_for_record(self._cond, lambda: records, predicate, timeout, failure)

    # ------------------------------------------------------------------ internals: state

    def _next_message_id(self, chat_id: int) -> int:
        counter = self._message_ids.setdefault(chat_id, itertools.count(1))
        return next(counter)

    def _user_message(
        self,
        chat_id: int,
        user_id: int | None,
        username: str | None,
        first_name: str,
        chat_type: Literal["private", "group", "supergroup"],
        chat_title: str | None,
        reply_to_message_id: int | None,
    ) -> JSON:
        if chat_type == "private":
            if user_id is not None and user_id != chat_id:
                raise ValueError("in a private chat the user id is the chat id")
            user_id = chat_id
        elif user_id is None:
            raise ValueError("a group message needs a user_id")
        chat = self.add_chat(chat_id, chat_type, title=chat_title, username=username, first_name=first_name)
        sender: JSON = {"id": user_id, "is_bot": False, "first_name": first_name, "language_code": "en"}
        if username:
            sender["username"] = username
        with self._cond:
            message: JSON = {
                "message_id": self._next_message_id(chat_id),
                "from": sender,
                "chat": chat,
                "date": int(time.time()),
            }
            if reply_to_message_id is not None:
                replied = self._messages.get((chat_id, reply_to_message_id))
                if replied is None:
                    raise ValueError(f"message {reply_to_message_id} is unknown in chat {chat_id}")
                message["reply_to_message"] = _without_reply(replied)
        return message

    def _enqueue(self, message: JSON) -> JSON:
        with self._cond:
            self._messages[(message["chat"]["id"], message["message_id"])] = message
            return self._add_update({"message": message})

    def _add_update(self, body: JSON) -> JSON:
        """Number an update and keep it for getUpdates, unless the bot's ``allowed_updates`` leave its kind
        out (Telegram does not keep it then). Called holding ``_cond``."""
        update = {"update_id": next(self._update_ids), **body}
        if set(body) & self._allowed_updates:
            self._updates.append(update)
            self._cond.notify_all()
        return update

    def _store_file(
        self, filename: str, mime_type: str, data: bytes, *, folder: str = "documents"
    ) -> _StoredFile:
        with self._cond:
            number = next(self._file_numbers)
            suffix = filename.rsplit(".", 1)[1] if "." in filename else "bin"
            stored = _StoredFile(
                file_id=f"BQACAgQAAxkBAAI{number:06d}fake{self.bot_id}",
                file_unique_id=f"AgAD{number:06d}",
                file_path=f"{folder}/file_{number}.{suffix}",
                filename=filename,
                mime_type=mime_type,
                data=data,
            )
            self._files[stored.file_id] = stored
            return stored

    # ------------------------------------------------------------------ internals: HTTP entry points

    def _download(self, token: str, path: str) -> tuple[int, bytes, str]:
        if token != self.token:
            return (
                401,
                json.dumps(TelegramApiError(401, "Unauthorized").to_json()).encode(),
                "application/json",
            )
        with self._cond:
            for stored in self._files.values():
                if stored.file_path == path:
                    return 200, stored.data, stored.mime_type
        return 404, json.dumps(TelegramApiError(404, "Not Found").to_json()).encode(), "application/json"

    def _call(
        self, token: str, method: str, fields: dict[str, str], files: dict[str, UploadedFile]
    ) -> tuple[int, JSON]:
        handler = _HANDLERS.get(method.lower())
        canonical = handler[0] if handler else method
        params: dict[str, Any] = dict(fields)
        for name in _JSON_PARAMS & params.keys():
            with contextlib.suppress(ValueError):
                params[name] = json.loads(params[name])
        call = TelegramCall(method=canonical, params=params, files=files)
        if canonical in ("sendMessage", "sendDocument"):
            with self._cond:
                self._sends_started += 1
                self._cond.notify_all()
            if self.send_delay > 0:
                time.sleep(self.send_delay)
        try:
            if token != self.token:
                raise TelegramApiError(401, "Unauthorized")
            if handler is None:
                raise TelegramApiError(404, "Not Found")
            with self._cond:
                injected = self._failures.get(method.lower())
                if injected:
                    raise injected.pop(0)
                chat_id = call.chat_id
                in_chat = (
                    self._chat_failures.get((method.lower(), chat_id)) if isinstance(chat_id, int) else None
                )
                if in_chat:
                    raise in_chat.pop(0)
            call.result = handler[1](self, call)
        except TelegramApiError as exc:
            call.error = exc.to_json()
        except (ValueError, KeyError, TypeError) as exc:
            call.error = TelegramApiError(400, f"Bad Request: {exc}").to_json()
        with self._cond:
            self._calls.append(call)
            if call.ok and call.method in OUTGOING_METHODS:
                self._sent.append(call)
            self._cond.notify_all()
        if call.error is not None:
            return int(call.error["error_code"]), call.error
        return 200, {"ok": True, "result": call.result}

    # ------------------------------------------------------------------ internals: Bot API methods

    def _chat(self, call: TelegramCall) -> JSON:
        chat_id = call.chat_id
        if chat_id is None:
            raise TelegramApiError(400, "Bad Request: chat_id is empty")
        with self._cond:
            chat = self._chats.get(chat_id) if isinstance(chat_id, int) else None
            if chat is None:
                chat = next((c for c in self._chats.values() if f"@{c.get('username')}" == chat_id), None)
        if chat is None:
            raise TelegramApiError(400, "Bad Request: chat not found")
        return chat

    def _check_markup(self, parse_mode: str | None) -> None:
        if self.reject_markdown and parse_mode is not None and parse_mode.lower() in _MARKDOWN_MODES:
            raise TelegramApiError(
                400,
                "Bad Request: can't parse entities: Can't find end of the entity starting at byte offset 0",
            )

    def _reply_to(self, call: TelegramCall, chat: JSON) -> JSON | None:
        target = call.reply_to_message_id
        if target is None:
            return None
        reply = call.params.get("reply_parameters")
        allow_missing = isinstance(reply, dict) and bool(reply.get("allow_sending_without_reply"))
        with self._cond:
            replied = self._messages.get((chat["id"], target))
        if replied is None:
            if allow_missing:
                return None
            raise TelegramApiError(400, "Bad Request: message to be replied not found")
        return _without_reply(replied)

    def _bot_message(self, chat: JSON, reply_to: JSON | None) -> JSON:
        with self._cond:
            message: JSON = {
                "message_id": self._next_message_id(chat["id"]),
                "from": {
                    "id": self.bot_id,
                    "is_bot": True,
                    "first_name": self.bot_user["first_name"],
                    "username": self.bot_username,
                },
                "chat": chat,
                "date": int(time.time()),
            }
        if reply_to is not None:
            message["reply_to_message"] = reply_to
        return message

    def _remember(self, message: JSON) -> JSON:
        key = (message["chat"]["id"], message["message_id"])
        with self._cond:
            self._messages[key] = message
            for row in _keyboard_rows(message.get("reply_markup")) or []:
                self._pressable.setdefault(key, set()).update(data for _, data in row)
        return message

    def _get_me(self, call: TelegramCall) -> JSON:
        return self.bot_user

    def _delete_webhook(self, call: TelegramCall) -> bool:
        if str(call.params.get("drop_pending_updates", "")).lower() == "true":
            with self._cond:
                self._updates.clear()
        return True

    def _get_updates(self, call: TelegramCall) -> list[JSON]:
        offset = int(call.params.get("offset") or 0)
        timeout = float(call.params.get("timeout") or 0)
        limit = max(1, min(100, int(call.params.get("limit") or 100)))
        deadline = time.monotonic() + timeout
        allowed = call.params.get("allowed_updates")
        with self._cond:
            if isinstance(allowed, list):  # kept until a later call names others; [] is the default set
                self._allowed_updates = frozenset(map(str, allowed)) or _DEFAULT_UPDATE_KINDS
            self._poll_generation += 1
            generation = self._poll_generation
            if offset < 0:
                self._updates = self._updates[offset:]
            elif offset > 0:
                self._updates = [u for u in self._updates if u["update_id"] >= offset]
                self._confirmed_offset = max(self._confirmed_offset, offset)
            self._cond.notify_all()
            while True:
                if generation != self._poll_generation:
                    raise TelegramApiError(
                        409,
                        "Conflict: terminated by other getUpdates request; "
                        "make sure that only one bot instance is running",
                    )
                remaining = deadline - time.monotonic()
                if self._updates or self._closed or remaining <= 0:
                    return list(self._updates[:limit])
                self._waiting_pollers += 1
                self._cond.notify_all()
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiting_pollers -= 1

    def _send_message(self, call: TelegramCall) -> JSON:
        chat = self._chat(call)
        text = call.text or ""
        if not text.strip():
            raise TelegramApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > 4096:
            raise TelegramApiError(400, "Bad Request: message is too long")
        self._check_markup(call.parse_mode)
        keyboard = self._inline_keyboard(call)
        message = self._bot_message(chat, self._reply_to(call, chat))
        message["text"] = text
        self._in_topic(call, chat, message)
        if keyboard is not None:
            message["reply_markup"] = keyboard
        return self._remember(message)

    def _edit_message_text(self, call: TelegramCall) -> JSON:
        if "inline_message_id" in call.params:
            raise TelegramApiError(400, "Bad Request: inline messages are not supported by the fake")
        chat = self._chat(call)
        text = call.text or ""
        if not text.strip():
            raise TelegramApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > 4096:
            raise TelegramApiError(400, "Bad Request: MESSAGE_TOO_LONG")
        self._check_markup(call.parse_mode)
        keyboard = self._inline_keyboard(call)
        message_id = int(call.params.get("message_id") or 0)
        with self._cond:
            current = self._messages.get((chat["id"], message_id))
            if current is None:
                raise TelegramApiError(400, "Bad Request: message to edit not found")
            if current["from"]["id"] != self.bot_id:
                raise TelegramApiError(400, "Bad Request: message can't be edited")
            if current.get("text") == text and current.get("reply_markup") == keyboard:
                raise TelegramApiError(
                    400,
                    "Bad Request: message is not modified: specified new message content and reply markup "
                    "are exactly the same as a current content and reply markup of the message",
                )
            # An edit without reply_markup leaves the message without its keyboard.
            edited = {k: v for k, v in current.items() if k != "reply_markup"}
            edited.update(text=text, edit_date=int(time.time()))
            if keyboard is not None:
                edited["reply_markup"] = keyboard
        return self._remember(edited)

    def _answer_callback_query(self, call: TelegramCall) -> bool:
        query_id = str(call.params.get("callback_query_id") or "")
        with self._cond:
            query = self._queries.get(query_id)
            if query is None or query["answered"]:
                raise TelegramApiError(
                    400, "Bad Request: query is too old and response timeout expired or query ID is invalid"
                )
            if len(call.text or "") > 200:
                raise TelegramApiError(400, "Bad Request: MESSAGE_TOO_LONG")
            query["answered"] = True
        return True

    def _inline_keyboard(self, call: TelegramCall) -> JSON | None:
        """The ``reply_markup`` of a call checked as Telegram checks an inline keyboard (None: none)."""
        markup = call.params.get("reply_markup")
        if markup is None:
            return None
        rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
        if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
            raise TelegramApiError(400, "Bad Request: can't parse inline keyboard button")
        for button in (b for row in rows for b in row):
            if not isinstance(button, dict) or not str(button.get("text", "")).strip():
                raise TelegramApiError(400, "Bad Request: text buttons are unallowed in the inline keyboard")
            data = button.get("callback_data")
            if data is not None and not 1 <= len(str(data).encode()) <= 64:
                raise TelegramApiError(400, "Bad Request: BUTTON_DATA_INVALID")
        return {"inline_keyboard": rows}

    def _in_topic(self, call: TelegramCall, chat: JSON, message: JSON) -> None:
        thread = call.params.get("message_thread_id")
        if thread is None:
            return
        if not chat.get("is_forum"):
            raise TelegramApiError(400, "Bad Request: message thread not found")
        message["message_thread_id"] = int(thread)
        message["is_topic_message"] = True

    def _send_chat_action(self, call: TelegramCall) -> bool:
        self._chat(call)
        if call.params.get("action") not in _CHAT_ACTIONS:
            raise TelegramApiError(400, "Bad Request: wrong parameter action in request")
        return True

    def _send_document(self, call: TelegramCall) -> JSON:
        chat = self._chat(call)
        upload = call.document
        if upload is not None:
            stored = self._store_file(upload.filename, upload.content_type, upload.data)
        else:
            with self._cond:
                found = self._files.get(str(call.params.get("document", "")))
            if found is None:
                raise TelegramApiError(400, "Bad Request: wrong file identifier/HTTP URL specified")
            stored = found
        caption = call.caption
        if caption is not None:
            if utf16_len(caption) > 1024:
                raise TelegramApiError(400, "Bad Request: message caption is too long")
            self._check_markup(call.parse_mode)
        message = self._bot_message(chat, self._reply_to(call, chat))
        message["document"] = _document_json(stored)
        if caption:
            message["caption"] = caption
        return self._remember(message)

    def _set_my_commands(self, call: TelegramCall) -> bool:
        commands = call.params.get("commands")
        if not isinstance(commands, list) or len(commands) > 100:
            raise TelegramApiError(400, "Bad Request: can't parse commands JSON object")
        for command in commands:
            if not isinstance(command, dict) or not _COMMAND_RE.match(str(command.get("command", ""))):
                raise TelegramApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not 1 <= len(str(command.get("description", ""))) <= 256:
                raise TelegramApiError(400, "Bad Request: command description is empty")
        with self._cond:
            self.commands = [{"command": c["command"], "description": c["description"]} for c in commands]
        return True

    def _get_my_commands(self, call: TelegramCall) -> list[JSON]:
        with self._cond:
            return list(self.commands)

    def _get_file(self, call: TelegramCall) -> JSON:
        with self._cond:
            stored = self._files.get(str(call.params.get("file_id", "")))
        if stored is None:
            raise TelegramApiError(400, "Bad Request: invalid file_id")
        return {
            "file_id": stored.file_id,
            "file_unique_id": stored.file_unique_id,
            "file_size": len(stored.data),
            "file_path": stored.file_path,
        }


_HANDLERS: dict[str, tuple[str, Callable[[FakeTelegram, TelegramCall], Any]]] = {
    name.lower(): (name, func)
    for name, func in {
        "getMe": FakeTelegram._get_me,
        "deleteWebhook": FakeTelegram._delete_webhook,
        "getUpdates": FakeTelegram._get_updates,
        "sendMessage": FakeTelegram._send_message,
        "editMessageText": FakeTelegram._edit_message_text,
        "sendChatAction": FakeTelegram._send_chat_action,
        "sendDocument": FakeTelegram._send_document,
        "setMyCommands": FakeTelegram._set_my_commands,
        "getMyCommands": FakeTelegram._get_my_commands,
        "getFile": FakeTelegram._get_file,
        "answerCallbackQuery": FakeTelegram._answer_callback_query,
    }.items()
}


def _derive_entities(text: str) -> list[JSON]:
    entities: list[JSON] = []
    for kind, pattern in (("mention", _MENTION_RE), ("bot_command", _BOT_COMMAND_RE)):
        for match in pattern.finditer(text):
            entities.append(
                {
                    "type": kind,
                    "offset": utf16_len(text[: match.start()]),
                    "length": utf16_len(match.group(0)),
                }
            )
    return sorted(entities, key=lambda e: int(e["offset"]))


def _document_json(stored: _StoredFile) -> JSON:
    return {
        "file_name": stored.filename,
        "mime_type": stored.mime_type,
        "file_id": stored.file_id,
        "file_unique_id": stored.file_unique_id,
        "file_size": len(stored.data),
    }


def _keyboard_rows(markup: Any) -> list[list[tuple[str, str]]] | None:
    """An inline keyboard as rows of ``(label, callback_data)``, or None."""
    if not isinstance(markup, dict) or not isinstance(markup.get("inline_keyboard"), list):
        return None
    return [
        [(str(b.get("text", "")), str(b.get("callback_data", ""))) for b in row if isinstance(b, dict)]
        for row in markup["inline_keyboard"]
        if isinstance(row, list)
    ]


def _without_reply(message: JSON) -> JSON:
    return {k: v for k, v in message.items() if k != "reply_to_message"}
