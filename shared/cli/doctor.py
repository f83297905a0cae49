"""``agentpost doctor``: check settings, database, agents' CLIs, channels and security; say what to fix.

The core checks live here. Process kinds add their own through the ``agentpost.doctor`` entry-point group
(``name = "module:function"``, ``function(settings) -> list[Check]``), so `shared` stays independent of
``workers`` and ``adapters``.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Literal

from shared.private_files import loose_modes, sqlite_files
from shared.settings import api_token
from shared.settings.model import AgentSettings, Settings, SettingsError, load_settings
from shared.storage import schema
from shared.storage.dialect import sqlite_path
from shared.storage.statuses import PairingStatus

Level = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One finding: what was checked, how it went, and what to do about it."""

    area: str
    name: str
    level: Level
    detail: str
    fix: str = ""


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_settings(home: Path | None) -> tuple[Settings | None, list[Check]]:
    try:
        settings = load_settings(home)
    except SettingsError as exc:
        # The fix says what the error is about: the keys it names, a TOML line, an environment variable.
        return None, [Check("settings", "settings.toml", "fail", str(exc), exc.fix)]
    where = settings.path if settings.path.exists() else f"{settings.path} (absent: all defaults)"
    return settings, [Check("settings", "settings.toml", "ok", f"valid: {where}")]


def check_database(settings: Settings) -> list[Check]:
    from shared.storage.models import SCHEMA_VERSION
    from shared.storage.schema import open_database

    try:
        db = open_database(settings.database_url, create=False)
        try:
            version = schema.recorded_schema_version(db)
        finally:
            db.close()
    except Exception as exc:
        return [
            Check(
                "database",
                settings.database_url,
                "fail",
                f"cannot open or read: {exc}".splitlines()[0],
                "check database.url / AGENTPOST_DATABASE_URL, or run `agentpost init`",
            )
        ]
    if version is None or int(version) != SCHEMA_VERSION:
        return [
            Check(
                "database", settings.database_url, "warn", f"schema version {version}", "run `agentpost init`"
            )
        ]
    return [Check("database", settings.database_url, "ok", f"reachable, schema version {version}")]


def _size_words(n: int) -> str:
    if n < 1000:
        return f"{n:,} bytes"
    value, units = float(n) / 1000, ["kB", "MB", "GB"]
    while value >= 1000 and len(units) > 1:
        value, units = value / 1000, units[1:]
    return f"{value:,.1f} {units[0]}"


def check_table_sizes(settings: Settings) -> list[Check]:
    """Each table's rows (and bytes on PostgreSQL), so an operator sees what grows and whether
    ``[retention]`` keeps up."""
    from shared.reads.table_sizes import table_sizes
    from shared.storage.schema import open_database

    db = open_database(settings.database_url, create=False)
    try:
        sizes = table_sizes(db)
    finally:
        db.close()
    parts = [
        f"{s.table} {s.rows:,} row{'' if s.rows == 1 else 's'}"
        + (f" ({_size_words(s.bytes)})" if s.bytes is not None else "")
        for s in sizes
    ]
    # [retention] in settings.toml sets how long each kind of history stays.
    return [Check("database", "table sizes", "ok", "; ".join(parts))]


#: Failed deliveries within this window are reported by :func:`check_deliveries`.
FAILED_DELIVERY_WINDOW_MS = 7 * 24 * 3600 * 1000


def check_pairings(settings: Settings) -> list[Check]:
    """Senders waiting for an operator to approve their pairing code (their messages are kept meanwhile)."""
    from shared.chat.pairings import list_pairings
    from shared.clock import now_ms
    from shared.storage.schema import open_database

    try:
        db = open_database(settings.database_url, create=False)
    except Exception:
        return []
    try:
        now = now_ms()
        waiting = [p for p in list_pairings(db) if p.status == PairingStatus.PENDING and not p.expired(now)]
    finally:
        db.close()
    if not waiting:
        return [Check("channels", "pairing requests", "ok", "nobody is waiting for approval")]
    shown = "; ".join(
        f"{p.channel} {p.sender or p.sender_id} ({p.sender_id}) code {p.code}" for p in waiting[:5]
    )
    return [
        Check(
            "channels",
            "pairing requests",
            "warn",
            f"{len(waiting)} sender(s) waiting for approval: {shown}",
            "agentpost pairing approve CODE (or revoke them with agentpost pairing revoke CHANNEL SENDER_ID)",
        )
    ]


