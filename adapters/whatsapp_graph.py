"""Meta's side of the WhatsApp channel, without I/O: the webhook signature, the webhook payload's shape, and
the Graph API's refusals with what each means to the person whose reply it was.

:mod:`adapters.whatsapp` does the talking (the webhook server, the Graph calls); everything here is pure, so
it is read and tested on its own.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import mimetypes
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from adapters.platform import Button, Inbound, Press, SendFailure

THROUGHPUT_CODES = frozenset({130429, 131056})
#: The re-engagement refusal: more than 24 h since the user last wrote (only templates may be sent then).
REENGAGEMENT_CODE = 131047
#: Limits of an interactive reply-button message: buttons, a button's title, its id, the body text.
MAX_BUTTONS = 3
MAX_BUTTON_TITLE = 20
MAX_BUTTON_ID = 256
MAX_INTERACTIVE_BODY = 1024
#: Errors that are about our account or Meta's side, not this reply: retried (the operator may fix them).
RETRY_CODES = frozenset({1, 2, 4, 190, 131000, 131016, 133004})
MEDIA_KINDS = ("document", "image", "audio", "video", "sticker")
#: MIME types the Cloud API accepts for documents; text of any kind goes as text/plain.
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
    }
)
_TEXT_LIKE = frozenset({"application/json", "application/xml", "application/x-yaml", "application/toml"})
#: Plain words for WhatsApp's refusals a user may meet (error code → explanation).
_EXPLANATIONS = {
    131047: "more than 24 hours had passed since your last message, and WhatsApp only allows replies within "
    "24 hours",
    131026: "WhatsApp could not deliver it to this number",
    131051: "WhatsApp does not support that kind of message",
    131052: "WhatsApp could not handle the attached file",
    131053: "WhatsApp refused the attached file",
}


class GraphSendError(Exception):
    """The Graph API refused a request (after the retries for throughput errors)."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        self.status = status
        self.code = as_int(error.get("code"))
        self.title = str(error.get("message") or error.get("title") or "")
        details = error.get("error_data")
        self.details = str(details.get("details") or "") if isinstance(details, dict) else ""
        super().__init__(
            f"Graph API {status}: {self.title or error}" + (f" ({self.details})" if self.details else "")
        )


@dataclass(frozen=True)
class ParsedMessage:
    """One inbound message of a webhook, checked: what to queue now, a media job to finish later, or a press
    of a question's button (``inbound`` is then the press's own message, to mark read and reply to)."""

    inbound: Inbound
    media: dict[str, Any] | None = None
    press: Press | None = None


def as_int(value: Any) -> int | None:
    """``value`` as an int, or None (payload fields are whatever Meta sent)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is an object, else an empty one."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def explain(code: int | None, text: str = "") -> str:
    """What a WhatsApp refusal means, in plain words."""
    if code in _EXPLANATIONS:
        return _EXPLANATIONS[code]
    if code == 100 and "type" in text.lower():
        return "WhatsApp does not accept that type of file"
    return "WhatsApp refused the message"


def valid_signature(app_secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is ``sha256=<hex HMAC-SHA256(app_secret, body)>`` (constant-time compare)."""
    if not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.removeprefix("sha256=").strip().lower().encode())


def webhook_values(payload: Any, phone_number_id: str) -> Iterator[dict[str, Any]]:
    """The ``value`` objects of the phone number ``phone_number_id`` in a webhook payload (anything else is
    skipped). Raises ValueError when the payload is not shaped like one at all."""
    if not isinstance(payload, dict):
        raise ValueError("the payload is not an object")
    entries = payload.get("entry")
    if entries is not None and not isinstance(entries, list):
        raise ValueError("entry is not a list")
    for entry in as_list(entries):
        for change in as_list(as_dict(entry).get("changes")):
            value = as_dict(as_dict(change).get("value"))
            number = as_dict(value.get("metadata")).get("phone_number_id")
            if number and str(number) != phone_number_id:
                continue  # another number of the same app
            yield value


