"""`agentpost up | status | down`: every enabled process under supervisord, for a single machine.

`up` writes ``$AGENTPOST_HOME/run/supervisord.conf`` and starts supervisord (or updates a running one). It
starts what can run and says plainly what cannot, instead of failing: a process kind that is not installed,
a channel whose token is not in the environment (which variable), an agent whose CLI is missing or not
logged in. Each process runs as ``python -m shared.cli run NAME`` with ``autorestart``, so a process that
dies (even by SIGKILL) is started again; the queue's leases make that lose nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xmlrpc.client
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from supervisor.xmlrpc import SupervisorTransport  # type: ignore[import-untyped]

from shared.settings import Settings

#: The variables each bundled channel needs; a third-party channel class may declare ``required_env``.
CHANNEL_ENV: dict[str, tuple[str, ...]] = {
    "telegram": ("TELEGRAM_BOT_TOKEN",),
    "discord": ("DISCORD_BOT_TOKEN",),
    "whatsapp": (
        "WHATSAPP_ACCESS_TOKEN",
        "WHATSAPP_PHONE_NUMBER_ID",
        "WHATSAPP_APP_SECRET",
        "WHATSAPP_VERIFY_TOKEN",
    ),
}
#: The order processes are listed and started in.
CORE_ORDER = ("processor", "scheduler", "web")
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Program:
    name: str
    argv: list[str]


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
    return [sys.executable, "-m", "shared.cli", "run", kind]


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
            plan.programs.append(Program(name, _argv(name)))
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
        plan.programs.append(Program(ep.name, _argv(ep.name)))
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


# -- supervisord --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Paths:
    home: Path
    run: Path
    logs: Path
    conf: Path
    sock: Path
    pidfile: Path


def paths(home: Path) -> Paths:
    run = home / "run"
    sock = run / "supervisor.sock"
    if len(str(sock)) > 100:  # AF_UNIX paths are limited to ~107 bytes
        digest = hashlib.sha256(str(home).encode()).hexdigest()[:12]
        sock = Path(tempfile.gettempdir()) / f"agentpost-{digest}.sock"
    return Paths(home, run, home / "logs", run / "supervisord.conf", sock, run / "supervisord.pid")


def _esc(value: str) -> str:
    # supervisord expands %(name)s in its config; a literal % must be doubled.
    return value.replace("%", "%%")


def render_config(p: Paths, programs: list[Program]) -> str:
    """The supervisord configuration for ``programs``."""
    lines = [
        "; written by `agentpost up`; edits are overwritten at the next `agentpost up`",
        "[unix_http_server]",
        f"file={_esc(str(p.sock))}",
        "chmod=0700",
        "",
        "[supervisord]",
        f"logfile={_esc(str(p.logs / 'supervisord.log'))}",
        f"pidfile={_esc(str(p.pidfile))}",
        f"childlogdir={_esc(str(p.logs))}",
        f"directory={_esc(str(p.home))}",
        "logfile_maxbytes=10MB",
        "logfile_backups=3",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{_esc(str(p.sock))}",
        "",
    ]
    for prog in programs:
        env = f'AGENTPOST_HOME="{_esc(str(p.home))}",PYTHONUNBUFFERED="1"'
        lines += [
            f"[program:{prog.name}]",
            f"command={_esc(shlex.join(prog.argv))}",
            f"directory={_esc(str(p.home))}",
            f"environment={env}",
            "autostart=true",
            "autorestart=true",
            "startsecs=2",
            "startretries=10",
            "stopsignal=TERM",
            "stopwaitsecs=30",
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={_esc(str(p.logs / (prog.name + '.log')))}",
            "stdout_logfile_maxbytes=10MB",
            "stdout_logfile_backups=3",
            "",
        ]
    return "\n".join(lines)


@contextlib.contextmanager
def rpc(p: Paths) -> Iterator[Any]:
    """An XML-RPC proxy to the supervisord of ``p`` (its socket is closed on exit)."""
    transport = SupervisorTransport(None, None, f"unix://{p.sock}")
    try:
        yield xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)
    finally:
        transport.close()


def is_running(p: Paths) -> bool:
    if not p.sock.exists():
        return False
    try:
        with rpc(p) as server:
            return bool(server.supervisor.getState()["statename"] == "RUNNING")
    except (OSError, xmlrpc.client.Error):
        return False


def process_info(p: Paths) -> list[dict[str, Any]]:
    """supervisord's view of every process (name, statename, pid, description)."""
    with rpc(p) as server:
        info: list[dict[str, Any]] = server.supervisor.getAllProcessInfo()
    return info