def check_deliveries(settings: Settings) -> list[Check]:
    """Replies the chat platforms refused for good in the last week (their users were not reached)."""
    from shared.clock import now_ms
    from shared.queue.core import Queue
    from shared.storage.schema import open_database

    try:
        db = open_database(settings.database_url, create=False)
    except Exception:
        return []  # check_database already says why
    try:
        queue = Queue(db)
        since = now_ms() - FAILED_DELIVERY_WINDOW_MS
        failed = queue.responses.failed_response_count(since_ms=since)
        recent = queue.responses.failed_responses(since_ms=since, limit=3) if failed else []
    except Exception as exc:
        return [Check("delivery", "failed replies", "warn", f"could not be read: {exc}".splitlines()[0])]
    finally:
        db.close()
    if not failed:
        return [
            Check("delivery", "failed replies", "ok", "no reply failed to be delivered in the last 7 days")
        ]
    examples = "; ".join(f"{r.channel} {r.message_id}: {(r.last_error or '')[:120]}" for r in recent)
    return [
        Check(
            "delivery",
            "failed replies",
            "warn",
            f"{failed} repl{'y' if failed == 1 else 'ies'} could not be delivered in the last 7 days "
            f"(latest: {examples})",
            "see `agentpost trace <message id>`; each user is told the next time they write in that chat",
        )
    ]


def check_budgets(settings: Settings) -> list[Check]:
    """A line per sender or agent over a ``[budgets]`` limit now (their messages are not run), or one
    saying no one is."""
    from shared.clock import now_ms
    from shared.reads.budget_status import any_limit, over_budget_now
    from shared.storage.schema import open_database

    try:
        db = open_database(settings.database_url, create=False)
    except Exception:
        return []  # check_database already says why
    try:
        over = over_budget_now(db, settings.budgets, settings.agents, now_ms())
    except Exception as exc:
        return [Check("budgets", "spending", "warn", f"could not be read: {exc}".splitlines()[0])]
    finally:
        db.close()
    if not over:
        detail = (
            "no one over budget" if any_limit(settings.budgets) else "no one over budget (no limit is set)"
        )
        return [Check("budgets", "spending", "ok", detail)]
    return [
        Check(
            "budgets",
            f"{o.whose} {o.who}",
            "warn",
            f"over budget: {o.summary()}; "
            + ("their messages are not run" if o.whose == "sender" else "its messages are not run"),
            f"wait for the reset, or raise {o.setting} in settings.toml"
            + (" (or add them to budgets.exempt_senders)" if o.whose == "sender" else ""),
        )
        for o in over
    ]


def check_channel_health(settings: Settings) -> list[Check]:
    """How each channel adapter that has run is connected: up, retrying an unreachable platform, stopped."""
    from shared.chat.health import read_from_settings

    found = []
    for health in read_from_settings(settings) or []:
        detail = f"adapter {health.describe()}"
        if health.adapter_gone:
            level: Level = "warn"
            fix = f"start it: agentpost run {health.channel} (or agentpost up)"
        elif health.state == "retrying":
            level, fix = "fail", "check the network, the platform's status and the channel's API address"
        elif health.state == "stopped" and health.error:
            level, fix = "warn", f"see the {health.channel} adapter's log; start it again when fixed"
        else:
            level, fix = "ok", ""
        found.append(Check("connection", health.channel, level, detail, fix))
    return found


def check_security(settings: Settings) -> list[Check]:
    found: list[Check] = []
    host = settings.api.host
    try:
        open_api = api_token.resolve(settings).source is api_token.Source.OPEN
    except SettingsError:
        open_api = False  # an unreadable token file: the API token check says so
    if not is_loopback(host) and open_api:
        found.append(
            Check(
                "security",
                "web API address",
                "fail",
                f"listening on {host} without a token: anyone who can reach it can run your agents",
                'remove api.allow_open_loopback (a token is then made), or set api.host = "127.0.0.1"',
            )
        )
    elif not is_loopback(host):
        found.append(
            Check(
                "security",
                "web API address",
                "warn",
                f"listening on {host} (token set)",
                "put it behind TLS (a reverse proxy) if it leaves this network",
            )
        )
    else:
        found.append(
            Check("security", "web API address", "ok", f"loopback only ({host}:{settings.api.port})")
        )
    found.append(check_api_token(settings))
    found += check_file_modes(settings)
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    for name, agent in sorted(settings.agents.items()):
        if agent.permission_mode == "bypassPermissions" and root and agent.provider == "claude":
            found.append(_root_bypass(settings, name, agent))
        elif agent.permission_mode == "bypassPermissions":
            found.append(
                Check(
                    "security",
                    f"agent {name}",
                    "warn",
                    "permission_mode = bypassPermissions: the agent may run any command without asking",
                    "use acceptEdits unless the workspace is a sandbox",
                )
            )
    return found


