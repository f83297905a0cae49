"""The management API TinyOffice calls: settings, agents, teams, history, logs, heartbeats, pairing and
system status (schedules: :mod:`adapters.web.schedule_routes`), each backed by the real subsystem (``settings.toml`` edited through
:mod:`shared.settings.edit`, pairings through :mod:`shared.chat.pairings`, history and logs through
:mod:`shared.reads.api_views`).

TinyAGI features agentpost does not have answer what its client can display when it only lists (an empty list
or object: tasks, projects, custom providers, agent skills) and ``501`` with a sentence for every change or
action among them (and for TinyAGI's service control, setup and memory views). ``docs/compatibility.md`` lists
each call.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import Field

from shared import safe_files
from shared.chat import health, pairings
from shared.chat.sessions import clear_sessions
from shared.clock import now_ms
from shared.queue.core import Queue
from shared.reads import api_views
from shared.settings import edit as settings_edit
from shared.settings.model import Settings, SettingsError
from shared.settings.providers import PROVIDER_FACTS
from shared.settings.routing import is_valid_name
from shared.settings.workspace_owner import refuse_foreign_workspaces
from shared.storage.db import Database
from shared.storage.statuses import PairingStatus

from .dialect import (
    AgentMessageOut,
    AgentOut,
    AgentSaved,
    ChannelState,
    HeartbeatOut,
    HeartbeatState,
    LogsOut,
    Ok,
    PairingApproved,
    PairingApprovedOut,
    PairingPendingOut,
    PairingState,
    ServerState,
    SettingsSaved,
    SystemStatus,
    TeamOut,
    TeamSaved,
    agent_out,
    stored_settings_patch,
    team_out,
    tinyagi_settings,
)
from .errors import ApiError
from .params import Body, Name
from .queue_routes import read_queue_status
from .state import Web, WebState

router = APIRouter()
#: The provider names ``PUT /api/agents/{id}`` takes, TinyAGI's (``anthropic``) and ours, mapped onto ours.
PROVIDERS = {
    alias: name for name, facts in PROVIDER_FACTS.items() for alias in (facts.tinyagi_name, name) if alias
}
HEARTBEAT_FILE = "heartbeat.md"
#: The largest heartbeat prompt the scheduler reads (scheduler/heartbeats.py PROMPT_LIMIT).
HEARTBEAT_LIMIT = 64 * 1024
STARTED = time.monotonic()


class HeartbeatIn(Body):
    enabled: bool | None = None
    interval: float | None = Field(default=None, gt=0, le=366 * 86400)
    content: str | None = Field(default=None, max_length=100_000)


class AgentIn(Body):
    """``PUT /api/agents/{id}`` (TinyOffice's ``AgentConfig``)."""

    name: str = Field(default="", max_length=200)
    provider: str = Field(default="claude", max_length=32)
    model: str = Field(default="", max_length=200)
    working_directory: str = Field(default="", max_length=4096)
    system_prompt: str = Field(default="", max_length=100_000)
    heartbeat: HeartbeatIn | None = None


class TeamIn(Body):
    """``PUT /api/teams/{id}`` (TinyOffice's ``TeamConfig``)."""

    name: str = Field(default="", max_length=200)
    agents: list[Annotated[str, Field(max_length=200)]] = Field(min_length=1, max_length=64)
    leader_agent: str = Field(default="", max_length=32)


class PromptIn(Body):
    content: str = Field(max_length=100_000)


class CodeIn(Body):
    code: str = Field(min_length=4, max_length=32)


#: The id of an agent or team being created: checked by :func:`check_ids`, which says the rule in words.
NewId = Annotated[str, PathParam(max_length=200)]
#: The id rule in words: a person reads the refusal (the pattern itself is for programs).
ID_RULE = "lowercase letters, digits, - and _, starting with a letter or digit, at most 32 characters"


def check_ids(kind: str, names: Any) -> None:
    """400 in words when one of ``names`` (a list, or the keys of a settings table) cannot be an agent or team
    id; anything else is left to the settings' own validation."""
    for name in names if isinstance(names, dict | list) else ():
        if not is_valid_name(name):
            raise ApiError(
                400, f"The {kind} id {name!r} is not allowed: use {ID_RULE}.", ok=False, field=kind
            )


def _not_here(what: str) -> ApiError:
    return ApiError(501, f"agentpost has no {what}; see docs/compatibility.md", ok=False)


# -- shared steps ------------------------------------------------------------------------------------------
async def edit(web: WebState, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Settings:
    """Apply one :mod:`shared.settings.edit` change to settings.toml (400 when the result is invalid: the file
    is left as it was) and return the settings reloaded from it."""
    try:
        await web.run(fn, web.settings, *args, **kwargs)
    except SettingsError as exc:
        raise ApiError(400, str(exc), ok=False) from None
    return await web.run(_reloaded, web)


async def remove(web: WebState, fn: Callable[[Settings, str], Any], what: str, name: str) -> Ok:
    """Remove the ``what`` called ``name`` from settings.toml with ``fn`` (404 when it is not there)."""
    try:
        await edit(web, fn, name)
    except KeyError:
        raise ApiError(404, f"no {what} {name!r} in settings.toml") from None
    return Ok(ok=True)


def _own_workspaces(web: WebState) -> settings_edit.Vet:
    """The check of an edit that may add agents or move workspaces: none may get a folder that belongs to
    another user (the processor would hand it to the agent; see :mod:`shared.settings.workspace_owner`)."""
    before = web.settings
    return lambda after: refuse_foreign_workspaces(before, after)


def _reloaded(web: WebState) -> Settings:
    web.runtime.refresh_settings(force=True)
    return web.settings


def known_agent(web: WebState, agent: str) -> None:
    """404 naming the known agents when ``agent`` is none of them."""
    agents = web.settings.agents
    if agent not in agents:
        raise ApiError(404, f"no agent {agent!r} (known: {', '.join(sorted(agents)) or 'none'})")


# -- settings ------------------------------------------------------------------------------------------------
@router.get("/settings", summary="The settings (secrets shown as ***)")
async def get_settings(web: Web) -> dict[str, Any]:
    public = await web.run(settings_edit.public_settings, web.settings)
    return tinyagi_settings(public, web.settings)


@router.put("/settings", summary="Merge changes into settings.toml (validated; *** keeps a secret)")
async def put_settings(patch: dict[str, Any], web: Web) -> SettingsSaved:
    check_ids("agent", patch.get("agents"))
    check_ids("team", patch.get("teams"))
    settings = await edit(
        web, settings_edit.merge_settings, stored_settings_patch(patch), vet=_own_workspaces(web)
    )
    public = await web.run(settings_edit.public_settings, settings)
    return SettingsSaved(ok=True, settings=tinyagi_settings(public, settings))


@router.post(
    "/setup",
    summary="TinyAGI's first-run setup (not in agentpost)",
    include_in_schema=False,
    status_code=501,
)
async def setup() -> Ok:
    raise _not_here(
        "setup wizard over the API (run `agentpost init`, then edit settings.toml or PUT /api/settings)"
    )


# -- agents --------------------------------------------------------------------------------------------------
@router.get("/agents", summary="Configured agents, keyed by id")
async def agents(web: Web) -> dict[str, AgentOut]:
    settings = web.settings
    return {name: agent_out(settings, name, a) for name, a in sorted(settings.agents.items())}


@router.put("/agents/{agent}", summary="Create or replace an agent")
async def save_agent(agent: NewId, body: AgentIn, web: Web) -> AgentSaved:
    check_ids("agent", [agent])
    if body.working_directory and not Path(body.working_directory).expanduser().is_absolute():
        raise ApiError(400, "working_directory must be an absolute path (or empty: workspace/<agent>)")
    provider = PROVIDERS.get(body.provider.lower())
    if provider is None:
        raise ApiError(400, f"provider {body.provider!r}: agentpost runs {', '.join(sorted(set(PROVIDERS)))}")
    old = web.settings.file.agents.get(agent)
    values: dict[str, Any] = old.model_dump(exclude_defaults=True) if old is not None else {}
    values.update(
        {
            "name": body.name,
            "provider": provider,
            "model": body.model,
            "system_prompt": body.system_prompt,
            "workspace": body.working_directory,
        }
    )
    settings = await edit(web, settings_edit.put_agent, agent, values, vet=_own_workspaces(web))
    if body.heartbeat is not None:
        settings = await save_heartbeat_settings(web, agent, body.heartbeat)
    return AgentSaved(ok=True, agent=agent_out(settings, agent, settings.agents[agent]))


@router.delete("/agents/{agent}", summary="Remove an agent (its workspace is kept)")
async def delete_agent(agent: Name, web: Web) -> Ok:
    return await remove(web, settings_edit.remove_agent, "agent", agent)


@router.post("/agents/{agent}/reset", summary="Start the agent's conversations afresh")
async def reset_agent(agent: Name, web: Web) -> dict[str, Any]:
    known_agent(web, agent)
    n = await web.run(clear_sessions, web.db, agent, None, reason="api")
    return {"ok": True, "agent": agent, "sessionsReset": int(n)}


@router.get("/agents/{agent}/messages", summary="An agent's turns after ?since_id=, newest first")
async def agent_messages(
    agent: Name,
    web: Web,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    since_id: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> list[AgentMessageOut]:
    known_agent(web, agent)
    rows = await web.run(api_views.agent_history, web.db, agent, limit=limit, since_id=since_id)
    return [AgentMessageOut.model_validate(r) for r in rows]


@router.get("/agents/{agent}/system-prompt", summary="The agent's system prompt text")
async def get_prompt(agent: Name, web: Web) -> dict[str, str]:
    known_agent(web, agent)
    settings = web.settings
    return {"content": settings.agents[agent].system_prompt, "path": str(settings.path)}


@router.put("/agents/{agent}/system-prompt", summary="Replace the agent's system prompt text")
async def put_prompt(agent: Name, body: PromptIn, web: Web) -> Ok:
    known_agent(web, agent)
    await edit(
        web, settings_edit.merge_settings, {"agents": {agent: {"system_prompt": body.content or None}}}
    )
    return Ok(ok=True)


@router.get(
    "/agents/{agent}/memory",
    summary="TinyAGI's agent memory view (not in agentpost)",
    include_in_schema=False,
)
async def agent_memory(agent: Name) -> Ok:
    raise _not_here("agent memory store (an agent keeps its notes in its workspace)")


@router.get("/agents/{agent}/skills", summary="Agent skills: none in agentpost (empty list)")
async def agent_skills(agent: Name, web: Web) -> list[dict[str, str]]:
    known_agent(web, agent)
    return []


@router.get(
    "/agents/{agent}/skills/registry",
    summary="Skill registry search (not in agentpost)",
    include_in_schema=False,
)
async def skills_registry(agent: Name) -> Ok:
    raise _not_here("skill registry")


@router.post(
    "/agents/{agent}/skills/install", summary="Skill install (not in agentpost)", include_in_schema=False
)
async def skills_install(agent: Name) -> Ok:
    raise _not_here("skill registry")


# -- heartbeats ----------------------------------------------------------------------------------------------
async def save_heartbeat_settings(web: WebState, agent: str, body: HeartbeatIn) -> Settings:
    """Write the agent's heartbeat prompt (``content``) and timing (``enabled``, ``interval``)."""
    settings = web.settings
    if body.content is not None:
        path = settings.workspace(agent) / HEARTBEAT_FILE
        if not path.is_absolute():
            raise ApiError(400, f"agent {agent!r} has a relative workspace; set an absolute one first")
        if len(body.content.encode("utf-8")) > HEARTBEAT_LIMIT:
            raise ApiError(400, "content: a heartbeat prompt may be at most 64 KB; shorten it")
        await web.run(_write_text, path, body.content or "")
    beat: dict[str, Any] = {}
    if body.enabled is not None:
        beat["enabled"] = body.enabled
    if body.interval is not None:
        beat["interval"] = body.interval
        beat["cron"] = None
    current = settings.file.heartbeats.get(agent)
    if beat and not isinstance(current, dict) and "interval" not in beat:
        beat["interval"] = 3600.0  # a new heartbeat needs a timing: hourly unless told
    if beat:
        return await edit(web, settings_edit.merge_settings, {"heartbeats": {agent: beat}})
    return web.settings


def _write_text(path: Path, text: str) -> None:
    # The workspace is the agent's: the file is replaced, never written through a link the agent put in its
    # place (this process may be root), and keeps the agent as its owner (shared/safe_files.py).
    path.parent.mkdir(parents=True, exist_ok=True)
    safe_files.replace_under(path.parent, path.name, text.encode("utf-8"), 0o644)


def _read_text(path: Path) -> str:
    try:
        return safe_files.read_text_under(path.parent, path.name, HEARTBEAT_LIMIT)
    except (OSError, UnicodeDecodeError):
        return ""


@router.get("/agents/{agent}/heartbeat", summary="The agent's heartbeat prompt and timing")
async def get_heartbeat(agent: Name, web: Web) -> HeartbeatOut:
    known_agent(web, agent)
    settings = web.settings
    path = settings.workspace(agent) / HEARTBEAT_FILE
    beat = settings.file.heartbeats.get(agent)
    beat = beat if isinstance(beat, dict) else {}
    interval = beat.get("interval")
    return HeartbeatOut(
        content=await web.run(_read_text, path),
        path=str(path),
        enabled=bool(beat) and bool(beat.get("enabled", True)),
        interval=float(interval) if interval is not None else None,
    )


@router.put("/agents/{agent}/heartbeat", summary="Change the agent's heartbeat prompt or timing")
async def put_heartbeat(agent: Name, body: HeartbeatIn, web: Web) -> Ok:
    known_agent(web, agent)
    await save_heartbeat_settings(web, agent, body)
    return Ok(ok=True)


# -- teams ---------------------------------------------------------------------------------------------------
@router.get("/teams", summary="Configured teams, keyed by id")
async def teams(web: Web) -> dict[str, TeamOut]:
    settings = web.settings
    return {name: team_out(settings, name) for name in sorted(settings.teams)}


@router.put("/teams/{team}", summary="Create or replace a team")
async def save_team(team: NewId, body: TeamIn, web: Web) -> TeamSaved:
    check_ids("team", [team])
    check_ids("agent", body.agents)
    members = list(dict.fromkeys(body.agents))
    settings = await edit(
        web, settings_edit.put_team, team, name=body.name, agents=members, leader=body.leader_agent
    )
    return TeamSaved(ok=True, team=team_out(settings, team))


@router.delete("/teams/{team}", summary="Remove a team (its agents stay)")
async def delete_team(team: Name, web: Web) -> Ok:
    return await remove(web, settings_edit.remove_team, "team", team)


# -- logs and status -----------------------------------------------------------------------------------------
@router.get("/logs", summary="The last lines of the process logs")
async def logs(web: Web, limit: Annotated[int, Query(ge=1, le=5000)] = 100) -> LogsOut:
    lines = await web.run(api_views.tail_logs, web.settings.home / "logs", limit)
    return LogsOut(lines=lines)


def system_status(db: Database, queue: Queue, settings: Settings, port: int) -> SystemStatus:
    """This server, the channel adapters that reported in, the heartbeats and the queue (TinyOffice's
    ``getSystemStatus``)."""
    channels: dict[str, ChannelState] = {}
    for h in health.read_all(db):
        parts = h.worker.split(":")
        pid = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
        running = h.state in ("up", "connecting", "retrying") and not h.adapter_gone
        channels[h.channel] = ChannelState(running=running, state=h.state, pid=pid, error=h.error)
    beats = settings.file.heartbeats
    intervals = [float(b["interval"]) for b in beats.values() if isinstance(b, dict) and b.get("interval")]
    return SystemStatus(
        ok=True,
        uptime=int(time.monotonic() - STARTED),
        server=ServerState(running=True, port=port),
        channels=channels,
        heartbeat=HeartbeatState(
            running=bool(beats),
            interval=min(intervals) if intervals else 0.0,
            lastSent=api_views.last_heartbeats(db),
        ),
        queue=read_queue_status(queue, db),
    )


@router.get("/status", summary="System status: this server, the channel adapters, heartbeats, the queue")
async def status(web: Web) -> SystemStatus:
    return await web.run(system_status, web.db, web.queue, web.settings, web.port)


# -- pairing -------------------------------------------------------------------------------------------------
def _approved_out(p: pairings.Pairing, approved_at: int) -> PairingApprovedOut:
    return PairingApprovedOut(
        channel=p.channel,
        senderId=p.sender_id,
        sender=p.sender,
        approvedAt=p.approved_at or approved_at,
        approvedCode=p.code or None,
    )


@router.get("/pairing", summary="Pending pairing codes and approved senders")
async def get_pairings(web: Web) -> PairingState:
    rows = await web.run(pairings.list_pairings, web.db)
    now = now_ms()
    pending = [
        PairingPendingOut(
            channel=p.channel,
            senderId=p.sender_id,
            sender=p.sender,
            code=p.code,
            createdAt=p.created_at,
            lastSeenAt=p.created_at,
        )
        for p in rows
        if p.status == PairingStatus.PENDING and not p.expired(now)
    ]
    approved = [_approved_out(p, p.created_at) for p in rows if p.status == PairingStatus.APPROVED]
    return PairingState(pending=pending, approved=approved)


@router.post("/pairing/approve", summary="Approve a sender by their pairing code")
async def approve_pairing(body: CodeIn, web: Web) -> PairingApproved:
    try:
        p = await web.run(pairings.approve, web.db, body.code)
    except pairings.PairingError as exc:
        raise ApiError(404, str(exc), ok=False) from None
    return PairingApproved(ok=True, entry=_approved_out(p, now_ms()))


@router.delete("/pairing/pending/{code}", summary="Dismiss a pending pairing code")
async def dismiss_pending(code: Annotated[str, PathParam(max_length=32)], web: Web) -> Ok:
    wanted = code.strip().upper()
    rows = await web.run(pairings.list_pairings, web.db)
    found = [p for p in rows if p.status == PairingStatus.PENDING and p.code == wanted]
    if not found:
        raise ApiError(404, f"no pending pairing has code {wanted!r}", ok=False)
    await web.run(pairings.revoke, web.db, found[0].channel, found[0].sender_id)
    return Ok(ok=True)


@router.delete("/pairing/{channel}/{sender_id}", summary="Revoke a sender's pairing")
async def revoke_pairing(
    channel: Name, sender_id: Annotated[str, PathParam(min_length=1, max_length=200)], web: Web
) -> Ok:
    try:
        await web.run(pairings.revoke, web.db, channel, sender_id)
    except pairings.PairingError as exc:
        raise ApiError(404, str(exc), ok=False) from None
    return Ok(ok=True)


# -- TinyAGI features agentpost does not have ----------------------------------------------------------------
@router.get("/tasks", summary="Tasks: none in agentpost (empty list)")
async def tasks() -> list[dict[str, Any]]:
    return []


@router.get("/projects", summary="Projects: none in agentpost (empty list)")
async def projects() -> list[dict[str, Any]]:
    return []


@router.get("/custom-providers", summary="Custom providers: none in agentpost (empty object)")
async def custom_providers() -> dict[str, Any]:
    return {}


_TASK_BOARD = "task board"
_PROVIDERS = "custom providers (agents name a provider and model)"
_SERVICES = "service control over the API (use `agentpost restart`)"
#: TinyAGI's changes and actions agentpost has no counterpart for: each answers 501 with a sentence.
_UNSUPPORTED = [
    ("POST", "/tasks", _TASK_BOARD),
    ("PUT", "/tasks/reorder", _TASK_BOARD),
    ("GET", "/tasks/{item}", _TASK_BOARD),
    ("PUT", "/tasks/{item}", _TASK_BOARD),
    ("DELETE", "/tasks/{item}", _TASK_BOARD),
    ("GET", "/tasks/{item}/comments", _TASK_BOARD),
    ("POST", "/tasks/{item}/comments", _TASK_BOARD),
    ("DELETE", "/comments/{item}", _TASK_BOARD),
    ("POST", "/projects", "projects"),
    ("PUT", "/projects/{item}", "projects"),
    ("DELETE", "/projects/{item}", "projects"),
    ("PUT", "/custom-providers/{item}", _PROVIDERS),
    ("DELETE", "/custom-providers/{item}", _PROVIDERS),
    ("POST", "/services/apply", _SERVICES),
    ("POST", "/services/restart", _SERVICES),
    ("POST", "/services/channel/{item}/{action}", _SERVICES),
]


def _unsupported(what: str) -> Callable[[], Awaitable[Ok]]:
    async def answer() -> Ok:
        raise _not_here(what)

    return answer


for _method, _path, _what in _UNSUPPORTED:
    router.add_api_route(
        _path,
        _unsupported(_what),
        methods=[_method],
        status_code=501,
        summary=f"Not in agentpost: {_what} (501)",
        response_model=Ok,
        # Always 501 by design (docs/compatibility.md): kept out of the schema, which lists what we serve.
        include_in_schema=False,
    )
