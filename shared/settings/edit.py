"""Editing ``settings.toml`` safely, for the CLI (``agentpost agent add`` …) and the web API alike.

Every edit goes through :func:`edit_settings`: the file is changed with tomlkit (the operator's comments and
layout survive), the whole result is validated with the rules the processes use (every section, the
processor's, the scheduler's and the channels' included: :func:`shared.settings.model.parse_settings`), and only
then is the file replaced atomically. An edit can never leave a settings file that a process would refuse.
Running processes pick the change up by themselves (they re-read an edited settings.toml).

:func:`public_settings` is what may be shown to an API caller: the settings as data with every secret
(tokens, keys, passwords, database URLs with a password) replaced by ``"***"``.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.container import OutOfOrderTableProxy
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import Table as TomlTable
from tomlkit.toml_document import TOMLDocument

from shared.settings.model import SETTINGS_FILE, Settings, SettingsError, parse_settings

REDACTED = "***"
#: Keys whose values are secrets wherever they appear in the settings.
_SECRET_KEY = re.compile(r"(token|secret|password|passwd|api_?key|private|credential|(^|_)key$)", re.I)
_URL_PASSWORD = re.compile(r"(://[^:/@]+:)[^@]+@")


#: A further check of an edit's result (its settings as every process would read them), run before the file
#: is written: raises :class:`SettingsError` to refuse the edit.
Vet = Callable[[Settings], None]


def edit_settings(home: Path, change: Callable[[TOMLDocument], None], vet: Vet | None = None) -> Path:
    """Apply ``change`` to ``home``'s settings.toml (comments kept), validate the result (and ``vet`` it),
    then replace the file atomically. Raises :class:`SettingsError` (file untouched) when the result would
    be invalid or ``vet`` refuses it."""
    path = home / SETTINGS_FILE
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    doc = tomlkit.parse(text)
    change(doc)
    new_text = tomlkit.dumps(doc)
    try:
        result = parse_settings(home, path, new_text, dict(os.environ))
    except SettingsError as exc:
        problems = "; ".join(exc.problems) or str(exc)
        raise SettingsError(f"the change would make {path} invalid: {problems}", fix=exc.fix) from None
    if vet is not None:
        vet(result)
    home.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SETTINGS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(new_text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def table_of(doc: TOMLDocument, key: str) -> TomlTable | OutOfOrderTableProxy:
    """The top-level table ``key`` of ``doc``, created (as a super-table) when missing. A table written in
    several places of the file (``[agents.a]`` … ``[teams.t]`` … ``[agents.a.env]``) comes as tomlkit's
    proxy over its parts, which is edited the same way."""
    if key not in doc:
        doc[key] = tomlkit.table(is_super_table=True)
    table = doc[key]
    if not isinstance(table, TomlTable | OutOfOrderTableProxy):
        raise SettingsError(f"{key!r} in settings.toml must be a table")
    return table


def _entry(values: Mapping[str, Any]) -> TomlTable:
    entry = tomlkit.table()
    for key, value in values.items():
        if value not in ("", None, []):
            entry[key] = value
    return entry


def put_agent(settings: Settings, agent: str, values: Mapping[str, Any], *, vet: Vet | None = None) -> Path:
    """Create or replace ``[agents.<agent>]`` with ``values`` (empty values left out). Raises
    :class:`SettingsError` when a team has that name or the result would be invalid (or ``vet`` refuses it)."""
    if agent in settings.teams:
        raise SettingsError(f"{agent!r} is a team; an agent cannot have the same id")
    implicit_default = settings.queue.default_agent
    declared = dict(settings.file.agents)

    def change(doc: TOMLDocument) -> None:
        agents = table_of(doc, "agents")
        if not declared and implicit_default != agent and implicit_default not in agents:
            # With no [agents] the default agent existed implicitly; keep it once others are declared.
            default = tomlkit.table()
            default["name"] = "Assistant"
            agents[implicit_default] = default
        agents[agent] = _entry(values)

    return edit_settings(settings.home, change, vet)


def remove_agent(settings: Settings, agent: str) -> Path:
    """Remove ``[agents.<agent>]`` (its workspace folder is kept). Raises :class:`KeyError` for an agent
    the file does not declare and :class:`SettingsError` for the default agent or a team member."""
    if agent not in settings.file.agents:
        raise KeyError(agent)
    if agent == settings.queue.default_agent:
        raise SettingsError(
            f"{agent!r} is the default agent (queue.default_agent); choose another default first"
        )
    teams = sorted(t for t, team in settings.teams.items() if agent in team.agents)
    if teams:
        raise SettingsError(f"{agent!r} is a member of team(s) {', '.join(teams)}; remove it from them first")

    def change(doc: TOMLDocument) -> None:
        del table_of(doc, "agents")[agent]

    return edit_settings(settings.home, change)


def put_team(settings: Settings, team: str, *, name: str, agents: list[str], leader: str) -> Path:
    """Create or replace ``[teams.<team>]``. Raises :class:`SettingsError` for unknown members, a leader
    who is not a member, or an agent of the same id."""
    if team in settings.agents:
        raise SettingsError(f"{team!r} is an agent; a team cannot have the same id")
    unknown = [m for m in agents if m not in settings.agents]
    if unknown:
        raise SettingsError(
            f"unknown agent(s) {', '.join(unknown)} (known: {', '.join(sorted(settings.agents))})"
        )
    if not agents:
        raise SettingsError("a team needs at least one agent")
    chosen = leader or agents[0]
    if chosen not in agents:
        raise SettingsError(f"leader {chosen!r} must be one of the members {agents}")

    def change(doc: TOMLDocument) -> None:
        table_of(doc, "teams")[team] = _entry({"name": name, "agents": agents, "leader": chosen})

    return edit_settings(settings.home, change)


def remove_team(settings: Settings, team: str) -> Path:
    """Remove ``[teams.<team>]`` (its agents stay). Raises :class:`KeyError` for an unknown team."""
    if team not in settings.file.teams:
        raise KeyError(team)

    def change(doc: TOMLDocument) -> None:
        del table_of(doc, "teams")[team]

    return edit_settings(settings.home, change)


def merge_settings(settings: Settings, patch: Mapping[str, Any], *, vet: Vet | None = None) -> Path:
    """Merge ``patch`` (nested tables, as read from JSON) into settings.toml: tables are merged key by key,
    other values replaced, ``null`` removes a key. A value equal to ``"***"`` (a redacted secret sent back
    as it was shown) leaves the stored secret as it is. ``vet``: see :func:`edit_settings`."""

    def merge(table: Any, changes: Mapping[str, Any]) -> None:
        for key, value in changes.items():
            if value == REDACTED:
                continue
            if value is None:
                if key in table:
                    del table[key]
            elif isinstance(value, Mapping):
                if key not in table or not isinstance(table[key], dict):
                    table[key] = tomlkit.table()
                merge(table[key], value)
            else:
                table[key] = value

    def change(doc: TOMLDocument) -> None:
        try:
            merge(doc, patch)
        except (TOMLKitError, ValueError, TypeError) as exc:
            raise SettingsError(f"this change cannot be written to settings.toml: {exc}") from None

    try:
        json.dumps(patch, ensure_ascii=False).encode("utf-8")
    except (UnicodeError, ValueError) as exc:
        raise SettingsError(f"the change holds text that cannot be stored: {exc}") from None
    return edit_settings(settings.home, change, vet)


def public_settings(settings: Settings) -> dict[str, Any]:
    """The settings file's content as data, secrets replaced by ``"***"`` (see the module docstring)."""
    path = settings.path
    raw: dict[str, Any] = {}
    if path is not None and Path(path).exists():
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    redacted: dict[str, Any] = _redact(raw)
    return redacted


def _redact(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        if key == "env":  # an agent's environment: its values are typically credentials
            return {k: REDACTED if v not in ("", None) else v for k, v in value.items()}
        return {k: _redact(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, key) for v in value]
    if key and _SECRET_KEY.search(key) and value not in ("", None):
        return REDACTED
    if isinstance(value, str) and "://" in value:
        return _URL_PASSWORD.sub(r"\1***@", value)
    return value


def put_schedules(settings: Settings, entries: list[dict[str, Any]]) -> Path:
    """Replace the ``[[schedules]]`` array with ``entries`` (each a table; empty values left out)."""

    def change(doc: TOMLDocument) -> None:
        array = tomlkit.aot()
        for values in entries:
            array.append(_entry(values))
        if entries:
            doc["schedules"] = array
        elif "schedules" in doc:
            del doc["schedules"]

    return edit_settings(settings.home, change)
