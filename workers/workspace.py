"""Agent workspaces: ``workspace/<agent>/`` with its instructions, created on first use.

A workspace is the CLI's working directory: its own files, and (for Claude Code) its conversation history,
which ``-c`` continues. The files written here are created once and then belong to the operator and the
agent: they are never overwritten, so edits survive restarts.

- ``AGENTS.md``: who the agent is, its teammates and how to hand work to them (read by Codex and others);
- ``CLAUDE.md``: imports ``AGENTS.md`` (Claude Code reads ``CLAUDE.md``, and ``@file`` includes another);
- ``heartbeat.md``: what the agent should do on a timed heartbeat (the scheduler sends it as a message);
- ``.agentpost-workspace`` (:data:`MARKER`): which workspace this is (a random id, the agent, the host it was
  made on). The same id is recorded in the database (:mod:`shared.queue.workspaces`).

Across hosts (PostgreSQL, processors on several machines), a workspace lives on the host that made it: its
files, and what the agent built there. A processor that takes over an agent whose workspace another host
made, and finds no folder here carrying that workspace's marker (none made here, a copy that is not the one
in use, or a shared mount that is not mounted), must not run the agent in an empty folder: the run is
refused (:class:`WorkspaceElsewhere`), the chat told why in plain words and the operator in the message's
error (``agentpost trace``) and in ``agentpost doctor``. Copying the folder over (with its marker), or
storage every host sees (``workspace_shared = true`` in ``[agents.<name>]``) lets any host run it;
``[processor] agents`` pins an agent to the hosts that have it (docs/restarts.md, "Standby processors").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared import safe_files
from shared.clock import now_ms
from shared.ids import new_id
from shared.queue.workspaces import record_workspace, workspace_record
from shared.settings.model import Settings
from shared.settings.routing import validate_name
from shared.storage.db import Database

log = logging.getLogger("agentpost.processor")

#: The file naming a workspace (see the module docstring).
MARKER = ".agentpost-workspace"


def teammates(settings: Settings, agent: str) -> dict[str, list[str]]:
    """The teams ``agent`` belongs to, each with its other members."""
    return {
        name: [a for a in team.agents if a != agent]
        for name, team in sorted(settings.teams.items())
        if agent in team.agents
    }


def team_instructions(settings: Settings, agent: str) -> str:
    """How ``agent`` talks to its teams (empty for an agent in no team)."""
    teams = teammates(settings, agent)
    if not teams:
        return ""
    lines = [
        "You work in a team. To hand work to a teammate, write a tag in your reply:",
        "  [@name: what you need]   (or [@a,b: ...] for several)",
        "To post to your team's chat room (every other member receives it): [#team: message]",
        "Your reply text around the tags is shown to the user; teammates answer the user themselves.",
    ]
    for team, members in teams.items():
        leader = settings.teams[team].leader
        lines.append(f"Team #{team} (leader @{leader}): " + ", ".join(f"@{m}" for m in members))
    return "\n".join(lines)


def _agents_md(settings: Settings, agent: str) -> str:
    config = settings.agents[agent]
    title = config.name or agent
    body = [
        f"# {title} (@{agent})",
        "",
        "You are an agent of agentpost: people write to you from chat apps.",
        "Answer concisely; your reply is sent back to the chat the message came from.",
        "",
    ]
    if config.system_prompt:
        body += [config.system_prompt, ""]
    team_text = team_instructions(settings, agent)
    if team_text:
        body += [team_text, ""]
    body += [
        "Files sent by users arrive as `[file: /absolute/path]` lines.",
        "To send a file back, put `[send_file: path]` on its own line; the file must be inside this",
        "workspace or agentpost's files folder.",
        "",
    ]
    return "\n".join(body)


_HEARTBEAT_MD = """# Heartbeat

This file is read on each timed heartbeat. Write here what you should check or do when one arrives.
If there is nothing to do, reply briefly that all is well.
"""


def _write_once(path: Path, text: str) -> None:
    # Create exclusively: an operator's (or the agent's) edits are never overwritten, and two processors
    # preparing the same workspace at once cannot interleave.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def ensure_workspace(settings: Settings, agent: str) -> Path:
    """Create ``agent``'s workspace and its instruction files if missing; return its path."""
    validate_name(agent, "agent")
    path = settings.workspace(agent)
    path.mkdir(parents=True, exist_ok=True)
    _write_once(path / "AGENTS.md", _agents_md(settings, agent))
    _write_once(path / "CLAUDE.md", "@AGENTS.md\n")
    _write_once(path / "heartbeat.md", _HEARTBEAT_MD)
    return path