def parse_messages(value: dict[str, Any], log: logging.Logger) -> Iterator[ParsedMessage]:
    """The inbound messages of one ``value`` that we can take in; odd ones are logged on ``log`` and
    skipped."""
    names = {}
    for contact in as_list(value.get("contacts")):
        contact = as_dict(contact)
        names[str(contact.get("wa_id"))] = str(as_dict(contact.get("profile")).get("name") or "")
    for message in as_list(value.get("messages")):
        try:
            parsed = _parse_message(as_dict(message), names, log)
        except Exception as exc:
            log.warning("skipped a WhatsApp message of unexpected shape (%s): %.300r", exc, message)
            continue
        if parsed is not None:
            yield parsed


def _parse_message(
    message: dict[str, Any], names: dict[str, str], log: logging.Logger
) -> ParsedMessage | None:
    sender = str(message.get("from") or "")
    wamid = str(message.get("id") or "")
    kind = str(message.get("type") or "")
    if not sender or not wamid:
        return None
    inbound = Inbound(
        conversation=sender,
        sender_id=sender,
        sender=names.get(sender) or sender,
        text="",
        external_id=wamid,
        metadata={"wamid": wamid, "type": kind},
    )
    if kind == "text":
        text = str(as_dict(message.get("text")).get("body") or "")
        return ParsedMessage(replace(inbound, text=text))
    if kind in MEDIA_KINDS:
        media = as_dict(message.get(kind))
        caption = str(media.get("caption") or "")
        return ParsedMessage(replace(inbound, text=caption), media=media)
    reply = as_dict(as_dict(message.get("interactive")).get("button_reply"))
    if kind == "interactive" and reply.get("id"):
        press = Press(conversation=sender, sender_id=sender, sender=inbound.sender, data=str(reply["id"]))
        return ParsedMessage(inbound, press=press)
    log.info("ignored a WhatsApp %s message from %s", kind, sender)
    return None


def question_message(to: str, text: str, buttons: list[Button]) -> dict[str, Any] | None:
    """The Graph API body of a question with reply buttons (an ``interactive`` message of type ``button``),
    or None when it does not fit one: more than three buttons, or a question longer than 1,024 characters
    (never cut short: a command or a diff is seen whole where it is allowed)."""
    if not buttons or len(buttons) > MAX_BUTTONS or len(text) > MAX_INTERACTIVE_BODY:
        return None
    if any(len(b.data) > MAX_BUTTON_ID for b in buttons):
        return None
    replies = [
        {"type": "reply", "reply": {"id": b.data, "title": b.label[:MAX_BUTTON_TITLE]}} for b in buttons
    ]
    return {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "interactive",
        "interactive": {"type": "button", "body": {"text": text}, "action": {"buttons": replies}},
    }


def document_type(path: Path) -> str:
    """The MIME type to upload ``path`` as: its own when the Cloud API takes it, text/plain for any text
    (Markdown, code, JSON — the Cloud API refuses text/markdown)."""
    mime = mimetypes.guess_type(path.name)[0] or ""
    if mime in DOCUMENT_TYPES:
        return mime
    if mime.startswith("text/") or mime in _TEXT_LIKE:
        return "text/plain"
    if not mime:
        try:
            path.read_bytes()[:4096].decode("utf-8")
        except UnicodeDecodeError:
            return "application/octet-stream"
        return "text/plain"
    return mime


def classify_send_error(exc: Exception) -> SendFailure:
    """Whether a failed send is worth retrying (network trouble, throughput limits, our account's
    trouble) or refused for good, with the plain explanation the user gets then."""
    if not isinstance(exc, GraphSendError):
        return SendFailure(False, f"{type(exc).__name__}: {exc}")  # network trouble: try again
    reason = f"WhatsApp {exc.code}: {exc.title}" + (f" ({exc.details})" if exc.details else "")
    transient = (
        exc.status == 429
        or exc.status >= 500
        or exc.status == 401
        or exc.code in THROUGHPUT_CODES
        or exc.code in RETRY_CODES
    )
    if transient:
        return SendFailure(False, reason)
    return SendFailure(True, reason, explain(exc.code, exc.title))


def wamid_of(result: dict[str, Any]) -> str | None:
    """The id WhatsApp gave the message a Graph call sent (None when the answer names none)."""
    messages = as_list(result.get("messages"))
    first = as_dict(messages[0]) if messages else {}
    return str(first["id"]) if first.get("id") else None
