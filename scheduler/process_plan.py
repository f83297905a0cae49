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
from shared.settings.providers import PROVIDER_FACTS, ProviderFacts

#: The variables each bundled channel needs (its settings model says); a third-party channel class may
#: declare ``required_env``.
CHANNEL_ENV: dict[str, tuple[str, ...]] = {
    name: model.required_env for name, model in BUILTIN_CHANNELS.items()
}
#: Per bundled channel, variables of which at least one must be set too (Slack: Socket Mode's app token or
#: the Events API's signing secret).
CHANNEL_ONE_OF: dict[str, tuple[str, ...]] = {
    name: model.one_of_env for name, model in BUILTIN_CHANNELS.items() if model.one_of_env
}
#: Variables every process reads (settings overrides, TinyAGI's port alias), managed per process by `up`.
COMMON_PREFIXES = ("AGENTPOST_", "TINYAGI_")
#: Variables the processor's agents read (provider logins and switches): each kind's ``up_env_prefixes``.
PROVIDER_PREFIXES = tuple(
    dict.fromkeys(prefix for facts in PROVIDER_FACTS.values() for prefix in facts.up_env_prefixes)
)
#: Variables by name that agents' CLIs read (``CLOUD_ML_REGION``, ``DISABLE_TELEMETRY``, …): each kind's
#: ``env_names``; without them an agent's CLI under `up` would miss what it gets when run by hand.
PROVIDER_NAMES = tuple(sorted({name for facts in PROVIDER_FACTS.values() for name in facts.env_names}))
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
            names = PROVIDER_NAMES if name == "processor" else ()
            plan.programs.append(Program(name, _argv(name), prefixes, names))
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
        one_of = CHANNEL_ONE_OF.get(ep.name, ())
        if one_of and not any(env.get(v) for v in one_of):
            plan.missing.append(f"{ep.name}: not started, set {' or '.join(one_of)} in the environment")
            continue
        if cls is None:
            cls, error = _loads(ep)
        if cls is None:
            plan.missing.append(f"{ep.name}: not started, the channel plugin fails to import ({error})")
            continue
        # A channel reads its own variables (TELEGRAM_API_BASE_URL as well as the token).
        prefixes = (*COMMON_PREFIXES, f"{ep.name.upper()}_")
        plan.programs.append(Program(ep.name, _argv(ep.name), prefixes, (*needed, *one_of)))
    plan.providers = provider_problems(settings, env)
    return plan


# -- providers ----------------------------------------------------------------------------------------------
def find_cli(facts: ProviderFacts, env: Mapping[str, str]) -> str | None:
    """A provider's CLI, where the processor looks for it: ``$binary_env`` (``AGENTPOST_CLAUDE_BIN``), on
    PATH, or in the project (``node_modules/.bin/claude``)."""
    configured = env.get(facts.binary_env)
    if configured and os.access(configured, os.X_OK):
        return configured
    found = shutil.which(facts.binary, path=env.get("PATH"))
    if found:
        return found
    for root in (Path.cwd(), REPO_ROOT):
        candidate = root / "node_modules" / ".bin" / facts.binary
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _user_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or Path.home())


def _logged_in(facts: ProviderFacts, env: Mapping[str, str]) -> bool:
    if not facts.login_env and not facts.login_files:
        return True  # nothing to log in to
    home = _user_home(env)
    return any(env.get(k) for k in facts.login_env) or any((home / f).is_file() for f in facts.login_files)


def provider_problems(settings: Settings, env: Mapping[str, str]) -> list[str]:
    """One plain sentence per agent whose CLI is missing or not logged in (what to look for is each kind's
    facts, :mod:`shared.settings.providers`)."""
    problems = []
    for name, agent in sorted(settings.agents.items()):
        merged = {**env, **agent.env}
        facts = PROVIDER_FACTS.get(agent.provider)
        if facts is None:
            continue
        if not facts.binary:
            # The agent's argv names the program (a command agent).
            program = agent.command[0] if agent.command else ""
            if (
                program
                and shutil.which(program, path=merged.get("PATH")) is None
                and not Path(program).is_file()
            ):
                problems.append(f"agent {name} ({agent.provider}): {program!r} was not found")
            continue
        if agent.command:
            pass  # the agent names its own binary; the processor reports it if that is wrong
        elif find_cli(facts, merged) is None:
            problems.append(f"agent {name} ({agent.provider}): {facts.not_found}")
        if not _logged_in(facts, merged):
            problems.append(f"agent {name} ({agent.provider}): not logged in; {facts.login_hint}")
    return problems
