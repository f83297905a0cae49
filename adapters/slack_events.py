"""What the Slack channel reads and writes, without I/O: events and slash commands into :class:`Inbound`
messages, conversation ids, the text Slack shows (mrkdwn), and which send errors are for good.

- A **conversation** is ``CHANNEL`` or ``CHANNEL:THREAD_TS`` (a thread is a conversation of its own, with its
  own agent session and queue), and ``...@USER`` for a message only that user sees in it (an ephemeral
  message: how a pairing code is given in a channel others read).
- An **event** is taken when a person wrote it: a direct message always, elsewhere only when it mentions the
  bot (``<@BOT>``, removed from the text); the bot's own messages, other bots', edits, deletions and joins
  are not (Slack's ``subtype``: only plain messages, ``file_share`` and ``thread_broadcast`` are text a
  person wrote). The external id is ``CHANNEL:TS``: Slack's retries of one event, and the ``message`` and
  ``app_mention`` events of one mention, are one message.
- A **slash command** becomes the chat command it names: the app's own (``/agentpost status`` →
  ``/status``), or one the app registered under a command's name (``/queue collect``).
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.platform import Button, Inbound, Press, SendFailure

#: ``subtype`` values of message events that carry what a person wrote (None: a plain message).
USER_SUBTYPES = frozenset({"file_share", "thread_broadcast"})

#: Errors Slack answers for a message that can never be delivered, with what the user is told.
PERMANENT_ERRORS: dict[str, str] = {
    "channel_not_found": "the channel could not be found",
    "not_in_channel": "the app is not a member of this channel (invite it with /invite)",
    "is_archived": "the channel is archived",
    "account_inactive": "the app's token was revoked or its workspace deactivated",
    "token_revoked": "the app's token was revoked",
    "invalid_auth": "the app's token is not valid",
    "not_authed": "the app's token is missing",
    "missing_scope": "the app lacks a permission it needs (see agentpost doctor)",
    "restricted_action": "the workspace does not let the app post here",
    "user_not_in_channel": "the person is not in this channel",
    "msg_too_long": "the message was too long for Slack",
    "no_text": "Slack refused an empty message",
}
#: Errors of Slack's own trouble: worth trying again.
TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
#: chat.update refusals meaning the message cannot be edited any more (send a new one).
NOT_EDITABLE = frozenset({"message_not_found", "cant_update_message", "edit_window_closed"})

_MENTION_RE = r"<@{}(?:\|[^>]*)?>"
_TS_RE = re.compile(r"^\d+\.\d+$")


def conversation_of(channel: str, thread_ts: str | None = None) -> str:
    """The conversation id of ``channel``, or of a thread in it."""
    return f"{channel}:{thread_ts}" if thread_ts else channel


def split_conversation(conversation: str) -> tuple[str, str | None, str | None]:
    """``CHANNEL[:THREAD_TS][@USER]`` → (channel, thread ts or None, ephemeral recipient or None)."""
    place, _, user = conversation.partition("@")
    channel, _, thread = place.partition(":")
    return channel, (thread if _TS_RE.match(thread) else None), (user or None)


def ephemeral(conversation: str, user: str) -> str:
    """The conversation of a message only ``user`` sees in ``conversation``."""
    return f"{conversation.partition('@')[0]}@{user}"


@dataclass(frozen=True)
class SlackMessage:
    """A message a person sent, as read from an event: the inbound message without its files, and the
    files Slack lists (fetched later, and only for a known sender)."""

    inbound: Inbound
    files: list[Mapping[str, Any]] = field(default_factory=list)


def _text_in(text: str) -> str:
    # Slack escapes these three in what it sends; the agent reads them plain.
    return html.unescape(text) if "&" in text else text


def parse_event(event: Mapping[str, Any], bot_user_id: str) -> SlackMessage | None:
    """The message in an Events API ``event`` (``message`` or ``app_mention``), or None when it is not one
    a person sent to the bot."""
    kind = event.get("type")
    if kind not in ("message", "app_mention"):
        return None
    subtype = event.get("subtype")
    user = str(event.get("user") or "")
    if (subtype is not None and subtype not in USER_SUBTYPES) or event.get("bot_id") or not user:
        return None
    if user == bot_user_id:
        return None
    channel, ts = str(event.get("channel") or ""), str(event.get("ts") or "")
    if not channel or not ts:
        return None
    channel_type = str(event.get("channel_type") or ("channel" if kind == "app_mention" else ""))
    text = str(event.get("text") or "")
    if channel_type != "im":
        mention = re.compile(_MENTION_RE.format(re.escape(bot_user_id)))
        if not bot_user_id or not mention.search(text):
            return None  # in a channel, only what is said to the bot
        text = mention.sub("", text).strip()
    thread = str(event.get("thread_ts") or "") or None
    files = [f for f in event.get("files") or () if isinstance(f, Mapping)]
    inbound = Inbound(
        conversation=conversation_of(channel, thread),
        sender_id=user,
        sender=user,
        text=_text_in(text),
        external_id=f"{channel}:{ts}",
        metadata={"channel_type": channel_type, "slack_ts": ts, "team": str(event.get("team") or "")},
        sent_at=int(float(ts) * 1000),
    )
    return SlackMessage(inbound, files)


def slash_text(command: str, text: str, own: str = "/agentpost") -> str:
    """What a slash command says as a chat message. The app's own command ``own`` carries a chat command
    in its text: ``/agentpost status`` → ``/status``, ``/agentpost`` alone → ``/help``. Any other command
    the app registered is the chat command of its name: ``/queue collect`` → ``/queue collect``."""
    name = command.strip().lstrip("/").lower()
    text = text.strip()
    if name != own.strip().lstrip("/").lower():
        return f"/{name} {text}".strip()
    return "/" + text.lstrip("/") if text else "/help"


def parse_slash(payload: Mapping[str, Any], own: str = "/agentpost") -> Inbound | None:
    """A slash command's payload (form fields, or a Socket Mode ``slash_commands`` envelope) as a message
    in the channel it was typed in (Slack tells no thread); ``own`` is the app's own command."""
    channel, user = str(payload.get("channel_id") or ""), str(payload.get("user_id") or "")
    if not channel or not user:
        return None
    trigger = str(payload.get("trigger_id") or "")
    return Inbound(
        conversation=channel,
        sender_id=user,
        sender=str(payload.get("user_name") or user),
        text=slash_text(str(payload.get("command") or ""), _text_in(str(payload.get("text") or "")), own),
        external_id=f"{channel}:command:{trigger}",
        metadata={"channel_type": "im" if channel.startswith("D") else "channel", "slash": True},
    )


