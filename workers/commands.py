"""``agentpost agent list|add|remove|reset`` and ``agentpost team list|add|remove``.

Agents and teams live in ``settings.toml``. These commands edit it with tomlkit, so the operator's comments
and layout survive, and validate the whole edited file with the same rules the processes use *before*
replacing it (atomically): a command can never leave a settings file that a process would refuse.
Running processes pick up agents and teams at their next start; ``reset`` works at once (it goes through
the database: the agent's next run starts a fresh conversation).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import tomlkit
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from tomlkit.toml_document import TOMLDocument

from shared.chat.sessions import clear_sessions, list_sessions
from shared.queue.reports import open_message_count
from shared.runtime import open_runtime
from shared.settings.edit import edit_settings
from shared.settings.edit import table_of as _table
from shared.settings.model import Settings, SettingsError, default_home, load_settings
from shared.settings.routing import is_valid_name, validate_name

agent_app = typer.Typer(help="List, add, remove and reset agents.", no_args_is_help=True)
team_app = typer.Typer(help="List, add and remove teams.", no_args_is_help=True)

console = Console()
err_console = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]


def register(app: typer.Typer) -> None:
    """Add the ``agent`` and ``team`` command groups to the ``agentpost`` CLI."""
    app.add_typer(agent_app, name="agent")
    app.add_typer(team_app, name="team")


def _fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        raise _fail(str(exc), 2) from None


def _name(value: str, kind: str) -> str:
    try:
        return validate_name(value, kind)
    except ValueError as exc:
        raise _fail(str(exc), 2) from None


def _apply(change: Callable[[TOMLDocument], None]) -> Path:
    try:
        return edit_settings(default_home(), change)
    except SettingsError as exc:
        raise _fail(str(exc), 2) from None


# -- agents ------------------------------------------------------------------------------------------------
@agent_app.command("list")
def agent_list(as_json: JsonFlag = False) -> None:
    """The configured agents, their provider, teams, workspace and whether a conversation is recorded."""
    settings = _settings()
    sessions: dict[str, int] = {}
    try:
        with open_runtime() as rt:
            for row in list_sessions(rt.db):
                if row["session_id"]:
                    sessions[str(row["agent"])] = sessions.get(str(row["agent"]), 0) + 1
    except Exception:  # the list is useful without the database too
        sessions = {}
    rows: list[dict[str, Any]] = []
    for name, agent in sorted(settings.agents.items()):
        teams = sorted(t for t, team in settings.teams.items() if name in team.agents)
        rows.append(
            {
                "agent": name,
                "name": agent.name,
                "provider": agent.provider,
                "model": agent.model,
                "session_scope": agent.session_scope,
                "teams": teams,
                "workspace": str(settings.workspace(name)),
                "default": name == settings.queue.default_agent,
                "sessions": sessions.get(name, 0),
            }
        )
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table("agent", "provider", "model", "scope", "teams", "sessions", "workspace", title="agents")
    for r in rows:
        label = r["agent"] + (" (default)" if r["default"] else "")
        table.add_row(
            label,
            r["provider"],
            r["model"] or "-",
            r["session_scope"],
            ", ".join(r["teams"]) or "-",
            str(r["sessions"]),
            r["workspace"],
        )
    console.print(table)


@agent_app.command("add")
def agent_add(
    agent: Annotated[str, typer.Argument(help="Agent id: a-z, 0-9, '_' or '-', up to 32 characters.")],
    provider: Annotated[str, typer.Option(help="claude, codex or command.")] = "claude",
    name: Annotated[str, typer.Option(help="Display name.")] = "",
    model: Annotated[str, typer.Option(help="Model (empty: the CLI's default).")] = "",
    system_prompt: Annotated[str, typer.Option(help="Text appended to the agent's system prompt.")] = "",
    permission_mode: Annotated[
        str, typer.Option(help="default, acceptEdits, bypassPermissions, dontAsk, plan.")
    ] = "",
    session_scope: Annotated[
        str, typer.Option(help="agent (one conversation) or conversation (one per chat).")
    ] = "",
    timeout: Annotated[float | None, typer.Option(help="Wall-clock limit of one run, in seconds.")] = None,
    command: Annotated[
        list[str] | None, typer.Option(help="argv item (repeat): the command template or CLI path.")
    ] = None,
    workspace: Annotated[str, typer.Option(help="Working folder (default: workspace/<agent>).")] = "",
) -> None:
    """Add an agent to settings.toml."""
    agent = _name(agent, "agent")
    settings = _settings()
    if agent in settings.file.agents or agent in settings.teams:
        raise _fail(f"{agent!r} already exists (remove it first, or edit {settings.path})")
    values: dict[str, Any] = {
        "name": name,
        "provider": provider,
        "model": model,
        "system_prompt": system_prompt,
        "permission_mode": permission_mode,
        "session_scope": session_scope,
        "timeout_seconds": timeout,
        "command": command or [],
        "workspace": workspace,
    }
    entry = tomlkit.table()
    for key, value in values.items():
        if value not in ("", None, []):
            entry[key] = value
    implicit_default = settings.queue.default_agent

    def change(doc: TOMLDocument) -> None:
        agents = _table(doc, "agents")
        if not settings.file.agents and implicit_default != agent and implicit_default not in agents:
            # With no [agents] the default agent existed implicitly; keep it once others are declared.
            default = tomlkit.table()
            default["name"] = "Assistant"
            agents[implicit_default] = default
        agents[agent] = entry

    path = _apply(change)
    console.print(
        f"added agent [bold]{agent}[/] to {path}; the running processes take it up within a few seconds"
    )


@agent_app.command("remove")
def agent_remove(
    agent: Annotated[str, typer.Argument(help="The agent to remove.")],
    force: Annotated[bool, typer.Option(help="Remove even with messages waiting for it.")] = False,
) -> None:
    """Remove an agent from settings.toml (its workspace folder is kept)."""
    agent = _name(agent, "agent")
    settings = _settings()
    if agent not in settings.file.agents:
        raise _fail(f"no agent {agent!r} in {settings.path}")
    if agent == settings.queue.default_agent:
        raise _fail(f"{agent!r} is the default agent (queue.default_agent); choose another default first")
    teams = sorted(t for t, team in settings.teams.items() if agent in team.agents)
    if teams:
        raise _fail(f"{agent!r} is a member of team(s) {', '.join(teams)}; remove it from them first")
    with open_runtime() as rt:
        waiting = open_message_count(rt.db, agent)
    if waiting and not force:
        raise _fail(
            f"{waiting} message(s) are waiting for {agent!r}; they would fail as unknown (use --force)"
        )

    def change(doc: TOMLDocument) -> None:
        del _table(doc, "agents")[agent]

    path = _apply(change)
    console.print(f"removed agent [bold]{agent}[/] from {path} (workspace {settings.workspace(agent)} kept)")


@agent_app.command("reset")
def agent_reset(
    agent: Annotated[str, typer.Argument(help="The agent whose conversation starts over.")],
    conversation: Annotated[
        str | None,
        typer.Option(help="Only this chat ('channel:conversation'; session_scope = conversation)."),
    ] = None,
) -> None:
    """Start a fresh conversation: the agent's next run does not continue the previous one."""
    agent = _name(agent, "agent")
    settings = _settings()
    if agent not in settings.agents:
        raise _fail(f"no agent {agent!r} (known: {', '.join(sorted(settings.agents))})")
    with open_runtime() as rt:
        n = clear_sessions(rt.db, agent, conversation, reason="cli")
    console.print(
        f"reset [bold]{agent}[/]: its next run starts a new conversation ({n} session(s) forgotten)"
    )


