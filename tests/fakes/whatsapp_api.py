"""A small, faithful fake of the WhatsApp Cloud API (Meta Graph API) for end-to-end tests.

Two halves:

* :class:`FakeWhatsApp`, an HTTP server on ``127.0.0.1`` (free port, background thread) answering
  ``POST /v{N}/{phone_number_id}/messages`` and ``POST /v{N}/{phone_number_id}/media`` with Bearer-token
  checks and Graph-shaped errors (including the throughput errors 130429 and 131056, injectable), plus
  ``GET /v{N}/{media_id}`` and the media download URL it returns, for inbound media; read receipts with an
  optional typing indicator (``{"status": "read", "message_id": W}`` on ``/messages``, see :attr:`reads`);
* interactive messages with reply buttons (``"type": "interactive"``, ``interactive.type = "button"``),
  checked against the Cloud API's limits (1 to 3 buttons, titles of at most 20 characters, unique ids and
  titles, a body of at most 1,024), refusable with :meth:`FakeWhatsApp.refuse_interactive`;
* webhook builders — :func:`text_message_payload`, :func:`document_message_payload`,
  :func:`image_message_payload`, :func:`button_reply_payload` (a press of a reply button),
  :func:`status_payload` — and :func:`signed_webhook`, which serialises a payload the way Meta does and
  signs the raw bytes with ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256(app_secret, body)>``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from tests.fakes.http_fake import RoutedHandler, ThreadedHttpFake, wait_for_record

JSON = dict[str, Any]

TEXT_LIMIT = 4096
#: Limits of an interactive reply-button message.
BUTTONS_MAX = 3
BUTTON_TITLE_LIMIT = 20
BUTTON_ID_LIMIT = 256
INTERACTIVE_BODY_LIMIT = 1024

#: The refusal of a message type the recipient or the account cannot take.
UNSUPPORTED_TYPE_ERROR: JSON = {
    "message": "(#131051) Unsupported message type",
    "type": "OAuthException",
    "code": 131051,
    "error_data": {"messaging_product": "whatsapp", "details": "Message type is not currently supported."},
}

#: Graph error bodies for the two throughput limits a sender must back off on.
THROUGHPUT_ERRORS: dict[int, JSON] = {
    130429: {
        "message": "(#130429) Rate limit hit",
        "type": "OAuthException",
        "code": 130429,
        "error_data": {
            "messaging_product": "whatsapp",
            "details": "Cloud API message throughput has been reached.",
        },
    },
    131056: {
        "message": "(#131056) (Business Account, Consumer Account) pair rate limit hit",
        "type": "OAuthException",
        "code": 131056,
        "error_data": {
            "messaging_product": "whatsapp",
            "details": "Message failed to send because there were too many messages sent from this phone "
            "number to the same phone number in a short period of time.",
        },
    },
}

#: MIME types the Cloud API accepts for ``document`` media (others are refused at upload).
DOCUMENT_TYPES = frozenset(
    {
        "text/plain",
        "application/pdf",
        "application/msword",
        "application/vnd.ms-excel",
        "application/vnd.ms-powerpoint",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "image/jpeg",
        "image/png",
    }
)

#: The error of a free-form message sent more than 24 h after the user last wrote.
REENGAGEMENT_ERROR: JSON = {
    "message": "(#131047) Re-engagement message",
    "type": "OAuthException",
    "code": 131047,
    "error_data": {
        "messaging_product": "whatsapp",
        "details": "Message failed to send because more than 24 hours have passed since the customer last "
        "replied to this number.",
    },
}

_MESSAGES_PATH_RE = re.compile(r"^/v(?P<version>\d+\.\d+)/(?P<phone>\d+)/(?P<edge>messages|media)/?$")
_MEDIA_INFO_RE = re.compile(r"^/v(?P<version>\d+\.\d+)/(?P<media_id>\d+)/?$")
_DOWNLOAD_RE = re.compile(r"^/download/(?P<media_id>\d+)$")


class GraphError(Exception):
    """A Graph API error answer: ``{"error": {"message", "type", "code", "fbtrace_id", ...}}``."""

    def __init__(self, status: int, error: JSON) -> None:
        super().__init__(error.get("message", ""))
        self.status = status
        self.error = dict(error, fbtrace_id=f"A{secrets.token_hex(10)}")

    def to_json(self) -> JSON:
        """Render the error as the Graph API's reply body."""
        return {"error": self.error}