# -- questions with buttons (Block Kit) ----------------------------------------------------------------------
#: Slack's limits: a section's text, a button's label.
SECTION_LIMIT, LABEL_LIMIT = 3000, 75


def text_blocks(text: str) -> list[dict[str, Any]]:
    """``text`` as one Block Kit section (what a question becomes once answered: no buttons left)."""
    return [{"type": "section", "text": {"type": "mrkdwn", "text": to_mrkdwn(text)[:SECTION_LIMIT]}}]


def question_blocks(text: str, buttons: list[Button]) -> list[dict[str, Any]]:
    """A question as Block Kit: its text, then one button per answer carrying the answer's data as its
    ``value`` (handed back in the ``block_actions`` payload of a press)."""
    elements = [
        {
            "type": "button",
            "text": {"type": "plain_text", "text": button.label[:LABEL_LIMIT]},
            "action_id": f"agentpost-answer-{i}",
            "value": button.data,
        }
        for i, button in enumerate(buttons)
    ]
    return [*text_blocks(text), {"type": "actions", "block_id": "agentpost-question", "elements": elements}]


def parse_presses(payload: Mapping[str, Any]) -> list[Press]:
    """The button presses in an interaction payload (``block_actions``), in the conversation of the message
    whose button was pressed; none for other interactions."""
    if payload.get("type") != "block_actions":
        return []
    user = payload.get("user") or {}
    container = payload.get("container") or {}
    message = payload.get("message") or {}
    channel = str((payload.get("channel") or {}).get("id") or container.get("channel_id") or "")
    user_id = str(user.get("id") or "")
    if not channel or not user_id:
        return []
    thread = str(message.get("thread_ts") or container.get("thread_ts") or "") or None
    if thread and thread == str(message.get("ts") or container.get("message_ts") or ""):
        thread = None  # a top-level message with replies names itself as the thread
    sender = str(user.get("username") or user.get("name") or user_id)
    return [
        Press(conversation_of(channel, thread), user_id, sender, str(action.get("value") or ""))
        for action in payload.get("actions") or ()
        if isinstance(action, Mapping) and action.get("value")
    ]