# -- teams -------------------------------------------------------------------------------------------------
@team_app.command("list")
def team_list(as_json: JsonFlag = False) -> None:
    """The configured teams with their leader and members."""
    settings = _settings()
    rows: list[dict[str, Any]] = [
        {"team": n, "leader": t.leader, "agents": list(t.agents)} for n, t in sorted(settings.teams.items())
    ]
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    if not rows:
        console.print("no teams")
        return
    table = Table("team", "leader", "agents", title="teams")
    for r in rows:
        table.add_row(r["team"], r["leader"], ", ".join(r["agents"]))
    console.print(table)


@team_app.command("add")
def team_add(
    team: Annotated[str, typer.Argument(help="Team id (same rules as agent ids).")],
    agents: Annotated[
        list[str], typer.Option("--agent", "-a", help="A member (repeat, or comma-separated).")
    ],
    leader: Annotated[
        str | None, typer.Option(help="Who receives '@team' messages (default: first member).")
    ] = None,
    name: Annotated[str, typer.Option(help="Display name.")] = "",
) -> None:
    """Add a team of existing agents."""
    team = _name(team, "team")
    members: list[str] = []
    for item in agents:
        for part in item.split(","):
            if part.strip() and part.strip() not in members:
                members.append(_name(part.strip(), "agent"))
    if not members:
        raise _fail("a team needs at least one --agent")
    settings = _settings()
    unknown = [m for m in members if m not in settings.agents]
    if unknown:
        raise _fail(f"unknown agent(s) {', '.join(unknown)} (known: {', '.join(sorted(settings.agents))})")
    if team in settings.teams or team in settings.agents:
        raise _fail(f"{team!r} already exists as a team or an agent")
    chosen = leader or members[0]
    if not is_valid_name(chosen) or chosen not in members:
        raise _fail(f"leader {chosen!r} must be one of the members {members}")
    entry = tomlkit.table()
    if name:
        entry["name"] = name
    entry["agents"] = members
    entry["leader"] = chosen

    def change(doc: TOMLDocument) -> None:
        _table(doc, "teams")[team] = entry

    path = _apply(change)
    console.print(f"added team [bold]{team}[/] ({', '.join(members)}; leader {chosen}) to {path}")


@team_app.command("remove")
def team_remove(team: Annotated[str, typer.Argument(help="The team to remove (its agents stay).")]) -> None:
    """Remove a team; its agents stay."""
    team = _name(team, "team")
    settings = _settings()
    if team not in settings.teams:
        raise _fail(f"no team {team!r} in {settings.path}")

    def change(doc: TOMLDocument) -> None:
        del _table(doc, "teams")[team]

    path = _apply(change)
    console.print(f"removed team [bold]{team}[/] from {path}")
