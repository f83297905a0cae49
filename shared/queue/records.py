"""The records and errors the queue operations take and return, and the directory of agents they route by."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from shared.chat.address import ChatAddress
from shared.settings.routing import AGENT_NAME_RE, RouteTable, Team
from shared.storage.db import Row, Tx

#: Channels whose messages come from agentpost itself: nobody to tell about a dead letter there.
INTERNAL_CHANNELS = frozenset({"internal", "chat", "chatroom", "heartbeat", "schedule"})
MAX_MESSAGE_CHARS = 200_000
#: Channels whose messages another agent sent (a handoff, a chat-room post): they carry the user chat
#: their chain started from (``metadata.origin``).
TEAMMATE_CHANNELS = frozenset({"internal", "chat", "chatroom"})
CHANNEL_RE = AGENT_NAME_RE


class QueueError(Exception):
    """Base of the errors a queue operation raises on purpose."""


class InvalidInput(QueueError, ValueError):
    """The request is malformed; nothing was changed."""


class NotFound(QueueError, LookupError):
    """No row matches the id given; nothing was changed."""


class RetryBudgetExhausted(QueueError):
    """A dead letter was retried by hand as often as the budget allows."""


class LeaseLost(QueueError):
    """The worker no longer holds the messages it tried to complete (its lease expired)."""


@dataclass(frozen=True)
class Directory:
    """Which agents and teams exist, for routing."""

    agents: frozenset[str]
    teams: Mapping[str, Team]
    default_agent: str

    @classmethod
    def single(cls, *agents: str) -> Directory:
        """A directory of plain agents, the first being the default (handy in tests and tools)."""
        return cls(agents=frozenset(agents), teams={}, default_agent=agents[0])

    @functools.cached_property
    def routes(self) -> RouteTable:
        """The routing table, built on first use (a directory is rebuilt when the settings change)."""
        return RouteTable(self.agents, self.teams, self.default_agent)


def told_at(row: Mapping[str, Any]) -> ChatAddress | None:
    """The chat a person reads about ``row`` (a message row) in: its own chat, or for a teammate's message
    the user chat its chain started from; ``None`` when no person waits on it (a heartbeat, a schedule, a
    chain that started from one of those or carries no origin)."""
    channel = row["channel"]
    if channel not in INTERNAL_CHANNELS:
        return ChatAddress.of(row)
    if channel not in TEAMMATE_CHANNELS:
        return None
    meta = row["metadata"]
    origin = meta.get("origin") if isinstance(meta, Mapping) else _json_object(meta).get("origin")
    if not isinstance(origin, Mapping) or not origin.get("channel") or origin["channel"] in INTERNAL_CHANNELS:
        return None
    return ChatAddress.of(origin)


def _json_object(text: str | None) -> dict[str, Any]:
    """A stored JSON object; most rows hold none (``{}``), which needs no parsing."""
    if not text or text == "{}":
        return {}
    value: dict[str, Any] = json.loads(text)
    return value


class _ChatRow:
    """What a message row and a response row share: the chat they belong to."""

    channel: str
    sender: str
    sender_id: str
    conversation: str

    @property
    def address(self) -> ChatAddress:
        """The chat the message came from, or the reply goes to."""
        return ChatAddress(self.channel, self.sender, self.sender_id, self.conversation)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class QueuedMessage(_ChatRow):
    """A row of ``messages``."""

    id: int
    message_id: str
    channel: str
    sender: str
    sender_id: str
    message: str
    agent: str
    from_agent: str | None
    status: str
    retry_count: int
    manual_retries: int
    last_error: str | None
    created_at: int
    updated_at: int
    conversation: str
    metadata: dict[str, Any]
    available_at: int
    claimed_by: str | None
    lease_until: int | None
    hops: int
    external_id: str | None
    run_started_at: int | None = None
    interruptions: int = 0

    @classmethod
    def from_row(cls, row: Row) -> QueuedMessage:
        data = dict(row)
        data["metadata"] = _json_object(data["metadata"])
        if data.keys() == _MESSAGE_FIELDS:
            # A whole row (every column, as the claim reads it): filled in directly, which costs a fifth
            # of the frozen dataclass's field-by-field __init__ on the claim path.
            message = object.__new__(cls)
            message.__dict__.update(data)
            return message
        return cls(**data)

    @classmethod
    def from_claim(
        cls, names: Sequence[str], values: Sequence[Any], claimed: Mapping[str, Any]
    ) -> QueuedMessage:
        """A claimed row from the claim's ``RETURNING`` tuple (``names``, ``values``) and the columns the
        claim itself set (``claimed``), which are not read back: a group of 20 then converts a quarter fewer
        columns. Together they must name every field once (checked by the unit tests)."""
        data = dict(zip(names, values, strict=True))
        data.update(claimed)
        data["metadata"] = _json_object(data["metadata"])
        message = object.__new__(cls)
        # The frozen dataclass's field-by-field __init__ costs five times this on the claim path.
        object.__setattr__(message, "__dict__", data)
        return message

    @property
    def conversation_key(self) -> tuple[str, str]:
        """Messages with the same key belong to one chat (and are batched into one run)."""
        return self.address.key


_MESSAGE_FIELDS = frozenset(f.name for f in fields(QueuedMessage))


@dataclass(frozen=True)
class QueuedResponse(_ChatRow):
    """A row of ``responses``."""

    id: int
    message_id: str
    channel: str
    sender: str
    sender_id: str
    message: str
    original_message: str
    agent: str
    files: list[str]
    metadata: dict[str, Any]
    status: str
    created_at: int
    updated_at: int
    acked_at: int | None
    conversation: str
    claimed_by: str | None
    lease_until: int | None
    delivered: int
    last_error: str | None = None

    @classmethod
    def from_row(cls, row: Row) -> QueuedResponse:
        data = dict(row)
        files = data.pop("files")
        data["files"] = json.loads(files) if files and files != "[]" else []
        data["metadata"] = _json_object(data.pop("metadata"))
        return cls(**data)


@dataclass(frozen=True)
class EnqueueResult:
    """What :meth:`Queue.intake.enqueue_message` did. ``duplicate`` means the id was already queued."""

    message_id: str
    agent: str
    duplicate: bool
    id: int | None


@dataclass(frozen=True)
class MessageDraft:
    """A message to enqueue together with a completion (handoffs, chat-room deliveries)."""

    channel: str
    sender: str
    message: str
    agent: str
    prefix: str
    from_agent: str | None = None
    sender_id: str = ""
    conversation: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    hops: int = 0
    #: The agent was chosen by the sender (a chat-room post names its members), not by a fallback:
    #: reported as ``"named": true`` in the ``message_received`` event.
    named: bool = False


@dataclass(frozen=True)
class ResponseDraft:
    """The reply that completes a group. Unset routing fields default to the group's first message."""

    message: str
    files: Sequence[str] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    channel: str | None = None
    sender: str | None = None
    sender_id: str | None = None
    conversation: str | None = None

    @classmethod
    def to(
        cls,
        address: ChatAddress,
        message: str,
        *,
        files: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> ResponseDraft:
        """A reply addressed to ``address`` (instead of the group's first message)."""
        return cls(
            message=message,
            files=files,
            metadata=dict(metadata or {}),
            channel=address.channel,
            sender=address.sender,
            sender_id=address.sender_id,
            conversation=address.conversation,
        )


@dataclass(frozen=True)
class AgentTurn:
    """One line of ``agent_messages`` history."""

    agent_id: str
    role: str
    content: str
    channel: str = ""
    sender: str = ""
    message_id: str = ""


@dataclass(frozen=True)
class ChatPost:
    """One post to a team's chat room."""

    team_id: str
    from_agent: str
    message: str


@dataclass(frozen=True)
class FailOutcome:
    """Which messages went back to ``pending`` and which became dead letters."""

    retried: list[str]
    dead: list[str]
    next_attempt_at: int | None


@dataclass(frozen=True)
class CompleteOutcome:
    response_id: int | None
    followups: list[str]
    refused_followups: int
    #: The agent's lease was given up with the completion (``release_when_idle``).
    released: bool = False


#: Work a caller adds to a queue operation's transaction (``also=``): it commits or vanishes with it.
TxWork = Callable[[Tx], None]


def sql_in(name: str, values: Sequence[Any]) -> tuple[str, dict[str, Any]]:
    keys = [f"{name}{i}" for i in range(len(values))]
    return "(" + ", ".join(":" + k for k in keys) + ")", dict(zip(keys, values, strict=True))


#: One compact encoder for every row written: ``json.dumps`` with options builds a new encoder per call.
_encode_json = json.JSONEncoder(separators=(",", ":")).encode


def to_json(value: Any) -> str:
    try:
        return _encode_json(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"metadata must be JSON: {exc}") from None


def group_by_conversation(messages: Iterable[QueuedMessage]) -> list[list[QueuedMessage]]:
    """Group claimed messages by chat, oldest first; the first of each group is its primary message."""
    groups: dict[tuple[str, str], list[QueuedMessage]] = {}
    for m in sorted(messages, key=lambda m: m.id):
        groups.setdefault(m.conversation_key, []).append(m)
    return sorted(groups.values(), key=lambda g: g[0].id)
