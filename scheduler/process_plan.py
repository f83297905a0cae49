"""What `agentpost up` would run: the process kinds, the channels whose settings and variables are there, and
what is missing for an agent's CLI — worked out from the settings and the environment, before anything starts.

:func:`plan_processes` gives the programs to supervise and the reasons for each one left out; the variable
prefixes here also say which secrets each process is given (:mod:`scheduler.supervise`).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from shared.settings.channels import BUILTIN_CHANNELS
from shared.settings.model import Settings

#: The variables each bundled channel needs (its settings model says); a third-party channel class may
#: declare ``required_env``.
CHANNEL_ENV: dict[str, tuple[str, ...]] = {
    name: model.required_env for name, model in BUILTIN_CHANNELS.items()
}
#: Variables every process reads (settings overrides, TinyAGI's port alias), managed per process by `up`.
COMMON_PREFIXES = ("AGENTPOST_", "TINYAGI_")
#: Variables the processor's agents read (provider logins and CLI locations).
PROVIDER_PREFIXES = ("ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_", "AWS_")
#: The order processes are listed and started in.
CORE_ORDER = ("processor", "scheduler", "web")
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Program:
    """One process under supervisord, and the environment variables `up` passes to it (by prefix and by
    name) from the shell it runs in."""

    name: str
    argv: list[str]
    env_prefixes: tuple[str, ...] = COMMON_PREFIXES
    env_names: tuple[str, ...] = ()


@dataclass
class Plan:
    """What `up` will run, and why anything else will not."""

    programs: list[Program] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.programs]


def _argv(kind: str) -> list[str]:
    return [sys.executable, "-m", "shared.cli.main", "run", kind]


def _loads(ep: Any) -> tuple[Any | None, str]:
    try:
        return ep.load(), ""
    except Exception as exc:  # an uninstalled or broken plugin is reported, never fatal
        return None, f"{type(exc).__name__}: {exc}"


def _channel_enabled(settings: Settings, name: str) -> bool:
    table = settings.file.channels.get(name)
    return not (isinstance(table, Mapping) and table.get("enabled") is False)


def plan_processes(settings: Settings, env: Mapping[str, str]) -> Plan:
    """Every process kind that is installed and configured, and plain notes about the rest."""
    plan = Plan()
    kinds = {ep.name: ep for ep in entry_points(group="agentpost.processes")}
    for name in sorted(kinds, key=lambda n: (CORE_ORDER.index(n) if n in CORE_ORDER else 99, n)):
        target, error = _loads(kinds[name])
        if target is None:
            plan.missing.append(f"{name}: not started, it is not installed or fails to import ({error})")
        else:
            prefixes = COMMON_PREFIXES + (PROVIDER_PREFIXES if name == "processor" else ())
            plan.programs.append(Program(name, _argv(name), prefixes))
    for ep in sorted(entry_points(group="agentpost.channels"), key=lambda e: e.name):
        if ep.name in kinds:
            continue
        if not _channel_enabled(settings, ep.name):
            plan.missing.append(f"{ep.name}: disabled in settings (channels.{ep.name}.enabled = false)")
            continue
        needed = CHANNEL_ENV.get(ep.name)
        cls, error = (None, "") if needed else _loads(ep)
        if needed is None:
            needed = tuple(getattr(cls, "required_env", ()) or ())
        unset = [v for v in needed if not env.get(v)]
        if unset:
            plan.missing.append(f"{ep.name}: not started, set {' and '.join(unset)} in the environment")
            continue
        if cls is None:
            cls, error = _loads(ep)
        if cls is None:
            plan.missing.append(f"{ep.name}: not started, the channel plugin fails to import ({error})")
            continue
        # A channel reads its own variables (TELEGRAM_API_BASE_URL as well as the token).
        prefixes = (*COMMON_PREFIXES, f"{ep.name.upper()}_")
        plan.programs.append(Program(ep.name, _argv(ep.name), prefixes, tuple(needed)))
    plan.providers = provider_problems(settings, env)
    return plan


# -- providers ----------------------------------------------------------------------------------------------
def find_claude(env: Mapping[str, str]) -> str | None:
    """The claude CLI: ``$AGENTPOST_CLAUDE_BIN``, on PATH, or in the project (``node_modules/.bin/claude``)."""
    configured = env.get("AGENTPOST_CLAUDE_BIN")
    if configured and os.access(configured, os.X_OK):
        return configured
    found = shutil.which("claude", path=env.get("PATH"))
    if found:
        return found
    for root in (Path.cwd(), REPO_ROOT):
        candidate = root / "node_modules" / ".bin" / "claude"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _user_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or Path.home())


def provider_problems(settings: Settings, env: Mapping[str, str]) -> list[str]:
    """One plain sentence per agent whose CLI is missing or not logged in."""
    problems = []
    for name, agent in sorted(settings.agents.items()):
        merged = {**env, **agent.env}
        if agent.provider == "claude":
            if agent.command:
                pass  # the agent names its own binary; the processor reports it if that is wrong
            elif find_claude(merged) is None:
                problems.append(
                    f"agent {name} (claude): the claude CLI was not found; run `make install` (it installs "
                    "node_modules/.bin/claude) or `npm install -g @anthropic-ai/claude-code`"
                )
            keys = ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN")
            logged_in = (
                any(merged.get(k) for k in keys)
                or (_user_home(merged) / ".claude" / ".credentials.json").is_file()
            )
            if not logged_in:
                problems.append(
                    f"agent {name} (claude): not logged in; run `claude` once and log in "
                    "(~/.claude/.credentials.json) or set ANTHROPIC_API_KEY in the environment"
                )
        elif agent.provider == "codex":
            if shutil.which("codex", path=merged.get("PATH")) is None:
                problems.append(f"agent {name} (codex): the codex CLI was not found on PATH")
            if (
                not merged.get("OPENAI_API_KEY")
                and not (_user_home(merged) / ".codex" / "auth.json").is_file()
            ):
                problems.append(
                    f"agent {name} (codex): not logged in; run `codex login` or set OPENAI_API_KEY"
                )
        elif agent.provider == "command" and agent.command:
            program = agent.command[0]
            if shutil.which(program, path=merged.get("PATH")) is None and not Path(program).is_file():
                problems.append(f"agent {name} (command): {program!r} was not found")
    return problems