# -- text out ---------------------------------------------------------------------------------------------
def escape(text: str) -> str:
    """Text as Slack must receive it: ``&``, ``<`` and ``>`` escaped (else ``<...>`` is read as a link)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_ITALIC_RE = re.compile(r"(?<![*\w])\*(?![\s*])([^*\n]+?)(?<![\s*])\*(?![*\w])")
_BOLD_RE = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_LINK_RE = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s]+)\)")
_HEADING_RE = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)


def to_mrkdwn(text: str) -> str:
    """An agent's Markdown as Slack's mrkdwn: escaped, ``**bold**`` → ``*bold*``, ``*italic*`` →
    ``_italic_``, ``[label](url)`` → ``<url|label>``, headings bold. Code (fenced or inline) is only
    escaped."""
    parts = re.split(r"(```.*?(?:```|$)|`[^`\n]+`)", text, flags=re.DOTALL)
    out = []
    for i, part in enumerate(parts):
        part = escape(part)
        if i % 2 == 0:  # outside code
            part = _ITALIC_RE.sub(r"_\1_", part)
            part = _HEADING_RE.sub(r"*\1*", part)
            part = _BOLD_RE.sub(r"*\1*", part)
            part = _LINK_RE.sub(lambda m: f"<{m.group(2)}|{m.group(1)}>", part)
        out.append(part)
    return "".join(out)


# -- errors -----------------------------------------------------------------------------------------------
def error_code(exc: BaseException) -> tuple[int, str, float]:
    """(HTTP status, Slack's ``error``, ``Retry-After`` seconds) of a Slack API error; (0, "", 0) for
    anything else."""
    response = getattr(exc, "response", None)
    if response is None or not hasattr(response, "status_code"):
        return 0, "", 0.0
    status = int(getattr(response, "status_code", 0) or 0)
    data = getattr(response, "data", None)
    error = str(data.get("error") or "") if isinstance(data, Mapping) else ""
    headers = getattr(response, "headers", None) or {}
    retry_after = 0.0
    for name, value in dict(headers).items():
        if str(name).lower() == "retry-after":
            try:
                retry_after = float(value)
            except (TypeError, ValueError):
                retry_after = 0.0
    return status, error, retry_after


def classify_send_error(exc: Exception) -> SendFailure:
    """Whether a failed Slack call is worth trying again: a rate limit (429, with its ``Retry-After``) and
    Slack's own trouble are; a channel that is gone, archived, or that the app is not in, and a revoked
    token, are not."""
    status, error, retry_after = error_code(exc)
    if not status and not error:
        return SendFailure(False, f"Slack: {type(exc).__name__}: {exc}")  # network trouble, a timeout
    reason = f"Slack {status}: {error or 'error'}"
    if status == 429 or error == "ratelimited":
        wait = retry_after or 1.0
        return SendFailure(False, f"{reason} (retry after {wait:g} s)", retry_after_seconds=wait)
    if status >= 500 or error in TRANSIENT_ERRORS:
        return SendFailure(False, reason)
    return SendFailure(True, reason, PERMANENT_ERRORS.get(error, "Slack refused the message"))
