"""The one test-home factory: an agentpost home folder whose ``settings.toml`` is built from plain dicts.

Every tier builds its homes here (the ``*_support`` modules only choose presets): a database URL, agents,
teams, ``[queue]`` / ``[processor]`` / ``[channels]`` tables, and, unless ``fast=False``, the quick test
timings (short leases and backoffs, quick recovery) so a test that waits for a retry waits milliseconds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomlkit

from shared.runtime import Runtime, open_runtime

#: ``[queue]`` timings that keep retries and recovery quick in tests.
FAST_QUEUE: Mapping[str, Any] = {
    "lease_seconds": 3.0,
    "poll_interval_seconds": 1.0,
    "backoff_base_seconds": 0.05,
    "backoff_max_seconds": 0.2,
}
#: ``[processor]`` timings that keep recovery quick in tests.
#: The suite's scripted agents report through files beside their script, which the agent sandbox hides on
#: purpose: test homes run agents unconfined (tests/e2e/test_sandbox.py asks for the sandbox explicitly).
#: Runs start their CLI for each message unless a test keeps it (the tests of warm sessions ask for them),
#: whatever the default of session_idle_seconds is.
FAST_PROCESSOR: Mapping[str, Any] = {
    "recover_interval_seconds": 0.5,
    "sandbox": "none",
    "session_idle_seconds": 0,
}


def scripted_agents(script: Path, names: tuple[str, ...], **extra: Any) -> dict[str, dict[str, Any]]:
    """Agents run by a Python script (``provider = "command"``), each with ``extra`` settings."""
    return {
        name: {"provider": "command", "command": [sys.executable, str(script)], **extra} for name in names
    }


def build_home(
    tmp: Path,
    db_url: str | None,
    agents: Mapping[str, Mapping[str, Any]],
    *,
    teams: Mapping[str, Mapping[str, Any]] | None = None,
    queue: Mapping[str, Any] | None = None,
    processor: Mapping[str, Any] | None = None,
    channels: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    fast: bool = True,
    folder: str = "home",
    default_agent: bool = True,
    toml: str = "",
) -> Path:
    """Write ``tmp/<folder>/settings.toml`` and return the folder.

    ``toml`` is appended as written (tests that check comments survive an edit write it so).
    The first agent is the default one unless ``queue`` names another (or ``default_agent=False``); ``extra`` adds whole tables (e.g.
    ``{"scheduler": {...}}``). With ``fast=False`` only what is given is written (defaults everywhere else).
    """
    home = tmp / folder
    home.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {}
    if db_url:
        data["database"] = {"url": db_url}
    queue_table = {
        **({"default_agent": next(iter(agents))} if agents and default_agent else {}),
        **(FAST_QUEUE if fast else {}),
        **(queue or {}),
    }
    if queue_table:
        data["queue"] = queue_table
    if agents:
        data["agents"] = {name: dict(settings) for name, settings in agents.items()}
    if fast or processor:
        data["processor"] = {**(FAST_PROCESSOR if fast else {}), **(processor or {})}
    if teams:
        data["teams"] = {name: dict(team) for name, team in teams.items()}
    if channels:
        data["channels"] = dict(channels)
    for table, value in (extra or {}).items():
        data[table] = value
    text = tomlkit.dumps(data) + (f"\n{toml}\n" if toml else "")
    (home / "settings.toml").write_text(text, encoding="utf-8")
    return home


def write_settings(home: Path, text: str) -> Path:
    """Write ``text`` as ``home``'s settings.toml (the folder made if missing); return the file's path."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "settings.toml"
    path.write_text(text)
    return path


def update_settings(home: Path, table: str, values: Mapping[str, Any]) -> None:
    """Merge ``values`` into one table of an existing home's settings."""
    path = home / "settings.toml"
    data = tomlkit.parse(path.read_text(encoding="utf-8"))
    if table not in data:
        data[table] = {}
    data[table].update(dict(values))
    path.write_text(tomlkit.dumps(data), encoding="utf-8")


def open_home(home: Path) -> Runtime:
    """Open the runtime of a home folder (environment overrides ignored)."""
    return open_runtime(home, env={"PATH": os.environ.get("PATH", "")})
