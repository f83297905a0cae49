"""What an agent is doing for one chat, read from the database: the ``/status`` command and the web API.

The processor keeps a small *run record* per agent in the ``kv`` table (scope ``agent_run``, key = the
agent; one run at a time per agent) while a run goes on: run id, worker, chat, message ids, when it started
and its last step (the last ``agent_progress`` text, refreshed every second or two). :func:`record_run`,
:func:`update_run_step` and :func:`clear_run` write it; :func:`conversation_status` reads it together with
the chat's messages and the agent's pause, and trusts a record only while its messages are still being
processed under a live lease (a processor killed mid-run leaves a stale record, which is then ignored).
"""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from typing import Any

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope
from shared.storage.queries import conversations as q


def record_run(db: Database, agent: str, **fields: Any) -> None:
    """Note that ``agent`` now runs ``message_ids`` for the chat ``channel``/``conversation`` (the fields of
    :func:`record_run_in`), in a transaction of its own."""
    db.run_transaction(functools.partial(record_run_in, agent=agent, **fields))


def record_run_in(
    tx: Tx,
    agent: str,
    *,
    run_id: str,
    worker: str,
    chat: ChatAddress,
    message_ids: list[str],
    started_at: int,
) -> None:
    """:func:`record_run` inside the caller's transaction (the processor writes it with the run's start)."""
    value = {
        "run_id": run_id,
        "worker": worker,
        "channel": chat.channel,
        "conversation": chat.chat,
        "message_ids": list(message_ids),
        "started_at": started_at,
        "last_step": "",
        "last_step_at": 0,
    }
    kv.put(tx, Scope.AGENT_RUN, agent, json.dumps(value, separators=(",", ":")))


def update_run_step(db: Database, agent: str, run_id: str, step: str, at: int) -> bool:
    """Record the run's last step (only while the record still belongs to ``run_id``)."""
    current = _get(db, agent)
    if current is None or current.get("run_id") != run_id:
        return False
    current["last_step"] = step[:500]
    current["last_step_at"] = at
    _put(db, agent, current)
    return True


def clear_run(db: Database, agent: str, run_id: str) -> None:
    """Forget the run record once the run is over (a newer run's record is left alone)."""
    current = _get(db, agent)
    if current is not None and current.get("run_id") == run_id:
        with db.transaction() as tx:
            clear_run_in(tx, agent, run_id)


def clear_run_in(tx: Tx, agent: str, run_id: str) -> None:
    """:func:`clear_run` inside the caller's transaction (the processor clears it with the completion)."""
    value = kv.get(tx, Scope.AGENT_RUN, agent)
    if value is None:
        return
    try:
        current = json.loads(value)
    except ValueError:
        current = None
    if not isinstance(current, dict) or current.get("run_id") == run_id:
        kv.delete(tx, Scope.AGENT_RUN, agent)


def current_run(db: Database, agent: str, now: int | None = None) -> dict[str, Any] | None:
    """The agent's run record while it is live (its messages processing under an unexpired lease)."""
    record = _get(db, agent)
    if record is None or not record.get("message_ids"):
        return None
    now = now_ms() if now is None else now
    ids = [str(i) for i in record["message_ids"]]
    live = db.read_scalar(q.live_in_run(len(ids)), {"now": now, **{f"m{n}": i for n, i in enumerate(ids)}})
    return record if int(live or 0) > 0 else None


def conversation_status(
    db: Database, agent: str | None, chat: ChatAddress, *, now: int | None = None
) -> dict[str, Any]:
    """What ``agent`` (``None``: any agent) is doing for ``chat``.

    Keys: ``running`` (bool), ``run_id``, ``agent`` (the running one, or the one asked about),
    ``running_since`` (epoch ms or 0), ``last_step``, ``last_step_at``, ``message_ids`` (of the run),
    ``waiting`` (messages of this chat not in the run and not finished), ``waiting_ids``, ``paused_until``
    (epoch ms, 0 when not paused), ``pause_reason``, ``now``.
    """
    now = now_ms() if now is None else now
    rows = db.read(
        q.open_in_chat(of_agent=agent is not None),
        {"channel": chat.channel, "conv": chat.chat, "agent": agent},
    )
    agents = {agent} if agent is not None else {str(r["agent"]) for r in rows}
    run: dict[str, Any] | None = None
    run_agent = agent
    for name in sorted(agents):
        record = current_run(db, name, now)
        if record is not None and (record["channel"], record["conversation"]) == chat.key:
            run, run_agent = record, name
            break
    in_run = set(run["message_ids"]) if run else set()
    waiting = [str(r["message_id"]) for r in rows if r["message_id"] not in in_run]
    paused_until, reason = 0, ""
    for name in sorted(agents):
        pause = db.read(q.AGENT_PAUSE, {"a": name, "now": now})
        if pause and int(pause[0]["paused_until"]) > paused_until:
            paused_until, reason = int(pause[0]["paused_until"]), str(pause[0]["note"] or "")
    return {
        "agent": run_agent,
        "channel": chat.channel,
        "conversation": chat.chat,
        "running": run is not None,
        "run_id": run["run_id"] if run else None,
        "running_since": int(run["started_at"]) if run else 0,
        "last_step": str(run.get("last_step") or "") if run else "",
        "last_step_at": int(run.get("last_step_at") or 0) if run else 0,
        "message_ids": list(run["message_ids"]) if run else [],
        "waiting": len(waiting),
        "waiting_ids": waiting,
        "paused_until": paused_until,
        "pause_reason": reason,
        "now": now,
    }


def format_duration(ms: int) -> str:
    """``45 s``, ``6 min``, ``2 h 5 min``: how long something has been going, for chat notes."""
    seconds = max(0, int(ms // 1000))
    if seconds < 90:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def format_time(ms: int) -> str:
    """An epoch-ms time as ``HH:MM UTC`` (with the date when it is not today)."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    today = datetime.now(UTC).date()
    return moment.strftime("%H:%M UTC" if moment.date() == today else "%Y-%m-%d %H:%M UTC")


def format_status(status: dict[str, Any]) -> str:
    """The status as a short chat message (a few lines, no markup)."""
    now = int(status.get("now") or now_ms())
    lines: list[str] = []
    if status["running"]:
        since = int(status["running_since"])
        line = f"Working on it since {format_time(since)} ({format_duration(now - since)})"
        if status.get("agent"):
            line += f" — @{status['agent']}"
        lines.append(line + ".")
        if status["last_step"]:
            step = " ".join(str(status["last_step"]).split())
            lines.append(f"Last step: {step[:200]}")
    waiting = int(status["waiting"])
    if waiting:
        lines.append(f"{waiting} message{'s' if waiting != 1 else ''} waiting.")
    if status["paused_until"] and int(status["paused_until"]) > now:
        until = int(status["paused_until"])
        lines.append(
            f"Paused until {format_time(until)} (in {format_duration(until - now)})"
            + (f": {status['pause_reason']}" if status["pause_reason"] else "")
            + "."
        )
    if not lines:
        lines.append("Nothing is running or waiting for this chat.")
    return "\n".join(lines)


def _get(db: Database, agent: str) -> dict[str, Any] | None:
    value = kv.get(db, Scope.AGENT_RUN, agent)
    if value is None:
        return None
    try:
        data = json.loads(str(value))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _put(db: Database, agent: str, value: dict[str, Any]) -> None:
    with db.transaction() as tx:
        kv.put(tx, Scope.AGENT_RUN, agent, json.dumps(value, separators=(",", ":")))
