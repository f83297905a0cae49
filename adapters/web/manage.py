"""The management API TinyOffice calls: settings, agents, teams, history, logs, schedules, heartbeats,
pairing and system status, each backed by the real subsystem (``settings.toml`` edited through
:mod:`shared.settings_edit`, pairings through :mod:`shared.pairings`, history and logs through
:mod:`shared.api_views`).

TinyAGI features agentpost does not have answer what its client can display when it only lists (an empty list
or object: tasks, projects, custom providers, agent skills) and ``501`` with a sentence for every change or
action among them (and for TinyAGI's service control, setup and memory views). ``docs/compatibility.md`` lists
each call.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from shared import api_views, channel_health, pairings, settings_edit
from shared.clock import now_ms
from shared.routing import AGENT_NAME_RE
from shared.runtime import Runtime
from shared.sessions import clear_sessions
from shared.settings import SettingsError

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
    QueueStatusOut,
    ScheduleOut,
    ScheduleSaved,
    ServerState,
    SettingsSaved,
    SystemStatus,
    TeamOut,
    TeamSaved,
    agent_out,
    team_out,
)
from .errors import ApiError

NAME = r"^[a-z0-9][a-z0-9_-]{0,31}$"
Name = Annotated[str, PathParam(pattern=NAME)]
#: TinyAGI's provider names mapped onto ours.
PROVIDERS = {
    "anthropic": "claude",
    "claude": "claude",
    "openai": "codex",
    "codex": "codex",
    "command": "command",
}
HEARTBEAT_FILE = "heartbeat.md"
STARTED = time.monotonic()

Run = Callable[..., Awaitable[Any]]


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore")


class HeartbeatIn(_In):
    enabled: bool | None = None
    interval: float | None = Field(default=None, gt=0, le=366 * 86400)
    content: str | None = Field(default=None, max_length=100_000)


class AgentIn(_In):
    """``PUT /api/agents/{id}`` (TinyOffice's ``AgentConfig``)."""

    name: str = Field(default="", max_length=200)
    provider: str = Field(default="claude", max_length=32)
    model: str = Field(default="", max_length=200)
    working_directory: str = Field(default="", max_length=4096)
    system_prompt: str = Field(default="", max_length=100_000)
    heartbeat: HeartbeatIn | None = None


class TeamIn(_In):
    """``PUT /api/teams/{id}`` (TinyOffice's ``TeamConfig``)."""

    name: str = Field(default="", max_length=200)
    agents: list[Annotated[str, Field(pattern=NAME)]] = Field(min_length=1, max_length=64)
    leader_agent: str = Field(default="", max_length=32)


class ScheduleIn(_In):
    """``POST /api/schedules`` and ``PUT /api/schedules/{id}``."""

    agentId: str | None = Field(default=None, pattern=NAME)
    message: str | None = Field(default=None, min_length=1, max_length=100_000)
    cron: str | None = Field(default=None, max_length=200)
    runAt: str | None = Field(default=None, max_length=64)
    label: str | None = Field(default=None, max_length=64)
    enabled: bool | None = None


class PromptIn(_In):
    content: str = Field(max_length=100_000)


class CodeIn(_In):
    code: str = Field(min_length=4, max_length=32)


def _not_here(what: str) -> ApiError:
    return ApiError(501, f"agentpost has no {what}; see docs/compatibility.md", ok=False)


def _check_cron(expr: str) -> str:
    parts = expr.split()
    if len(parts) != 5 or not all(re.fullmatch(r"[0-9*/,\-A-Za-z?LW#]+", p) for p in parts):
        raise ApiError(400, f"cron {expr!r} must have five fields (minute hour day month weekday)")
    return " ".join(parts)


def _label_id(label: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9_-]+", "-", label.lower()).strip("-")[:40] or "schedule"
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def management_router(runtime: Runtime, run: Run, port: int) -> APIRouter:
    """The routes above, over ``runtime``; ``run`` runs a blocking call off the event loop with the request's
    lock-wait bound (see :func:`adapters.web.app.create_app`)."""
    api = APIRouter()
    db = runtime.db

    def fresh() -> Any:
        runtime.refresh_settings(force=True)
        return runtime.settings

    async def edit(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            await run(fn, runtime.settings, *args, **kwargs)
        except SettingsError as exc:
            raise ApiError(400, str(exc), ok=False) from None
        return await run(fresh)

    def known_agent(agent: str) -> None:
        agents = runtime.settings.agents
        if agent not in agents:
            raise ApiError(404, f"no agent {agent!r} (known: {', '.join(sorted(agents)) or 'none'})")

    # -- settings ----------------------------------------------------------------------------------------
    @api.get("/settings", summary="The settings (secrets shown as ***)")
    async def get_settings() -> dict[str, Any]:
        data: dict[str, Any] = await run(settings_edit.public_settings, runtime.settings)
        return data

    @api.put("/settings", summary="Merge changes into settings.toml (validated; *** keeps a secret)")
    async def put_settings(patch: dict[str, Any]) -> SettingsSaved:
        settings = await edit(settings_edit.merge_settings, patch)
        return SettingsSaved(ok=True, settings=await run(settings_edit.public_settings, settings))

    @api.post(
        "/setup",
        summary="TinyAGI's first-run setup (not in agentpost)",
        include_in_schema=False,
        status_code=501,
    )
    async def setup() -> Ok:
        raise _not_here(
            "setup wizard over the API (run `agentpost init`, then edit settings.toml or PUT /api/settings)"
        )

    # -- agents ------------------------------------------------------------------------------------------
    @api.get("/agents", summary="Configured agents, keyed by id")
    async def agents() -> dict[str, AgentOut]:
        settings = runtime.settings
        return {name: agent_out(settings, name, a) for name, a in sorted(settings.agents.items())}

    @api.put("/agents/{agent}", summary="Create or replace an agent")
    async def save_agent(agent: Name, body: AgentIn) -> AgentSaved:
        if body.working_directory and not Path(body.working_directory).expanduser().is_absolute():
            raise ApiError(400, "working_directory must be an absolute path (or empty: workspace/<agent>)")
        provider = PROVIDERS.get(body.provider.lower())
        if provider is None:
            raise ApiError(
                400, f"provider {body.provider!r}: agentpost runs {', '.join(sorted(set(PROVIDERS)))}"
            )
        old = runtime.settings.file.agents.get(agent)
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
        settings = await edit(settings_edit.put_agent, agent, values)
        if body.heartbeat is not None:
            settings = await save_heartbeat_settings(agent, body.heartbeat)
        return AgentSaved(ok=True, agent=agent_out(settings, agent, settings.agents[agent]))

    @api.delete("/agents/{agent}", summary="Remove an agent (its workspace is kept)")
    async def delete_agent(agent: Name) -> Ok:
        try:
            await edit(settings_edit.remove_agent, agent)
        except KeyError:
            raise ApiError(404, f"no agent {agent!r} in settings.toml") from None
        return Ok(ok=True)

    @api.post("/agents/{agent}/reset", summary="Start the agent's conversations afresh")
    async def reset_agent(agent: Name) -> dict[str, Any]:
        known_agent(agent)
        n = await run(clear_sessions, db, agent, None, reason="api")
        return {"ok": True, "agent": agent, "sessionsReset": int(n)}

    @api.get("/agents/{agent}/messages", summary="An agent's turns after ?since_id=, newest first")
    async def agent_messages(
        agent: Name,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        since_id: Annotated[int, Query(ge=0, le=2**62)] = 0,
    ) -> list[AgentMessageOut]:
        known_agent(agent)
        rows = await run(api_views.agent_history, db, agent, limit=limit, since_id=since_id)
        return [AgentMessageOut.model_validate(r) for r in rows]

    @api.get("/agents/{agent}/system-prompt", summary="The agent's system prompt text")
    async def get_prompt(agent: Name) -> dict[str, str]:
        known_agent(agent)
        settings = runtime.settings
        return {"content": settings.agents[agent].system_prompt, "path": str(settings.path)}

    @api.put("/agents/{agent}/system-prompt", summary="Replace the agent's system prompt text")
    async def put_prompt(agent: Name, body: PromptIn) -> Ok:
        known_agent(agent)
        await edit(settings_edit.merge_settings, {"agents": {agent: {"system_prompt": body.content or None}}})
        return Ok(ok=True)

    @api.get(
        "/agents/{agent}/memory",
        summary="TinyAGI's agent memory view (not in agentpost)",
        include_in_schema=False,
    )
    async def agent_memory(agent: Name) -> Ok:
        raise _not_here("agent memory store (an agent keeps its notes in its workspace)")

    @api.get("/agents/{agent}/skills", summary="Agent skills: none in agentpost (empty list)")
    async def agent_skills(agent: Name) -> list[dict[str, str]]:
        known_agent(agent)
        return []

    @api.get(
        "/agents/{agent}/skills/registry",
        summary="Skill registry search (not in agentpost)",
        include_in_schema=False,
    )
    async def skills_registry(agent: Name) -> Ok:
        raise _not_here("skill registry")

    @api.post(
        "/agents/{agent}/skills/install", summary="Skill install (not in agentpost)", include_in_schema=False
    )
    async def skills_install(agent: Name) -> Ok:
        raise _not_here("skill registry")

    # -- heartbeats ----------------------------------------------------------------------------------------
    async def save_heartbeat_settings(agent: str, body: HeartbeatIn) -> Any:
        settings = runtime.settings
        if body.content is not None:
            path = settings.workspace(agent) / HEARTBEAT_FILE
            if not path.is_absolute():
                raise ApiError(400, f"agent {agent!r} has a relative workspace; set an absolute one first")

            def write() -> None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(body.content or "", encoding="utf-8")

            await run(write)
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
            return await edit(settings_edit.merge_settings, {"heartbeats": {agent: beat}})
        return runtime.settings

    @api.get("/agents/{agent}/heartbeat", summary="The agent's heartbeat prompt and timing")
    async def get_heartbeat(agent: Name) -> HeartbeatOut:
        known_agent(agent)
        settings = runtime.settings
        path = settings.workspace(agent) / HEARTBEAT_FILE

        def read() -> str:
            try:
                return path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                return ""

        beat = settings.file.heartbeats.get(agent)
        beat = beat if isinstance(beat, dict) else {}
        interval = beat.get("interval")
        return HeartbeatOut(
            content=await run(read),
            path=str(path),
            enabled=bool(beat) and bool(beat.get("enabled", True)),
            interval=float(interval) if interval is not None else None,
        )

    @api.put("/agents/{agent}/heartbeat", summary="Change the agent's heartbeat prompt or timing")
    async def put_heartbeat(agent: Name, body: HeartbeatIn) -> Ok:
        known_agent(agent)
        await save_heartbeat_settings(agent, body)
        return Ok(ok=True)

    # -- teams ----------------------------------------------------------------------------------------------
    @api.get("/teams", summary="Configured teams, keyed by id")
    async def teams() -> dict[str, TeamOut]:
        settings = runtime.settings
        return {name: team_out(settings, name) for name in sorted(settings.teams)}

    @api.put("/teams/{team}", summary="Create or replace a team")
    async def save_team(team: Name, body: TeamIn) -> TeamSaved:
        members = list(dict.fromkeys(body.agents))
        settings = await edit(
            settings_edit.put_team, team, name=body.name, agents=members, leader=body.leader_agent
        )
        return TeamSaved(ok=True, team=team_out(settings, team))

    @api.delete("/teams/{team}", summary="Remove a team (its agents stay)")
    async def delete_team(team: Name) -> Ok:
        try:
            await edit(settings_edit.remove_team, team)
        except KeyError:
            raise ApiError(404, f"no team {team!r} in settings.toml") from None
        return Ok(ok=True)

    # -- logs and status ----------------------------------------------------------------------------------
    @api.get("/logs", summary="The last lines of the process logs")
    async def logs(limit: Annotated[int, Query(ge=1, le=5000)] = 100) -> LogsOut:
        lines = await run(api_views.tail_logs, runtime.settings.home / "logs", limit)
        return LogsOut(lines=lines)

    @api.get("/status", summary="System status: this server, the channel adapters, heartbeats, the queue")
    async def status() -> SystemStatus:
        def read() -> SystemStatus:
            s = runtime.queue.queue_status()
            channels: dict[str, ChannelState] = {}
            for h in channel_health.read_all(db):
                parts = h.worker.split(":")
                pid = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
                running = h.state in ("up", "connecting", "retrying") and not h.adapter_gone
                channels[h.channel] = ChannelState(running=running, state=h.state, pid=pid, error=h.error)
            beats = runtime.settings.file.heartbeats
            intervals = [
                float(b["interval"]) for b in beats.values() if isinstance(b, dict) and b.get("interval")
            ]
            return SystemStatus(
                ok=True,
                uptime=round(time.monotonic() - STARTED, 3),
                server=ServerState(running=True, port=port),
                channels=channels,
                heartbeat=HeartbeatState(
                    running=bool(beats),
                    interval=min(intervals) if intervals else 0.0,
                    lastSent=api_views.last_heartbeats(db),
                ),
                queue=QueueStatusOut(
                    incoming=s["pending"],
                    queued=s["pending"],
                    outgoing=s["responses_pending"] + s["responses_delivering"],
                    activeConversations=api_views.active_conversations(db),
                    **s,
                ),
            )

        result: SystemStatus = await run(read)
        return result

    # -- schedules ----------------------------------------------------------------------------------------
    def schedule_rows() -> list[tuple[str, dict[str, Any]]]:
        rows = []
        for i, entry in enumerate(runtime.settings.file.schedules):
            rows.append((str(entry.get("name") or f"schedule-{i + 1}"), dict(entry)))
        return rows

    def schedule_out(sid: str, e: dict[str, Any], created_at: int) -> ScheduleOut:
        at = e.get("at")
        return ScheduleOut(
            id=sid,
            label=str(e.get("name") or sid),
            cron=str(e.get("cron") or ""),
            agentId=str(e.get("agent") or ""),
            message=str(e.get("message") or ""),
            channel="schedule",
            sender="Scheduler",
            enabled=bool(e.get("enabled", True)),
            createdAt=created_at,
            runAt=at.isoformat() if isinstance(at, datetime) else (str(at) if at else None),
        )

    def schedule_values(body: ScheduleIn, base: dict[str, Any]) -> dict[str, Any]:
        values = dict(base)
        if body.agentId is not None:
            values["agent"] = body.agentId
        if body.message is not None:
            values["message"] = body.message
        if body.cron:
            values["cron"] = _check_cron(body.cron)
            values.pop("at", None)
        if body.runAt:
            try:
                values["at"] = datetime.fromisoformat(body.runAt.replace("Z", "+00:00"))
            except ValueError:
                raise ApiError(400, f"runAt {body.runAt!r} is not an ISO date and time") from None
            values.pop("cron", None)
        if body.enabled is not None:
            values["enabled"] = body.enabled
        if not values.get("agent") or not AGENT_NAME_RE.match(str(values["agent"])):
            raise ApiError(400, "agentId: the agent the schedule writes to is required")
        if str(values["agent"]) not in runtime.settings.agents:
            raise ApiError(400, f"agentId: no agent {values['agent']!r}")
        if not values.get("message"):
            raise ApiError(400, "message: the text to send is required")
        if not values.get("cron") and not values.get("at"):
            raise ApiError(400, "give cron (five fields) or runAt (an ISO date and time)")
        return values

    @api.get("/schedules", summary="Scheduled messages ([[schedules]] in settings.toml)")
    async def get_schedules(agent: Annotated[str | None, Query(pattern=NAME)] = None) -> list[ScheduleOut]:
        created = int(runtime.settings.path.stat().st_mtime * 1000) if runtime.settings.path.exists() else 0
        return [
            schedule_out(sid, e, created)
            for sid, e in schedule_rows()
            if agent is None or e.get("agent") == agent
        ]

    @api.post("/schedules", status_code=201, summary="Add a scheduled message")
    async def create_schedule(body: ScheduleIn) -> ScheduleSaved:
        rows = schedule_rows()
        sid = _label_id(body.label or f"{body.agentId or 'schedule'}", {s for s, _ in rows})
        values = schedule_values(body, {"name": sid})
        entries = [e | {"name": s} for s, e in rows] + [values]
        await edit(settings_edit.put_schedules, entries)
        return ScheduleSaved(ok=True, schedule=schedule_out(sid, values, now_ms()))

    @api.put("/schedules/{sid}", summary="Change a scheduled message")
    async def update_schedule(
        sid: Annotated[str, PathParam(max_length=64)], body: ScheduleIn
    ) -> ScheduleSaved:
        rows = schedule_rows()
        found = [e for s, e in rows if s == sid]
        if not found:
            raise ApiError(404, f"no schedule {sid!r}")
        values = schedule_values(body, found[0] | {"name": sid})
        entries = [values if s == sid else e | {"name": s} for s, e in rows]
        await edit(settings_edit.put_schedules, entries)
        return ScheduleSaved(ok=True, schedule=schedule_out(sid, values, now_ms()))

    @api.delete("/schedules/{sid}", summary="Remove a scheduled message")
    async def delete_schedule(sid: Annotated[str, PathParam(max_length=64)]) -> Ok:
        rows = schedule_rows()
        if sid not in {s for s, _ in rows}:
            raise ApiError(404, f"no schedule {sid!r}")
        await edit(settings_edit.put_schedules, [e | {"name": s} for s, e in rows if s != sid])
        return Ok(ok=True)

    # -- pairing ------------------------------------------------------------------------------------------
    @api.get("/pairing", summary="Pending pairing codes and approved senders")
    async def get_pairings() -> PairingState:
        rows = await run(pairings.list_pairings, db)
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
            if p.status == "pending" and not p.expired(now)
        ]
        approved = [
            PairingApprovedOut(
                channel=p.channel,
                senderId=p.sender_id,
                sender=p.sender,
                approvedAt=p.approved_at or p.created_at,
                approvedCode=p.code or None,
            )
            for p in rows
            if p.status == "approved"
        ]
        return PairingState(pending=pending, approved=approved)

    @api.post("/pairing/approve", summary="Approve a sender by their pairing code")
    async def approve_pairing(body: CodeIn) -> PairingApproved:
        try:
            p = await run(pairings.approve, db, body.code)
        except pairings.PairingError as exc:
            raise ApiError(404, str(exc), ok=False) from None
        return PairingApproved(
            ok=True,
            entry=PairingApprovedOut(
                channel=p.channel,
                senderId=p.sender_id,
                sender=p.sender,
                approvedAt=p.approved_at or now_ms(),
                approvedCode=p.code,
            ),
        )

    @api.delete("/pairing/pending/{code}", summary="Dismiss a pending pairing code")
    async def dismiss_pending(code: Annotated[str, PathParam(max_length=32)]) -> Ok:
        wanted = code.strip().upper()
        rows = await run(pairings.list_pairings, db)
        found = [p for p in rows if p.status == "pending" and p.code == wanted]
        if not found:
            raise ApiError(404, f"no pending pairing has code {wanted!r}", ok=False)
        await run(pairings.revoke, db, found[0].channel, found[0].sender_id)
        return Ok(ok=True)

    @api.delete("/pairing/{channel}/{sender_id}", summary="Revoke a sender's pairing")
    async def revoke_pairing(
        channel: Name, sender_id: Annotated[str, PathParam(min_length=1, max_length=200)]
    ) -> Ok:
        try:
            await run(pairings.revoke, db, channel, sender_id)
        except pairings.PairingError as exc:
            raise ApiError(404, str(exc), ok=False) from None
        return Ok(ok=True)

    # -- TinyAGI features agentpost does not have ---------------------------------------------------------
    @api.get("/tasks", summary="Tasks: none in agentpost (empty list)")
    async def tasks() -> list[dict[str, Any]]:
        return []

    @api.get("/projects", summary="Projects: none in agentpost (empty list)")
    async def projects() -> list[dict[str, Any]]:
        return []

    @api.get("/custom-providers", summary="Custom providers: none in agentpost (empty object)")
    async def custom_providers() -> dict[str, Any]:
        return {}

    for method, path, what in [
        ("POST", "/tasks", "task board"),
        ("PUT", "/tasks/reorder", "task board"),
        ("GET", "/tasks/{item}", "task board"),
        ("PUT", "/tasks/{item}", "task board"),
        ("DELETE", "/tasks/{item}", "task board"),
        ("GET", "/tasks/{item}/comments", "task board"),
        ("POST", "/tasks/{item}/comments", "task board"),
        ("DELETE", "/comments/{item}", "task board"),
        ("POST", "/projects", "projects"),
        ("PUT", "/projects/{item}", "projects"),
        ("DELETE", "/projects/{item}", "projects"),
        ("PUT", "/custom-providers/{item}", "custom providers (agents name a provider and model)"),
        ("DELETE", "/custom-providers/{item}", "custom providers (agents name a provider and model)"),
        ("POST", "/services/apply", "service control over the API (use `agentpost restart`)"),
        ("POST", "/services/restart", "service control over the API (use `agentpost restart`)"),
        (
            "POST",
            "/services/channel/{item}/{action}",
            "service control over the API (use `agentpost restart`)",
        ),
    ]:
        api.add_api_route(
            path,
            _unsupported(what),
            methods=[method],
            status_code=501,
            summary=f"Not in agentpost: {what} (501)",
            response_model=Ok,
            # Always 501 by design (docs/compatibility.md): kept out of the schema, which lists what we serve.
            include_in_schema=False,
        )
    return api


def _unsupported(what: str) -> Callable[[], Awaitable[Ok]]:
    async def answer() -> Ok:
        raise _not_here(what)

    return answer
