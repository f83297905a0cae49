"""Doctor checks for agents: is each agent's CLI installed, and can it log in?"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from shared.cli.doctor import Check, Level
from shared.queue.workspaces import workspace_record
from shared.settings.model import AgentSettings, Settings
from shared.settings.providers import CLAUDE, PROVIDER_FACTS
from shared.worker_identity import this_host
from workers.agent_env import child_env
from workers.egress_policy import policy_for
from workers.limits import find_place, size_words
from workers.providers.base import ProviderError, RunRequest, find_binary
from workers.providers.claude_warm import KEPT_PROCESS_BYTES, available_memory, memory_cap
from workers.sandbox import SANDBOX_USER, SandboxError, SandboxPlan, runs_as_root
from workers.sandbox import choose as choose_sandbox
from workers.workspace import WorkspaceElsewhere, check_workspace, host_of


def _claude_login(env: dict[str, str]) -> Check | None:
    if env.get("ANTHROPIC_API_KEY") or env.get("CLAUDE_CODE_OAUTH_TOKEN"):
        return None
    home = Path(env.get("HOME") or Path.home())
    credentials = home / CLAUDE.login_files[0]
    if credentials.exists():
        return None
    return Check(
        "agents",
        "claude login",
        "fail",
        f"no Claude login found (no ANTHROPIC_API_KEY, no {credentials})",
        "run `claude` once and log in, or set ANTHROPIC_API_KEY for the processor",
    )


def _privacy(name: str, agent: AgentSettings, settings: Settings, env: dict[str, str]) -> list[Check]:
    """What the agent's CLI will receive (names only) and whether its conversation is shared."""
    withheld = sorted(k for k in settings.env if k not in env)
    detail = f"receives {', '.join(sorted(env)) or 'nothing'}"
    if withheld:
        detail += f"; withheld from it: {', '.join(withheld)}"
    found = [Check("agents", f"agent {name} environment", "ok", detail)]
    if agent.session_scope == "agent":
        found.append(
            Check(
                "agents",
                f"agent {name} conversation",
                "warn",
                'one conversation is shared by every chat (session_scope = "agent"): what one person says is '
                "context for the answers another person gets",
                f"remove session_scope from [agents.{name}] for one private conversation per chat",
            )
        )
    return found


def _sandbox(settings: Settings) -> list[Check]:
    """How the processor will confine agent CLIs (workers/sandbox.py), checked the way it checks at start
    (without creating the sandbox user: the processor does that when it first needs it)."""
    mode = (settings.env.get("AGENTPOST_SANDBOX") or settings.processor.sandbox).strip()
    if mode not in ("auto", "namespaces", "none"):
        return [
            Check("agents", "sandbox", "fail", f"AGENTPOST_SANDBOX={mode!r}", "use auto, namespaces or none")
        ]
    try:
        plan = choose_sandbox(mode, create_user=False)  # type: ignore[arg-type]
    except SandboxError as exc:
        return [
            Check("agents", "sandbox", "fail", str(exc), "install bubblewrap, or set [processor] sandbox")
        ]
    if plan.kind == "namespaces":
        return [
            Check("agents", "sandbox", "ok", f"agents run confined: {plan.describe}"),
            *_network(settings, plan),
        ]
    if runs_as_root() and "does not exist" in plan.reason:
        return [
            Check(
                "agents",
                "sandbox",
                "ok",
                f"agents will run confined as the user {SANDBOX_USER}, which the processor creates at its start",
            )
        ]
    exposed = sorted(
        name
        for name, agent in settings.agents.items()
        if agent.permission_mode == "bypassPermissions" or agent.provider == "command"
    )
    what = (
        f"agents run with agentpost's own rights ({plan.reason}): one run can read the database (every "
        "conversation), settings.toml, every workspace and, as the same user, the other processes"
    )
    fix = 'install bubblewrap (Debian: apt-get install bubblewrap) and leave [processor] sandbox = "auto"'
    if not exposed:
        return [Check("agents", "sandbox", "warn", what, fix)]
    return [
        Check(
            "agents",
            "sandbox",
            "fail",
            f"{what}; {', '.join(exposed)} run commands without asking (bypassPermissions or a command agent)",
            fix,
        )
    ]


def _network(settings: Settings, plan: SandboxPlan) -> list[Check]:
    """What each agent's runs may reach through the egress proxy (workers/egress_policy.py), as
    tests/e2e/test_sandbox_network.py shows it; a warning for ``network = "open"``, and a failure where no
    network namespace can be had for an agent that runs commands without asking."""
    if not plan.network:
        exposed = sorted(
            name
            for name, agent in settings.agents.items()
            if agent.permission_mode == "bypassPermissions" or agent.provider == "command"
        )
        what = (
            f"agents share the host's network ({plan.reason}): a run reaches agentpost's API, the databases "
            "and every service on this machine"
        )
        fix = "run the processor where network namespaces are allowed (bwrap --unshare-net)"
        status: Level = "fail" if exposed else "warn"
        extra = f"; {', '.join(exposed)} run commands without asking" if exposed else ""
        return [Check("agents", "network", status, what + extra, fix)]
    found: list[Check] = []
    for name, agent in sorted(settings.agents.items()):
        policy = policy_for(name, agent, settings.env)
        if policy.open:
            found.append(
                Check(
                    "agents",
                    f"network of {name}",
                    "warn",
                    f'reaches {policy.describe()} (network = "open"): a prompt-injected run can send what it '
                    "reads anywhere",
                    f"list the hosts {name} needs in [agents.{name}] network instead",
                )
            )
        elif policy.rules:
            found.append(Check("agents", f"network of {name}", "ok", f"reaches only {policy.describe()}"))
        else:
            found.append(
                Check(
                    "agents", f"network of {name}", "ok", "reaches nothing: no AI service and no hosts named"
                )
            )
    return found