def _root_bypass(settings: Settings, name: str, agent: AgentSettings) -> Check:
    """Root + bypassPermissions: the claude CLI refuses it ("cannot be used with root/sudo privileges")
    unless IS_SANDBOX is exactly 1 in its environment (``yes``, ``true``, ``0`` are refused alike), which the
    processor sets for such an agent, replacing any other value (``workers.agent_env.sandbox_override``)."""
    value = agent.env.get("IS_SANDBOX", settings.env.get("IS_SANDBOX"))
    fix = (
        "run agentpost as a non-root service user (the systemd units in deploy/systemd do: "
        "User=agentpost), or use permission_mode = acceptEdits; keep IS_SANDBOX=1 only on a throwaway "
        "sandbox (a container or VM)"
    )
    if value == "1":
        how = "IS_SANDBOX=1 is set"
    elif value is None:
        how = "agentpost sets IS_SANDBOX=1 for its CLI"
    else:
        how = f"agentpost sets IS_SANDBOX=1 for its CLI, replacing IS_SANDBOX={value}, which the CLI refuses"
    return Check(
        "security",
        f"agent {name}",
        "warn",
        "running as root with permission_mode = bypassPermissions: the claude CLI refuses that unless "
        f"IS_SANDBOX=1 says the machine is a sandbox; {how}, so the agent may run any command as root",
        fix,
    )


def check_api_token(settings: Settings) -> Check:
    """Whether the management API asks for a token: an agent's commands run on this machine, and without
    one they could turn their own sandbox off through it."""
    try:
        token = api_token.resolve(settings)
    except SettingsError as exc:
        return Check("security", "API token", "fail", str(exc), exc.fix)
    if token.source is api_token.Source.OPEN:
        return Check(
            "security",
            "API token",
            "warn",
            "the API asks for no token (api.allow_open_loopback = true): every program on this machine, "
            "agents' commands included, can change settings (an agent's sandbox too), add agents and read "
            "every conversation",
            "remove api.allow_open_loopback from settings.toml and run `agentpost restart web`: a token is "
            "made, and `agentpost token` prints the dashboard's sign-in link",
        )
    if token.source is api_token.Source.MISSING:
        detail = "the API asks for a token (made in api-token at the web process's first start)"
    elif token.source is api_token.Source.FILE:
        detail = f"the API asks for a token (in {token.path})"
    else:
        detail = f"the API asks for a token (from {token.source.value})"
    return Check("security", "API token", "ok", detail)


def check_file_modes(settings: Settings) -> list[Check]:
    """The home folder, settings, database and archives must be private to the service user."""
    home = settings.home
    paths = [home, settings.path, api_token.token_path(home), home / "dlq", home / "logs", home / "files"]
    if settings.database_url.startswith("sqlite"):
        paths += sqlite_files(Path(sqlite_path(settings.database_url)))
    paths += sorted((home / "dlq").glob("*.jsonl")) if (home / "dlq").is_dir() else []
    loose = loose_modes(paths)
    if not loose:
        return [Check("security", "file modes", "ok", "home, settings, database and archives are private")]
    shown = ", ".join(f"{p} ({oct(mode)[2:]})" for p, mode in loose[:6])
    return [
        Check(
            "security",
            "file modes",
            "warn",
            f"readable by other users: {shown}",
            f"chmod -R go-rwx {home}",
        )
    ]


def run_checks(home: Path | None = None) -> list[Check]:
    """Every check, core first, then the plugins'."""
    settings, found = check_settings(home)
    if settings is None:
        return found
    database = check_database(settings)
    found += database
    if all(c.level == "ok" for c in database):
        found += check_table_sizes(settings)
        found += check_deliveries(settings)
        found += check_pairings(settings)
        found += check_budgets(settings)
        found += check_channel_health(settings)
    found += check_security(settings)
    for ep in entry_points(group="agentpost.doctor"):
        try:
            plugin: Callable[[Settings], Iterable[Check]] = ep.load()
            found += list(plugin(settings))
        except Exception as exc:  # one broken plugin must not hide the other findings
            found.append(Check("doctor", ep.name, "warn", f"check could not run: {exc}"))
    return found