class SuperviseError(Exception):
    """supervisord could not be started or reached."""


def up(p: Paths, programs: list[Program], *, wait_seconds: float = 15.0) -> list[dict[str, Any]]:
    """Write the config and start supervisord, or make a running one take the new config. Returns the
    process states once each has started (or given up)."""
    if not programs:
        raise SuperviseError("nothing to start: no process kind is installed")
    for d in (p.run, p.logs):
        d.mkdir(parents=True, exist_ok=True)
    p.conf.write_text(render_config(p, programs), encoding="utf-8")
    ctl = [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(p.conf)]
    if is_running(p):
        out = subprocess.run([*ctl, "update"], capture_output=True, text=True, timeout=60)
        if out.returncode not in (0,):
            raise SuperviseError(f"supervisorctl update failed: {out.stdout}{out.stderr}".strip())
    else:
        if p.sock.exists():
            p.sock.unlink()  # left behind by a supervisord that was killed
        out = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(p.conf)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "AGENTPOST_HOME": str(p.home)},
        )
        if out.returncode != 0:
            raise SuperviseError(f"supervisord did not start: {out.stdout}{out.stderr}".strip())
    deadline = time.monotonic() + wait_seconds
    while True:
        with contextlib.suppress(OSError, xmlrpc.client.Error):
            states = process_info(p)
            settled = all(s["statename"] in ("RUNNING", "FATAL", "EXITED", "STOPPED") for s in states)
            if states and settled:
                return states
        if time.monotonic() > deadline:
            try:
                return process_info(p)
            except (OSError, xmlrpc.client.Error) as exc:
                raise SuperviseError(f"supervisord does not answer on {p.sock}: {exc}") from None
        time.sleep(0.2)


def down(p: Paths, *, wait_seconds: float = 60.0) -> bool:
    """Stop every process and supervisord itself. Returns False when it was not running."""
    if not is_running(p):
        return False
    with rpc(p) as server:
        pid = int(server.supervisor.getPID())
    with contextlib.suppress(OSError, xmlrpc.client.Error), rpc(p) as server:
        server.supervisor.shutdown()
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    raise SuperviseError(f"supervisord (pid {pid}) did not stop within {wait_seconds:g}s")


def restart(p: Paths, name: str | None = None, *, wait_seconds: float = 30.0) -> list[dict[str, Any]]:
    """Restart one program (``name``) or every program under the running supervisord, and return the
    states once each has started again (or given up). Raises :class:`SuperviseError` with the reason
    when nothing runs or ``name`` is not one of its programs."""
    if not is_running(p):
        raise SuperviseError(
            "agentpost is not running, so there is nothing to restart (start it with `agentpost up`)"
        )
    before = {s["name"]: s for s in process_info(p)}
    if name is not None and name not in before:
        known = ", ".join(sorted(before)) or "none"
        raise SuperviseError(f"no process named {name!r} runs under agentpost (running: {known})")
    names = [name] if name is not None else sorted(before)
    with rpc(p) as server:
        for each in names:
            # stopProcess waits for the stop (the processor finishes its current runs within its grace
            # period); a process that had already stopped or exited is simply started.
            with contextlib.suppress(xmlrpc.client.Fault):
                server.supervisor.stopProcess(each, True)
            server.supervisor.startProcess(each, False)
    deadline = time.monotonic() + wait_seconds
    while True:
        states = [s for s in process_info(p) if s["name"] in names]
        settled = all(s["statename"] in ("RUNNING", "FATAL", "EXITED") for s in states)
        if settled or time.monotonic() > deadline:
            return states
        time.sleep(0.1)