def _warm(settings: Settings) -> list[Check]:
    """Whether chats keep their CLI running between messages (``[processor] session_idle_seconds``), and
    which agents cannot: only Claude Code takes one message after another on one process."""
    config = settings.processor
    if not settings.agents:
        return []
    cold = sorted(
        f"{name} ({agent.provider})" for name, agent in settings.agents.items() if agent.provider != "claude"
    )
    found: list[Check] = []
    if config.session_idle_seconds > 0:
        if config.warm_sessions_total is not None:
            total = f"{config.warm_sessions_total} in all"
        else:
            available = available_memory()
            total = (
                f"{memory_cap(0, available)} in all: a quarter of the {available // 2**20} MiB available now, "
                f"about {KEPT_PROCESS_BYTES // 2**20} MiB each"
                if available is not None
                else f"{memory_cap(0, None)} in all"
            )
        detail = (
            f"Claude agents keep a chat's CLI running for {config.session_idle_seconds:g} s after a reply, so "
            f"the next message skips the start-up (at most {config.warm_sessions_per_agent} per agent, "
            f"{total})"
        )
        now = _kept_now(settings)
        if now:
            detail += f"; {now}"
        if cold:
            detail += (
                f"; {', '.join(cold)} start their CLI for every message: only Claude Code can stay running"
            )
        found.append(Check("agents", "warm sessions", "ok", detail))
    if cold and _steer_anywhere(settings):
        found.append(
            Check(
                "agents",
                "busy policy steer",
                "ok",
                f"{', '.join(cold)} cannot take a message while they work: under steer, messages sent "
                "meanwhile are answered together in one follow-up run (as under collect)",
            )
        )
    return found


def _kept_now(settings: Settings) -> str:
    """How many CLIs the running processors keep now and the last reason one was closed, from their
    presence rows ("" when the database cannot tell: not made yet, or down; its own check says so)."""
    from shared.queue.presence import warm_summary
    from shared.storage.schema import open_database

    try:
        db = open_database(settings.database_url, create=False)
    except Exception:
        return ""
    try:
        kept, latest = warm_summary(db)
    except Exception:
        return ""
    finally:
        db.close()
    return f"{kept} kept now" + (f" (the last one closed: {latest})" if latest else "")


def _steer_anywhere(settings: Settings) -> bool:
    """Whether ``steer`` is the busy policy of the processor or of a channel (a chat's own ``/queue``
    choice is not in the settings)."""
    if settings.processor.busy_policy == "steer":
        return True
    return any(
        isinstance(section, dict) and section.get("busy_policy") == "steer"
        for section in settings.file.channels.values()
    )


def _workspaces(settings: Settings) -> list[Check]:
    """Whether this host has the workspace of each agent its processor serves (workers/workspace.py): a
    processor here refuses an agent whose workspace another host made and this host lacks."""
    from shared.storage.schema import open_database

    try:
        db = open_database(settings.database_url, create=False)
    except Exception:
        return []  # the database check says why
    host = host_of(settings.processor.worker_id) if settings.processor.worker_id else this_host()
    found: list[Check] = []
    try:
        for agent in settings.processor.agents or sorted(settings.agents):
            try:
                record = workspace_record(db, agent)
            except Exception:
                return []  # no schema yet: nothing has run anywhere
            try:
                check_workspace(settings, agent, host, record)
            except WorkspaceElsewhere as elsewhere:
                found.append(
                    Check(
                        "agents",
                        f"agent {agent} workspace",
                        "warn",
                        f"made on host {elsewhere.made_on}, not here ({elsewhere.path}): a processor on "
                        f"{host} refuses {agent}'s messages, each with a note to the chat",
                        f"copy the folder here, set workspace_shared = true in [agents.{agent}], or leave "
                        f"{agent} out of this host's [processor] agents (docs/restarts.md)",
                    )
                )
    finally:
        db.close()
    return found


