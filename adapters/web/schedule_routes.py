"""The scheduled messages of the management API (``[[schedules]]`` in settings.toml), as TinyOffice lists,
adds, changes and removes them; every change goes through :mod:`shared.settings.edit` like the rest of
:mod:`adapters.web.manage`."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import Field

from shared.clock import now_ms
from shared.settings import edit as settings_edit
from shared.settings.model import Settings
from shared.settings.routing import AGENT_NAME_RE

from .dialect import Ok, ScheduleOut, ScheduleSaved
from .errors import ApiError
from .manage import edit
from .params import NAME_PATTERN, Body
from .state import Web

router = APIRouter()
ScheduleId = Annotated[str, PathParam(max_length=64)]


class ScheduleIn(Body):
    """``POST /api/schedules`` and ``PUT /api/schedules/{id}``."""

    agentId: str | None = Field(default=None, pattern=NAME_PATTERN)
    message: str | None = Field(default=None, min_length=1, max_length=100_000)
    cron: str | None = Field(default=None, max_length=200)
    runAt: str | None = Field(default=None, max_length=64)
    label: str | None = Field(default=None, max_length=64)
    enabled: bool | None = None


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


# -- schedules -----------------------------------------------------------------------------------------------
def schedule_rows(settings: Settings) -> list[tuple[str, dict[str, Any]]]:
    """The ``[[schedules]]`` entries with their ids (``name``, else ``schedule-<n>``)."""
    return [
        (str(entry.get("name") or f"schedule-{i + 1}"), dict(entry))
        for i, entry in enumerate(settings.file.schedules)
    ]


def schedule_out(sid: str, e: dict[str, Any], created_at: int) -> ScheduleOut:
    """One schedule as TinyOffice reads it."""
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


def schedule_values(settings: Settings, body: ScheduleIn, base: dict[str, Any]) -> dict[str, Any]:
    """The entry ``base`` with ``body``'s changes, checked (400 saying what is missing or wrong)."""
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
    if str(values["agent"]) not in settings.agents:
        raise ApiError(400, f"agentId: no agent {values['agent']!r}")
    if not values.get("message"):
        raise ApiError(400, "message: the text to send is required")
    if not values.get("cron") and not values.get("at"):
        raise ApiError(400, "give cron (five fields) or runAt (an ISO date and time)")
    return values


@router.get("/schedules", summary="Scheduled messages ([[schedules]] in settings.toml)")
async def get_schedules(
    web: Web, agent: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None
) -> list[ScheduleOut]:
    settings = web.settings
    created = int(settings.path.stat().st_mtime * 1000) if settings.path.exists() else 0
    return [
        schedule_out(sid, e, created)
        for sid, e in schedule_rows(settings)
        if agent is None or e.get("agent") == agent
    ]


@router.post("/schedules", status_code=201, summary="Add a scheduled message")
async def create_schedule(body: ScheduleIn, web: Web) -> ScheduleSaved:
    rows = schedule_rows(web.settings)
    sid = _label_id(body.label or f"{body.agentId or 'schedule'}", {s for s, _ in rows})
    values = schedule_values(web.settings, body, {"name": sid})
    entries = [e | {"name": s} for s, e in rows] + [values]
    await edit(web, settings_edit.put_schedules, entries)
    return ScheduleSaved(ok=True, schedule=schedule_out(sid, values, now_ms()))


@router.put("/schedules/{sid}", summary="Change a scheduled message")
async def update_schedule(sid: ScheduleId, body: ScheduleIn, web: Web) -> ScheduleSaved:
    rows = schedule_rows(web.settings)
    found = [e for s, e in rows if s == sid]
    if not found:
        raise ApiError(404, f"no schedule {sid!r}")
    values = schedule_values(web.settings, body, found[0] | {"name": sid})
    entries = [values if s == sid else e | {"name": s} for s, e in rows]
    await edit(web, settings_edit.put_schedules, entries)
    return ScheduleSaved(ok=True, schedule=schedule_out(sid, values, now_ms()))


@router.delete("/schedules/{sid}", summary="Remove a scheduled message")
async def delete_schedule(sid: ScheduleId, web: Web) -> Ok:
    rows = schedule_rows(web.settings)
    if sid not in {s for s, _ in rows}:
        raise ApiError(404, f"no schedule {sid!r}")
    await edit(web, settings_edit.put_schedules, [e | {"name": s} for s, e in rows if s != sid])
    return Ok(ok=True)