@dataclass
class WorkspaceElsewhere(Exception):
    """``agent``'s workspace was made on ``made_on``; this host (``here``) has no copy of it at ``path``."""

    agent: str
    path: Path
    made_on: str
    here: str
    copy: bool = False  # a folder with another workspace's marker is here (an old or a foreign copy)

    def __str__(self) -> str:
        return self.error()

    def error(self) -> str:
        """For the operator (the message's last error, ``trace``, ``dead list``)."""
        found = "holds another copy of it" if self.copy else "is missing or has no workspace marker"
        return (
            f"workspace not on this host: agent {self.agent}'s workspace was made on host {self.made_on}; "
            f"{self.path} on host {self.here} {found} ({MARKER}). Copy the folder here, set "
            f"workspace_shared = true in [agents.{self.agent}] if every host sees it, or pin the agent to its "
            "host with [processor] agents (docs/restarts.md)"
        )

    def explanation(self) -> str:
        """For the sender, in plain words."""
        return (
            f"{self.agent}'s files are kept on another server ({self.made_on}), and the server that picked up "
            "your message does not have them, so it did not start the agent without its files"
        )

    @staticmethod
    def advice() -> str:
        return "The operator has been told. Send your message again once they say the agent is back."


def host_of(worker: str) -> str:
    """The host part of a worker id (``host:pid:start``, :mod:`shared.worker_identity`)."""
    return worker.split(":", 1)[0]


#: A marker is a line of JSON; one larger than this is not read.
MARKER_LIMIT = 64 * 1024


def _read_json(folder: Path, name: str) -> dict[str, Any] | None:
    # The agent owns its workspace: the marker is read without following a link, from a regular file only
    # (a FIFO in its place would block this thread, and with it the agent, for good).
    try:
        text = safe_files.read_text_under(folder, name, MARKER_LIMIT)
    except safe_files.Refused as exc:
        log.warning("the workspace marker %s is not read: %s", folder / name, exc.reason)
        return None
    except (OSError, ValueError):
        return None
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        if isinstance(data, dict) and isinstance(data.get("id"), str):
            return data
    return None


def workspace_marker(settings: Settings, agent: str) -> dict[str, Any] | None:
    """The marker of ``agent``'s workspace folder on this host, or None."""
    return _read_json(settings.workspace(agent), MARKER)


def check_workspace(settings: Settings, agent: str, host: str, record: dict[str, Any] | None) -> None:
    """Raise :class:`WorkspaceElsewhere` when ``agent`` must not run on ``host`` (see the module docstring)."""
    config = settings.agents.get(agent)
    if record is None or (config is not None and config.workspace_shared):
        return
    made_on = str(record.get("host") or "")
    if made_on == host:
        return  # its own workspace: made again here if the operator removed it, as on a single host
    marker = workspace_marker(settings, agent)
    if marker is None or marker["id"] != record["id"]:
        raise WorkspaceElsewhere(agent, settings.workspace(agent), made_on, host, copy=marker is not None)


def prepare_workspace(db: Database, settings: Settings, agent: str, host: str) -> Path:
    """The workspace ``agent`` runs in on ``host``, made if it may be (first use anywhere, this host's own,
    or a shared one); raises :class:`WorkspaceElsewhere` when another host has it. The first use records
    the workspace in the database and writes its marker; a folder from before markers is adopted."""
    record = workspace_record(db, agent)
    check_workspace(settings, agent, host, record)
    path = ensure_workspace(settings, agent)
    marker = workspace_marker(settings, agent)
    if marker is None:
        marker = {"id": new_id("ws"), "agent": agent, "host": host, "path": str(path), "made_at": now_ms()}
        _write_once(path / MARKER, json.dumps(marker) + "\n")
        marker = workspace_marker(settings, agent) or marker  # another processor's, had it been first
    if record is None or record["id"] != marker["id"]:
        record_workspace(db, agent, marker)
    return path
