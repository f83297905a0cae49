"""The wire format TinyAGI's clients read, as pydantic models (one per shape) and converters from our rows.

TinyAGI's published clients (TinyOffice's API client, its channel clients' response loops, its CLI) are the
contract: the field names and types here are what they read. Our own additions (row status, conversation,
cursors) ride along under names the clients ignore. ``docs/compatibility.md`` lists every call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.events.entries import EventEntry
from shared.queue.records import QueuedMessage, QueuedResponse
from shared.settings.model import AgentSettings, Settings, TeamSettings
from shared.settings.providers import PROVIDER_FACTS


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- queue -------------------------------------------------------------------------------------------------
class QueueStatusOut(_Out):
    """``GET /api/queue/status``: TinyOffice's keys (``incoming`` … ``activeConversations``) and ours."""

    incoming: int = Field(description="Messages waiting to be processed (TinyAGI's name for pending).")
    queued: int = Field(description="Same as incoming: agentpost has no separate 'queued' stage.")
    processing: int
    outgoing: int = Field(description="Replies not yet delivered (pending or being delivered).")
    activeConversations: int = Field(description="Chats with a message being processed now.")
    pending: int
    completed: int
    dead: int
    responses_pending: int
    responses_delivering: int
    cli_replies_unread: int


def queue_status_out(counts: Mapping[str, int], active_conversations: int) -> QueueStatusOut:
    """The queue's counts (:meth:`~shared.queue.admin.Admin.queue_status`) under TinyOffice's names and ours."""
    return QueueStatusOut(
        incoming=counts["pending"],
        queued=counts["pending"],
        outgoing=counts["responses_pending"] + counts["responses_delivering"],
        activeConversations=active_conversations,
        **counts,
    )


class ProcessingOut(_Out):
    """One row of ``GET /api/queue/processing`` (TinyOffice's ``ProcessingMessage``)."""

    id: int
    messageId: str
    channel: str
    sender: str
    senderId: str
    message: str
    agent: str
    status: Literal["queued", "processing"]
    processAlive: bool = Field(description="True while the processor holds the message's lease.")
    startedAt: int
    duration: int
    conversation: str
    updatedAt: int
    claimedBy: str | None = Field(description="The processor holding the message.")


def _row_fields(r: QueuedMessage | QueuedResponse) -> dict[str, Any]:
    """The fields every message and reply row shows TinyAGI's clients under the same names."""
    return {
        "id": r.id,
        "messageId": r.message_id,
        "channel": r.channel,
        "sender": r.sender,
        "senderId": r.sender_id,
        "message": r.message,
        "agent": r.agent,
        "conversation": r.conversation,
    }


def processing_out(m: QueuedMessage, now: int) -> ProcessingOut:
    started = m.run_started_at or m.updated_at
    return ProcessingOut(
        **_row_fields(m),
        status="processing" if m.run_started_at else "queued",
        processAlive=bool(m.lease_until and m.lease_until > now),
        startedAt=started,
        duration=max(0, now - started),
        updatedAt=m.updated_at,
        claimedBy=m.claimed_by,
    )


class KillOut(_Out):
    """``POST /api/queue/processing/{id}/kill``."""

    ok: bool
    agent: str
    processKilled: bool = Field(description="A stop was requested for a run in progress (asynchronous).")


class ResponseOut(_Out):
    """A reply row as TinyAGI's clients read it (``GET /api/responses``, ``/api/responses/pending``)."""

    id: int
    messageId: str
    channel: str
    sender: str
    senderId: str
    message: str
    originalMessage: str
    timestamp: int
    agent: str
    files: list[str]
    metadata: dict[str, Any]
    status: str
    conversation: str
    ackedAt: int | None


def response_out(r: QueuedResponse) -> ResponseOut:
    return ResponseOut(
        **_row_fields(r),
        originalMessage=r.original_message,
        timestamp=r.created_at,
        files=list(r.files),
        metadata=dict(r.metadata),
        status=r.status,
        ackedAt=r.acked_at,
    )


class MessageAccepted(_Out):
    """``POST /api/message``."""

    ok: bool
    messageId: str
    agent: str
    duplicate: bool


class ProactiveAccepted(_Out):
    """``POST /api/responses``: ``messageId`` is what TinyAGI's send-message skill prints."""

    ok: bool
    messageId: str
    response: ResponseOut


