"""Agent workspaces: ``workspace/<agent>/`` with its instructions, created on first use.

A workspace is the CLI's working directory: its own files, and (for Claude Code) its conversation history,
which ``-c`` continues. The files written here are created once and then belong to the operator and the
agent: they are never overwritten, so edits survive restarts.

- ``AGENTS.md``: who the agent is, its teammates and how to hand work to them (read by Codex and others);
- ``CLAUDE.md``: imports ``AGENTS.md`` (Claude Code reads ``CLAUDE.md``, and ``@file`` includes another);
- ``heartbeat.md``: what the agent should do on a timed heartbeat (the scheduler sends it as a message).
"""

from __future__ import annotations

import os
from pathlib import Path

from shared.routing import validate_name
from shared.settings import Settings


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