def _limits(settings: Settings) -> list[Check]:
    """Each agent's limits and how this host holds a run to them (workers/limits.py), found the way the
    processor finds it: from this process's own cgroups (the processor, started the same way, has the same)."""
    if not settings.agents:
        return []
    if not sys.platform.startswith("linux"):
        return [Check("agents", "limits", "warn", "agents' limits are not enforced: they need Linux")]
    held = find_place()
    mode = (settings.env.get("AGENTPOST_SANDBOX") or settings.processor.sandbox).strip()
    try:
        plan = choose_sandbox(mode, create_user=False)  # type: ignore[arg-type]
        # A root processor creates the sandbox user at its start (see _sandbox).
        sandboxed = plan.kind != "none" or (runs_as_root() and "does not exist" in plan.reason)
    except SandboxError:
        sandboxed = True  # the processor refuses to start without it (the sandbox check says so)
    found: list[Check] = []
    lift = ""
    if not sandboxed and runs_as_root():
        lift = "as root: a run can leave or rewrite its cgroup and raise its rlimits"
    elif not sandboxed and held.place is not None:
        lift = "as agentpost's own user, who owns the runs' cgroups: a run can rewrite or leave its cgroup"
    if lift:
        found.append(
            Check(
                "agents",
                "limits without a sandbox",
                "warn",
                f"agents run unconfined {lift}",
                'install bubblewrap and leave [processor] sandbox = "auto"',
            )
        )
    if held.place is not None:
        how = f"memory and processes by {held.place.describe}"
    else:
        shared_by = f"the user {SANDBOX_USER}" if runs_as_root() and sandboxed else "agentpost's own user"
        how = (
            f"no cgroup can be made here ({held.why_not}), so rlimits: memory as each process's address space "
            "(RLIMIT_AS: a run of many processes can use more in all), processes counted over every process of "
            f"{shared_by} (RLIMIT_NPROC is per user: every agent's runs share one count"
            + (", and a root service's unsandboxed runs are not held to it" if runs_as_root() else "")
            + ")"
        )
        found.append(
            Check(
                "agents",
                "limits",
                "warn",
                how,
                "run the processor as root, or under systemd with Delegate=memory pids and "
                "DelegateSubgroup=processor (deploy/agentpost-processor.service)",
            )
        )
    disk = "the size of each file a run writes by RLIMIT_FSIZE (not the total it writes: that needs a quota)"
    if held.place is not None:
        found.append(Check("agents", "limits", "ok", f"runs are held to their limits: {how}; {disk}"))
    for name, agent in sorted(settings.agents.items()):
        limits = agent.limits
        found.append(
            Check(
                "agents",
                f"agent {name} limits",
                "ok",
                f"memory {size_words(limits.memory)}, {limits.processes} processes, files up to "
                f"{size_words(limits.disk)} ({held.way})",
            )
        )
    return found


def _asks(settings: Settings) -> list[Check]:
    """Agents with ``permission_mode = "ask"``: claude asks the person in the chat before a tool runs
    (tests/e2e/test_approvals_processes.py shows it); no other provider can."""
    found: list[Check] = []
    timeout = settings.processor.approval_timeout_seconds
    for name, agent in sorted(settings.agents.items()):
        if agent.permission_mode != "ask":
            continue
        if agent.provider == "claude":
            found.append(
                Check(
                    "agents",
                    f"agent {name} asks",
                    "ok",
                    "asks the person who sent the message before a tool runs that Claude Code would ask "
                    f"about; no answer within {timeout:g} s is a denial",
                )
            )
            continue
        what = (
            "runs codex read-only (it cannot write or run what it would ask about)"
            if agent.provider == "codex"
            else "runs its command without asking anyone"
        )
        found.append(
            Check(
                "agents",
                f"agent {name} asks",
                "fail",
                f'permission_mode = "ask" is not available for {agent.provider} agents: {name} {what}',
                'use a claude agent for "ask", or another permission_mode',
            )
        )
    return found


def checks(settings: Settings) -> list[Check]:
    """One finding per agent's CLI, plus the Claude login when any agent uses Claude, the sandbox and the
    limits."""
    found: list[Check] = _sandbox(settings) if settings.agents else []
    found += _limits(settings)
    found += _workspaces(settings)
    found += _warm(settings)
    found += _asks(settings)
    login_checked = False
    for name, agent in sorted(settings.agents.items()):
        env = child_env(dict(settings.env), agent)
        request = RunRequest(
            agent=name, settings=agent, workspace=settings.workspace(name), prompt="", env=env
        )
        facts = PROVIDER_FACTS[agent.provider]
        # A kind without a binary of its own (command) runs the program its argv names.
        binary = facts.binary or agent.command[0]
        try:
            path = find_binary(binary, request, facts.binary_env or "_UNUSED")
        except ProviderError as exc:
            found.append(
                Check(
                    "agents",
                    f"agent {name} ({agent.provider})",
                    "fail",
                    str(exc),
                    "install the CLI or point the agent at it",
                )
            )
            continue
        if not os.access(path, os.X_OK):
            found.append(Check("agents", f"agent {name}", "fail", f"{path} is not executable"))
            continue
        found.append(Check("agents", f"agent {name} ({agent.provider})", "ok", f"CLI at {path}"))
        found.extend(_privacy(name, agent, settings, env))
        if agent.provider == "claude" and not login_checked:
            login_checked = True
            missing = _claude_login(env)
            found.append(missing or Check("agents", "claude login", "ok", "credentials or API key present"))
    return found