class AckOut(_Out):
    """``POST /api/responses/{id}/ack``."""

    ok: bool
    acked: bool


class Ok(_Out):
    """A write that has nothing else to say."""

    ok: bool


# -- agents and teams ---------------------------------------------------------------------------------------
class HeartbeatBrief(_Out):
    enabled: bool
    interval: float | None = None


class AgentOut(_Out):
    """One agent, keyed by its id in ``GET /api/agents`` (TinyOffice's ``AgentConfig``)."""

    name: str
    provider: str
    model: str
    working_directory: str
    system_prompt: str
    default: bool
    sessionScope: str
    heartbeat: HeartbeatBrief | None = None


def agent_out(settings: Settings, agent_id: str, a: AgentSettings) -> AgentOut:
    beat = settings.file.heartbeats.get(agent_id)
    return AgentOut(
        name=a.name or agent_id,
        provider=a.provider,
        model=a.model,
        working_directory=str(settings.workspace(agent_id)),
        system_prompt=a.system_prompt,
        default=agent_id == settings.queue.default_agent,
        sessionScope=a.session_scope,
        heartbeat=(
            HeartbeatBrief(enabled=bool(beat.get("enabled", True)), interval=beat.get("interval"))
            if isinstance(beat, dict)
            else None
        ),
    )


class TeamOut(_Out):
    """One team, keyed by its id in ``GET /api/teams`` (TinyOffice's ``TeamConfig``)."""

    name: str
    agents: list[str]
    leader_agent: str


def team_out(settings: Settings, team_id: str) -> TeamOut:
    t = settings.teams[team_id]
    declared: TeamSettings | None = settings.file.teams.get(team_id)
    name = declared.name if declared is not None and declared.name else team_id
    return TeamOut(name=name, agents=list(t.agents), leader_agent=t.leader)


class AgentSaved(_Out):
    ok: bool
    agent: AgentOut


class TeamSaved(_Out):
    ok: bool
    team: TeamOut


# -- events ------------------------------------------------------------------------------------------------
#: Our event types under the names TinyAGI's SSE clients listen to; every other type keeps its own name.
EVENT_NAMES: dict[str, str] = {
    "message_received": "message:incoming",
    "chain_step_start": "agent:invoke",
    "agent_progress": "agent:progress",
    "agent_preview": "message:preview",
    "chain_step_done": "agent:response",
    "chain_handoff": "agent:mention",
    "response_ready": "message:done",
}


def event_name(entry: EventEntry) -> str:
    """The SSE ``event:`` name of an entry (TinyAGI's name where it has one, else our type)."""
    return EVENT_NAMES.get(entry.type, entry.type)


def event_data(entry: EventEntry) -> dict[str, Any]:
    """The JSON body of an event for SSE and ``GET /api/events``: TinyAGI's ``type`` (its event name) and
    ``timestamp`` with the fields its clients read, plus ours (``cursor``, ``event``: our type, ``payload``)."""
    p = entry.payload
    data: dict[str, Any] = {
        "type": event_name(entry),
        "timestamp": entry.created_at,
        "cursor": entry.cursor,
        "topic": entry.topic,
        "event": entry.type,
        "messageId": entry.message_id,
        "createdAt": entry.created_at,
        "payload": p,
    }
    agent = p.get("agent")
    if isinstance(agent, str):
        data["agentId"] = agent
        data["agentName"] = agent
        data["agent"] = agent
    for key in ("channel", "sender", "text", "conversation"):
        if isinstance(p.get(key), str):
            data[key] = p[key]
    if entry.type == "chain_handoff":
        data["fromAgent"] = p.get("from")
        data["toAgent"] = p.get("to")
    if entry.type == "chain_step_done":
        data["role"] = "assistant"
    if entry.type == "response_ready" and p.get("response_id") is not None:
        data["responseId"] = p["response_id"]
    return data


def event_json(entry: EventEntry) -> str:
    return json.dumps(event_data(entry), separators=(",", ":"), default=str)


# -- management ----------------------------------------------------------------------------------------------
class SettingsSaved(_Out):
    ok: bool
    settings: dict[str, Any]


class LogsOut(_Out):
    lines: list[str]


class AgentMessageOut(_Out):
    """One turn of an agent (TinyOffice's ``AgentMessage``: the table's column names)."""

    id: int
    agent_id: str
    role: str
    channel: str
    sender: str
    message_id: str
    content: str
    created_at: int