def _invalid_parameter(message: str) -> GraphError:
    return GraphError(400, {"message": f"(#100) {message}", "type": "OAuthException", "code": 100})


@dataclass(frozen=True)
class WhatsAppMedia:
    """A media object held by the fake (uploaded by the bot or added by a test for inbound messages)."""

    media_id: str
    filename: str
    mime_type: str
    data: bytes

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the bytes, as Graph reports it."""
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class WhatsAppSent:
    """One accepted ``/messages`` request: the decoded body and the wamid the fake assigned."""

    phone_number_id: str
    to: str
    type: str
    body: JSON
    wamid: str
    at: float = field(default_factory=time.monotonic)

    @property
    def text(self) -> str | None:
        """``text.body`` for text messages; the body text of an interactive one."""
        text = self.body.get("text")
        if self.type == "interactive":
            text = self.body["interactive"].get("body")
            return str(text["text"]) if isinstance(text, dict) and "text" in text else None
        return str(text["body"]) if isinstance(text, dict) and "body" in text else None

    @property
    def buttons(self) -> list[tuple[str, str]]:
        """``(id, title)`` of the reply buttons of an interactive message (empty for others)."""
        if self.type != "interactive":
            return []
        action = self.body["interactive"].get("action") or {}
        return [(str(b["reply"]["id"]), str(b["reply"]["title"])) for b in action.get("buttons", [])]

    @property
    def document(self) -> JSON | None:
        """The ``document`` object (``id`` or ``link``, ``filename``, ``caption``) for documents."""
        document = self.body.get("document")
        return document if isinstance(document, dict) else None

    @property
    def reply_to(self) -> str | None:
        """The wamid in ``context.message_id`` when the message quotes another."""
        context = self.body.get("context")
        return str(context["message_id"]) if isinstance(context, dict) and "message_id" in context else None


@dataclass(frozen=True)
class ReadReceipt:
    """One accepted "mark as read" call (``{"status": "read", "message_id": WAMID}``), with the typing
    indicator it asked for (``typing_indicator.type``, ``None`` without one)."""

    message_id: str
    typing: str | None
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class GraphCall:
    """One request to the fake with the status it answered."""

    method: str
    path: str
    status: int
    body: JSON | None


class FakeWhatsApp(ThreadedHttpFake):
    """A fake Graph API for the WhatsApp Cloud API, running in a background thread on ``127.0.0.1``.

    ``graph_url`` replaces ``https://graph.facebook.com``; requests must carry
    ``Authorization: Bearer <access_token>`` and target ``phone_number_id``.
    """

    handler_class = RoutedHandler
    thread_name = "fake-whatsapp"

    def __init__(
        self, access_token: str = "EAAG-fake-access-token", phone_number_id: str = "106540352242922"
    ) -> None:
        super().__init__()
        self.access_token = access_token
        self.phone_number_id = phone_number_id
        self._cond = threading.Condition()
        self._sent: list[WhatsAppSent] = []
        self._calls: list[GraphCall] = []
        self._media: dict[str, WhatsAppMedia] = {}
        self._failures: list[GraphError] = []
        self._ids = itertools.count(1)
        self._closed_windows: set[str] = set()
        self._recipient_failures: dict[str, list[GraphError]] = {}
        self._media_faults: dict[str, int] = {}
        self._refuse_interactive = False
        self._reads: list[ReadReceipt] = []
        #: Inbound wamids a test announced (see :meth:`inbound`): a read receipt for any other is refused.
        self._inbound: set[str] = set()
        #: Seconds every media download takes (a slow CDN).
        self.media_delay = 0.0

    @property
    def graph_url(self) -> str:
        """Root URL standing in for ``https://graph.facebook.com``."""
        return self.url

    def messages_url(self, version: str = "v21.0") -> str:
        """``{graph_url}/{version}/{phone_number_id}/messages``."""
        return f"{self.graph_url}/{version}/{self.phone_number_id}/messages"

    # ------------------------------------------------------------------ test-side API

    def throttle_next(self, code: Literal[130429, 131056] = 130429, times: int = 1) -> None:
        """Answer the next ``times`` sends with HTTP 400 and the throughput error ``code``."""
        with self._cond:
            self._failures.extend(GraphError(400, THROUGHPUT_ERRORS[code]) for _ in range(times))

    def throttle_recipient(self, to: str, code: Literal[130429, 131056] = 131056, times: int = 1) -> None:
        """Answer the next ``times`` sends to ``to`` (only) with the throughput error ``code``."""
        with self._cond:
            self._recipient_failures.setdefault(to, []).extend(
                GraphError(400, THROUGHPUT_ERRORS[code]) for _ in range(times)
            )

    def close_window(self, to: str) -> None:
        """Refuse every later free-form message to ``to`` with error 131047 (24 h since they last wrote)."""
        with self._cond:
            self._closed_windows.add(to)

    def refuse_interactive(self, refuse: bool = True) -> None:
        """Refuse every interactive message (error 131051, unsupported message type), as for an account or
        a recipient that cannot take them."""
        with self._cond:
            self._refuse_interactive = refuse

    def open_window(self, to: str) -> None:
        """``to`` wrote again: messages to them are accepted again."""
        with self._cond:
            self._closed_windows.discard(to)

    def fail_media(self, media_id: str, status: int = 500) -> None:
        """Make downloads of ``media_id`` fail with ``status``."""
        with self._cond:
            self._media_faults[media_id] = status

    def add_media(self, data: bytes, mime_type: str, filename: str = "file") -> str:
        """Store media as if a user had sent it; return the media id to put in a webhook payload."""
        return self._store_media(data, mime_type, filename).media_id

    def media(self, media_id: str) -> WhatsAppMedia | None:
        """A media object the fake holds (uploaded or added), or None."""
        with self._cond:
            return self._media.get(media_id)

    def inbound(self, payload: JSON) -> JSON:
        """Remember the wamids of a webhook payload's messages as ones a user sent (so they can be marked
        read, as on the real API, where only received messages can be); returns ``payload``."""
        with self._cond:
            for entry in payload.get("entry", []):
                for change in entry.get("changes", []):
                    for message in change.get("value", {}).get("messages", []):
                        self._inbound.add(str(message.get("id")))
        return payload

    @property
    def reads(self) -> list[ReadReceipt]:
        """Accepted read receipts (with or without a typing indicator), oldest first (a copy)."""
        with self._cond:
            return list(self._reads)

    def wait_for_read(self, predicate: Callable[[ReadReceipt], bool], timeout: float = 5.0) -> ReadReceipt:
        """Block until a read receipt matching ``predicate`` was accepted; return the first match."""
        return wait_for_record(
            self._cond,
            lambda: self._reads,
            predicate,
            timeout,
            lambda: f"fake WhatsApp: no matching read receipt after {timeout}s; got {self._reads}",
        )

    @property
    def sent(self) -> list[WhatsAppSent]:
        """Accepted messages, oldest first (a copy)."""
        with self._cond:
            return list(self._sent)

    @property
    def calls(self) -> list[GraphCall]:
        """Every request, with the status answered, oldest first (a copy)."""
        with self._cond:
            return list(self._calls)

    def wait_for(self, predicate: Callable[[WhatsAppSent], bool], timeout: float = 5.0) -> WhatsAppSent:
        """Block until a record in :attr:`sent` matches ``predicate``; return the first match."""

        def failure() -> str:
            seen = [(r.to, r.type, r.text) for r in self._sent]
            return f"fake WhatsApp: no matching message after {timeout}s; sent {seen}"

        return wait_for_record(self._cond, lambda: self._sent, predicate, timeout, failure)

    async def wait_for_async(
        self, predicate: Callable[[WhatsAppSent], bool], timeout: float = 5.0
    ) -> WhatsAppSent:
        """:meth:`wait_for` for async tests: waits in a worker thread so the event loop keeps running."""
        return await asyncio.to_thread(self.wait_for, predicate, timeout)

    # ------------------------------------------------------------------ internals

    def _store_media(self, data: bytes, mime_type: str, filename: str) -> WhatsAppMedia:
        with self._cond:
            media_id = str(1_000_000_000_000_000 + next(self._ids))
            stored = WhatsAppMedia(media_id=media_id, filename=filename, mime_type=mime_type, data=data)
            self._media[media_id] = stored
            return stored

    def answer(
        self, verb: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        """One request to the fake Graph API (:class:`tests.fakes.http_fake.RoutedHandler`)."""
        status, data, content_type = self._handle(verb, urlsplit(target).path, headers, body)
        return status, data, {"Content-Type": content_type}

    def _handle(self, verb: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        decoded: JSON | None = None
        try:
            auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
            if auth != f"Bearer {self.access_token}":
                raise GraphError(
                    401,
                    {
                        "message": "Invalid OAuth access token - Cannot parse access token",
                        "type": "OAuthException",
                        "code": 190,
                    },
                )
            content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
            download = _DOWNLOAD_RE.match(path)
            if verb == "GET" and download:
                if self.media_delay > 0:
                    time.sleep(self.media_delay)
                with self._cond:
                    fault = self._media_faults.get(download["media_id"])
                if fault is not None:
                    raise GraphError(
                        fault, {"message": "Media download failed", "type": "OAuthException", "code": 1}
                    )
                media = self.media(download["media_id"])
                if media is None:
                    raise GraphError(
                        404, {"message": "Media not found", "type": "OAuthException", "code": 100}
                    )
                self._log(verb, path, 200, None)
                return 200, media.data, media.mime_type
            info = _MEDIA_INFO_RE.match(path)
            if verb == "GET" and info:
                result = self._media_info(info["media_id"])
            else:
                edge = _MESSAGES_PATH_RE.match(path)
                if verb != "POST" or edge is None:
                    raise GraphError(
                        400,
                        {
                            "message": "Unknown path components: " + path,
                            "type": "OAuthException",
                            "code": 2500,
                        },
                    )
                if edge["phone"] != self.phone_number_id:
                    raise _invalid_parameter(
                        f"Unsupported post request. Object with ID '{edge['phone']}' does not exist, "
                        "cannot be loaded due to missing permissions, or does not support this operation"
                    )
                if edge["edge"] == "media":
                    result = self._upload(content_type, body)
                else:
                    try:
                        decoded = json.loads(body or b"null")
                    except ValueError as exc:
                        raise _invalid_parameter("Invalid parameter: body is not JSON") from exc
                    result = self._send(decoded)
            status, data = 200, result
        except GraphError as exc:
            status, data = exc.status, exc.to_json()
        self._log(verb, path, status, decoded)
        return status, json.dumps(data).encode(), "application/json"

    def _log(self, verb: str, path: str, status: int, body: JSON | None) -> None:
        with self._cond:
            self._calls.append(GraphCall(verb, path, status, body))
            self._cond.notify_all()

    def _media_info(self, media_id: str) -> JSON:
        media = self.media(media_id)
        if media is None:
            raise _invalid_parameter(f"Unsupported get request. Object with ID '{media_id}' does not exist")
        return {
            "messaging_product": "whatsapp",
            "url": f"{self.graph_url}/download/{media.media_id}",
            "mime_type": media.mime_type,
            "sha256": media.sha256,
            "file_size": len(media.data),
            "id": media.media_id,
        }

    def _upload(self, content_type: str, body: bytes) -> JSON:
        fields, files = _parse_multipart(content_type, body)
        if fields.get("messaging_product") != "whatsapp":
            raise _invalid_parameter("The parameter messaging_product is required.")
        if "file" not in files:
            raise _invalid_parameter("The parameter file is required.")
        filename, mime_type, data = files["file"]
        declared = fields.get("type") or mime_type
        if declared not in DOCUMENT_TYPES:
            raise _invalid_parameter(
                f"Param file must be a file with one of the following types: {', '.join(sorted(DOCUMENT_TYPES))}. "
                f"Received file of type '{declared}'."
            )
        stored = self._store_media(data, fields.get("type") or mime_type, filename)
        return {"id": stored.media_id}

    def _send(self, body: Any) -> JSON:
        if not isinstance(body, dict) or body.get("messaging_product") != "whatsapp":
            raise _invalid_parameter("The parameter messaging_product is required.")
        if "status" in body:
            return self._mark_read(body)
        to = str(body.get("to") or "")
        if not to:
            raise _invalid_parameter("The parameter to is required.")
        kind = str(body.get("type") or "text")
        if kind == "text":
            text = body.get("text")
            if not isinstance(text, dict) or not str(text.get("body") or ""):
                raise _invalid_parameter("The parameter text['body'] is required.")
            if len(str(text["body"])) > TEXT_LIMIT:
                raise _invalid_parameter(f"Param text['body'] must be at most {TEXT_LIMIT} characters long.")
        elif kind == "document":
            document = body.get("document")
            if not isinstance(document, dict) or not ("id" in document or "link" in document):
                raise _invalid_parameter("The parameter document['id'] or document['link'] is required.")
            if "id" in document and self.media(str(document["id"])) is None:
                raise GraphError(
                    400,
                    {
                        "message": "(#131053) Media upload error",
                        "type": "OAuthException",
                        "code": 131053,
                        "error_data": {"messaging_product": "whatsapp", "details": "Unknown media id"},
                    },
                )
        elif kind == "interactive":
            _check_interactive(body.get("interactive"))
            with self._cond:
                if self._refuse_interactive:
                    raise GraphError(400, UNSUPPORTED_TYPE_ERROR)
        else:
            raise _invalid_parameter(
                f"Param type must be one of {{TEXT, DOCUMENT, INTERACTIVE}} in this fake, got {kind}"
            )
        with self._cond:
            if self._failures:
                raise self._failures.pop(0)
            if to in self._closed_windows:
                raise GraphError(400, REENGAGEMENT_ERROR)
            if self._recipient_failures.get(to):
                raise self._recipient_failures[to].pop(0)
            wamid = _wamid()
            self._sent.append(WhatsAppSent(self.phone_number_id, to, kind, body, wamid))
            self._cond.notify_all()
        return {
            "messaging_product": "whatsapp",
            "contacts": [{"input": to, "wa_id": to}],
            "messages": [{"id": wamid}],
        }

    def _mark_read(self, body: JSON) -> JSON:
        """``{"status": "read", "message_id": W[, "typing_indicator": {"type": "text"}]}``: mark a received
        message read (and show "typing…" until a reply is sent or 25 s pass)."""
        if body.get("status") != "read":
            raise _invalid_parameter("Param status must be 'read'.")
        message_id = str(body.get("message_id") or "")
        if not message_id:
            raise _invalid_parameter("The parameter message_id is required.")
        typing = body.get("typing_indicator")
        kind: str | None = None
        if typing is not None:
            if not isinstance(typing, dict) or typing.get("type") != "text":
                raise _invalid_parameter("Param typing_indicator['type'] must be 'text'.")
            kind = "text"
        with self._cond:
            if self._inbound and message_id not in self._inbound:
                raise _invalid_parameter(
                    f"Invalid parameter: message_id {message_id} is not a received message"
                )
            self._reads.append(ReadReceipt(message_id, kind))
            self._cond.notify_all()
        return {"success": True}


def _check_interactive(interactive: Any) -> None:
    """Refuse an interactive reply-button message the Cloud API would refuse (error 131009, with details)."""

    def invalid(details: str) -> GraphError:
        error = {
            "message": "(#131009) Parameter value is not valid",
            "type": "OAuthException",
            "code": 131009,
            "error_data": {"messaging_product": "whatsapp", "details": details},
        }
        return GraphError(400, error)

    if not isinstance(interactive, dict) or interactive.get("type") != "button":
        raise invalid("interactive['type'] must be 'button' in this fake")
    body = interactive.get("body")
    text = str(body.get("text") or "") if isinstance(body, dict) else ""
    if not text or len(text) > INTERACTIVE_BODY_LIMIT:
        raise invalid(f"Body text is required and must be at most {INTERACTIVE_BODY_LIMIT} characters")
    action = interactive.get("action")
    buttons = action.get("buttons") if isinstance(action, dict) else None
    if not isinstance(buttons, list) or not 1 <= len(buttons) <= BUTTONS_MAX:
        raise invalid(f"Buttons count is invalid: must be 1 to {BUTTONS_MAX}")
    ids, titles = set(), set()
    for button in buttons:
        reply = button.get("reply") if isinstance(button, dict) else None
        if not isinstance(reply, dict) or button.get("type") != "reply":
            raise invalid("Each button must be of type 'reply' with a 'reply' object")
        button_id, title = str(reply.get("id") or ""), str(reply.get("title") or "")
        if not button_id or len(button_id) > BUTTON_ID_LIMIT or button_id in ids:
            raise invalid(f"Button id must be unique and 1 to {BUTTON_ID_LIMIT} characters")
        if not title or len(title) > BUTTON_TITLE_LIMIT or title in titles:
            raise invalid(f"Button title must be unique and 1 to {BUTTON_TITLE_LIMIT} characters")
        ids.add(button_id)
        titles.add(title)


def _parse_multipart(
    content_type: str, body: bytes
) -> tuple[dict[str, str], dict[str, tuple[str, str, bytes]]]:
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.lower().startswith("multipart/form-data") or match is None:
        raise _invalid_parameter("Upload must be multipart/form-data")
    fields: dict[str, str] = {}
    files: dict[str, tuple[str, str, bytes]] = {}
    for chunk in body.split(b"--" + match.group(1).encode("latin-1"))[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, data = chunk.removeprefix(b"\r\n").removesuffix(b"\r\n").partition(b"\r\n\r\n")
        headers = {}
        for line in head.decode("utf-8", "replace").split("\r\n"):
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        disposition = headers.get("content-disposition", "")
        name = re.search(r'\bname="([^"]*)"', disposition)
        filename = re.search(r'\bfilename="([^"]*)"', disposition)
        filename_star = re.search(r"\bfilename\*=[^']*''([^;]+)", disposition)
        key = name.group(1) if name else ""
        if filename or filename_star:
            shown = (
                unquote(filename_star.group(1)) if filename_star else filename.group(1) if filename else ""
            )
            files[key] = (shown, headers.get("content-type", "application/octet-stream"), data)
        else:
            fields[key] = data.decode("utf-8")
    return fields, files


def _wamid() -> str:
    return "wamid.HBgL" + secrets.token_hex(16).upper()


# ---------------------------------------------------------------------- webhooks


def _envelope(phone_number_id: str, display_phone_number: str, value: JSON) -> JSON:
    return {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": "102290129340398",
                "changes": [
                    {
                        "value": {
                            "messaging_product": "whatsapp",
                            "metadata": {
                                "display_phone_number": display_phone_number,
                                "phone_number_id": phone_number_id,
                            },
                            **value,
                        },
                        "field": "messages",
                    }
                ],
            }
        ],
    }


def text_message_payload(
    from_number: str,
    body: str,
    *,
    wamid: str | None = None,
    name: str = "Alice",
    phone_number_id: str = "106540352242922",
    display_phone_number: str = "15550783881",
    timestamp: int | None = None,
) -> JSON:
    """A Cloud API webhook payload carrying one inbound text message (``value.messages[0]``)."""
    message = {
        "from": from_number,
        "id": wamid or _wamid(),
        "timestamp": str(timestamp if timestamp is not None else int(time.time())),
        "type": "text",
        "text": {"body": body},
    }
    value = {"contacts": [{"profile": {"name": name}, "wa_id": from_number}], "messages": [message]}
    return _envelope(phone_number_id, display_phone_number, value)


def document_message_payload(
    from_number: str,
    media_id: str,
    *,
    filename: str,
    mime_type: str,
    sha256: str,
    caption: str | None = None,
    wamid: str | None = None,
    name: str = "Alice",
    phone_number_id: str = "106540352242922",
    display_phone_number: str = "15550783881",
) -> JSON:
    """A webhook payload carrying an inbound document (fetch it via ``GET /v{N}/{media_id}``)."""
    document: JSON = {"filename": filename, "mime_type": mime_type, "sha256": sha256, "id": media_id}
    return _media_payload(
        from_number, "document", document, caption, wamid, name, phone_number_id, display_phone_number
    )


def image_message_payload(
    from_number: str,
    media_id: str,
    *,
    mime_type: str = "image/png",
    sha256: str = "",
    caption: str | None = None,
    wamid: str | None = None,
    name: str = "Alice",
    phone_number_id: str = "106540352242922",
    display_phone_number: str = "15550783881",
) -> JSON:
    """A webhook payload carrying an inbound image (no file name, as WhatsApp sends photos)."""
    image: JSON = {"mime_type": mime_type, "sha256": sha256, "id": media_id}
    return _media_payload(
        from_number, "image", image, caption, wamid, name, phone_number_id, display_phone_number
    )


def audio_message_payload(
    from_number: str,
    media_id: str,
    *,
    mime_type: str = "audio/ogg; codecs=opus",
    sha256: str = "",
    voice: bool = True,
    wamid: str | None = None,
    name: str = "Alice",
    phone_number_id: str = "106540352242922",
    display_phone_number: str = "15550783881",
) -> JSON:
    """A webhook payload carrying an inbound audio message (a voice note by default: OGG/Opus, ``voice``)."""
    audio: JSON = {"mime_type": mime_type, "sha256": sha256, "id": media_id, "voice": voice}
    return _media_payload(
        from_number, "audio", audio, None, wamid, name, phone_number_id, display_phone_number
    )


def _media_payload(
    from_number: str,
    kind: str,
    media: JSON,
    caption: str | None,
    wamid: str | None,
    name: str,
    phone_number_id: str,
    display_phone_number: str,
) -> JSON:
    """A webhook payload carrying one inbound media message of type ``kind`` (``media`` plus the caption)."""
    if caption is not None:
        media["caption"] = caption
    message = {
        "from": from_number,
        "id": wamid or _wamid(),
        "timestamp": str(int(time.time())),
        "type": kind,
        kind: media,
    }
    value = {"contacts": [{"profile": {"name": name}, "wa_id": from_number}], "messages": [message]}
    return _envelope(phone_number_id, display_phone_number, value)


def button_reply_payload(
    from_number: str,
    button_id: str,
    title: str,
    *,
    context_wamid: str,
    wamid: str | None = None,
    name: str = "Alice",
    phone_number_id: str = "106540352242922",
    display_phone_number: str = "15550783881",
) -> JSON:
    """A webhook payload carrying a press of a reply button under the message ``context_wamid`` (an
    ``interactive`` message of type ``button_reply``)."""
    message = {
        "context": {"from": display_phone_number, "id": context_wamid},
        "from": from_number,
        "id": wamid or _wamid(),
        "timestamp": str(int(time.time())),
        "type": "interactive",
        "interactive": {"type": "button_reply", "button_reply": {"id": button_id, "title": title}},
    }
    value = {"contacts": [{"profile": {"name": name}, "wa_id": from_number}], "messages": [message]}
    return _envelope(phone_number_id, display_phone_number, value)


def status_payload(
    wamid: str,
    recipient_id: str,
    status: Literal["sent", "delivered", "read", "failed"] = "delivered",
    *,
    phone_number_id: str = "106540352242922",
    display_phone_number: str = "15550783881",
) -> JSON:
    """A webhook payload carrying a delivery receipt (``value.statuses[0]``), with no ``messages``."""
    receipt: JSON = {
        "id": wamid,
        "status": status,
        "timestamp": str(int(time.time())),
        "recipient_id": recipient_id,
    }
    if status == "failed":
        receipt["errors"] = [
            {
                "code": 131047,
                "title": "Re-engagement message",
                "message": "Re-engagement message",
                "error_data": {"details": REENGAGEMENT_ERROR["error_data"]["details"]},
            }
        ]
    else:
        receipt["conversation"] = {"id": secrets.token_hex(16), "origin": {"type": "service"}}
        receipt["pricing"] = {"billable": True, "pricing_model": "CBP", "category": "service"}
    return _envelope(phone_number_id, display_phone_number, {"statuses": [receipt]})


def signed_webhook(app_secret: str, payload: JSON) -> tuple[bytes, dict[str, str]]:
    """Serialise ``payload`` as Meta does and sign it; return ``(body_bytes, headers)``.

    The body is compact JSON with non-ASCII escaped as ``\\uXXXX``; the signature covers exactly these
    bytes, so a receiver must verify the raw body before parsing it.
    """
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    digest = hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {"Content-Type": "application/json", "X-Hub-Signature-256": f"sha256={digest}"}
    return body, headers


def verification_params(verify_token: str, challenge: str = "1158201444") -> dict[str, str]:
    """Query parameters of Meta's webhook verification GET (``hub.mode=subscribe``)."""
    return {"hub.mode": "subscribe", "hub.verify_token": verify_token, "hub.challenge": challenge}