class ChatMessageOut(_Out):
    """One post of a team chat room (TinyOffice's ``ChatMessage``). A person's post is stored as
    ``user:<sender>``; TinyOffice styles a post as the user's only when ``from_agent`` is exactly ``"user"``
    (as TinyAGI writes it), so that is what is answered, with who it was in ``sender``."""

    id: int
    team_id: str
    from_agent: str
    message: str
    created_at: int
    sender: str = ""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ChatMessageOut:
        author = str(row["from_agent"])
        person = author.startswith("user:")
        return cls(
            id=int(row["id"]),
            team_id=str(row["team_id"]),
            from_agent="user" if person else author,
            message=str(row["message"]),
            created_at=int(row["created_at"]),
            sender=author.removeprefix("user:") if person else author,
        )


class ChatPosted(_Out):
    ok: bool
    id: int
    queued: list[str]


class ScheduleOut(_Out):
    """One ``[[schedules]]`` entry as TinyOffice's ``Schedule``."""

    id: str
    label: str
    cron: str
    agentId: str
    message: str
    channel: str
    sender: str
    enabled: bool
    createdAt: int
    runAt: str | None = None


class ScheduleSaved(_Out):
    ok: bool
    schedule: ScheduleOut


class HeartbeatOut(_Out):
    content: str
    path: str
    enabled: bool
    interval: float | None = None


class PairingPendingOut(_Out):
    channel: str
    senderId: str
    sender: str
    code: str
    createdAt: int
    lastSeenAt: int


class PairingApprovedOut(_Out):
    channel: str
    senderId: str
    sender: str
    approvedAt: int
    approvedCode: str | None = None


class PairingState(_Out):
    pending: list[PairingPendingOut]
    approved: list[PairingApprovedOut]


class PairingApproved(_Out):
    ok: bool
    entry: PairingApprovedOut


class ServerState(_Out):
    running: bool
    port: int


class ChannelState(_Out):
    running: bool
    state: str
    pid: int | None = None
    error: str = ""


class HeartbeatState(_Out):
    running: bool
    interval: float
    lastSent: dict[str, int]


class SystemStatus(_Out):
    """``GET /api/status`` (TinyOffice's control plane view)."""

    ok: bool
    uptime: int  # whole seconds, as TinyAGI answers (TinyOffice prints the number as it comes)
    server: ServerState
    channels: dict[str, ChannelState]
    heartbeat: HeartbeatState
    queue: QueueStatusOut


#: TinyAGI names a provider by whose model it runs; agentpost names the CLI that runs it (each kind's
#: ``tinyagi_name``, for the kinds TinyAGI has).
TINYAGI_PROVIDER = {name: facts.tinyagi_name for name, facts in PROVIDER_FACTS.items() if facts.tinyagi_name}
#: Keys of ``GET /api/settings`` that are derived for TinyOffice, not stored: a save that sends them back
#: (TinyOffice's settings page PUTs the whole object it read) leaves them out of settings.toml.
DERIVED_SETTINGS_KEYS = ("models", "monitoring")


def tinyagi_settings(public: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """``public`` (settings.toml as JSON, secrets masked) plus the TinyAGI keys TinyOffice's settings page reads:
    ``models.provider`` (the default agent's, in TinyAGI's names) and ``monitoring.heartbeat_interval`` (the
    shortest heartbeat interval in seconds; absent when no heartbeat runs on an interval)."""
    out = {k: v for k, v in public.items() if k not in DERIVED_SETTINGS_KEYS}
    default = settings.agents.get(settings.queue.default_agent)
    if default is not None:
        provider = TINYAGI_PROVIDER.get(default.provider, default.provider)
        models: dict[str, Any] = {"provider": provider}
        if default.model:
            models[provider] = {"model": default.model}
        out["models"] = models
    intervals = [
        float(beat["interval"])
        for beat in settings.file.heartbeats.values()
        if isinstance(beat, dict) and beat.get("interval") and beat.get("enabled", True)
    ]
    if intervals:
        out["monitoring"] = {"heartbeat_interval": int(min(intervals))}
    return out


def stored_settings_patch(patch: dict[str, Any]) -> dict[str, Any]:
    """A ``PUT /api/settings`` body without the keys :func:`tinyagi_settings` derives."""
    return {k: v for k, v in patch.items() if k not in DERIVED_SETTINGS_KEYS}
