"""`agentpost up | status | down`: every enabled process under supervisord, for a single machine.

`up` writes ``$AGENTPOST_HOME/run/supervisord.conf`` and starts supervisord (or updates a running one). It
starts what can run and says plainly what cannot: a process kind that is not installed, a channel whose token
is not in the environment (which variable), an agent whose CLI is missing or not logged in. Each process runs
as ``python -m shared.cli.main run NAME`` with ``autorestart``, so a process that dies (even by SIGKILL) is started
again; the queue's leases make that lose nothing.

`up` returns only once each process is really up or has failed: supervisord calls a process RUNNING once it
has stayed up for ``startsecs``, and the web process must in addition be the one listening on its port
(another program on that port would otherwise make the dashboard address look fine). A process that dies
during its start is stopped rather than left restart-looping, and its cause (the last line it logged) is
returned for `up` to name.

The variables a process reads are passed to it through a file per process read at each start
(:mod:`scheduler.launch`), not taken from supervisord's own environment, which is frozen at the first `up`:
a token added or a port changed before a later `up` reaches the processes it concerns, which that `up`
restarts (supervisord restarts a program whose configuration, here a digest of those values, changed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import xmlrpc.client
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.xmlrpc import SupervisorTransport  # type: ignore[import-untyped]

from scheduler import launch
from scheduler.process_plan import CHANNEL_ENV, CHANNEL_ONE_OF, COMMON_PREFIXES, PROVIDER_PREFIXES, Program
from shared import port_owner
from shared.settings.model import Settings


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


def env_file(p: Paths, name: str) -> Path:
    """The file holding the variables `up` passes to process ``name`` (read by :mod:`scheduler.launch`)."""
    return p.run / "env" / f"{name}.json"


#: Variables that belong to some agentpost process (a channel's token, a provider's key). A process gets
#: only its own: the rest are removed from what supervisord hands it, since supervisord's environment is
#: the whole shell of the first `up`, every secret included.
WITHHELD_PREFIXES = (*COMMON_PREFIXES, *PROVIDER_PREFIXES, *(f"{c.upper()}_" for c in CHANNEL_ENV))
#: Variables of a common prefix that only one process may hold. The API token lets whoever holds it drive
#: the management API (turn an agent's sandbox off, add agents), so it goes to the web process alone: the
#: processor's agents and the channels never see it. (The web process finds the home's token file itself
#: when the variable is not set.)
OWN_VARIABLES = {"AGENTPOST_API_TOKEN": "web"}


def withheld_from(programs: list[Program]) -> tuple[list[str], list[str]]:
    """The prefixes and names of every variable some process of ``programs`` (or a bundled channel, or a
    provider) reads: what :mod:`scheduler.launch` removes from a process unless they are its own."""
    prefixes = {*WITHHELD_PREFIXES, *(pre for prog in programs for pre in prog.env_prefixes)}
    names = {
        *(n for needed in (*CHANNEL_ENV.values(), *CHANNEL_ONE_OF.values()) for n in needed),
        *(n for g in programs for n in g.env_names),
    }
    return sorted(prefixes), sorted(names)


def env_spec(
    p: Paths, prog: Program, env: Mapping[str, str], withheld: tuple[list[str], list[str]] = ([], [])
) -> dict[str, Any]:
    """What :mod:`scheduler.launch` sets for ``prog``: its variables as they are in ``env`` (an unset one is
    removed from the process's environment), and this home; and what it removes (``withheld``: the
    other processes' variables, see :func:`withheld_from`)."""
    managed = tuple(prog.env_prefixes)
    names = sorted(set(prog.env_names))
    values = {
        k: v
        for k, v in sorted(env.items())
        if (k.startswith(managed) or k in names) and OWN_VARIABLES.get(k, prog.name) == prog.name
    }
    values["AGENTPOST_HOME"] = str(p.home)
    return {
        "prefixes": sorted({*managed, *withheld[0]}),
        "names": sorted({*names, *withheld[1]}),
        "values": values,
    }


def process_env(p: Paths, name: str, base: Mapping[str, str]) -> dict[str, str]:
    """The environment process ``name`` gets at its next start under the running supervisord: ``base`` with
    the variables the last `up` passed it (``base`` alone when it has none)."""
    spec = _read_spec(env_file(p, name))
    return launch.environment(base, spec) if spec is not None else dict(base)


def web_port(settings: Settings, env: Mapping[str, str]) -> int:
    """The port the web process listens on with ``env``: TinyAGI's ``TINYAGI_API_PORT`` counts when
    ``AGENTPOST_API_PORT`` is unset, as ``agentpost run web`` takes it."""
    alias = env.get("TINYAGI_API_PORT")
    if alias and not env.get("AGENTPOST_API_PORT") and alias.isdigit():
        return int(alias)
    return settings.api.port


def _read_spec(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_private(path: Path, text: str) -> None:
    # Channel tokens and API keys: readable by this user only, and never half-written.
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _digest(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def changed_variables(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """The names of the variables whose value differs between two specs (set, removed or changed)."""
    if old is None:
        return []
    before, after = dict(old.get("values") or {}), dict(new.get("values") or {})
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def render_config(p: Paths, programs: list[Program], digests: Mapping[str, str] | None = None) -> str:
    """The supervisord configuration for ``programs``; ``digests`` (per program, of the variables passed to
    it) make a program's configuration change, and so `supervisorctl update` restart it, when they do."""
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
        if digests and prog.name in digests:
            env += f',AGENTPOST_ENV_DIGEST="{digests[prog.name]}"'
        launch = [sys.executable, "-m", "scheduler.launch", str(env_file(p, prog.name)), prog.name]
        lines += [
            f"[program:{prog.name}]",
            f"command={_esc(shlex.join(launch))}",
            f"directory={_esc(str(p.home))}",
            f"environment={env}",
            "autostart=true",
            "autorestart=true",
            "startsecs=3",
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


@dataclass
class Outcome:
    """How the processes stand once `up` or `restart` has waited for them."""

    states: list[dict[str, Any]]
    #: process -> why it did not start, in one line (it has been stopped, not left restart-looping)
    failed: dict[str, str] = field(default_factory=dict)
    #: process -> the variables whose change made `up` restart it
    env_changed: dict[str, list[str]] = field(default_factory=dict)

    def ready(self, name: str) -> bool:
        return name not in self.failed and any(s["name"] == name for s in self.states)


#: States in which a process has stopped trying or died while starting (BACKOFF: it exited within
#: ``startsecs``; supervisord would keep retrying it).
_FAILED = frozenset({"BACKOFF", "FATAL", "EXITED", "STOPPED", "UNKNOWN"})
_PORT_ADVICE = "set AGENTPOST_API_PORT to a free port or stop that program"
_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d [\d:,.]+ [A-Z]+ [\w.\-]+: ")


def _log_path(p: Paths, name: str) -> Path:
    return p.logs / f"{name}.log"


def _log_sizes(p: Paths, names: list[str]) -> dict[str, int]:
    sizes = {}
    for name in names:
        try:
            sizes[name] = _log_path(p, name).stat().st_size
        except OSError:
            sizes[name] = 0
    return sizes


def last_words(p: Paths, name: str, offset: int) -> str:
    """The line that says why ``name`` stopped, from what it logged after ``offset``: its last ``error:``
    line (the CLI's one-line refusals), else its last line, without the log's timestamp and level."""
    path = _log_path(p, name)
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END) < offset:
                offset = 0  # rotated meanwhile
            f.seek(max(offset, f.tell() - 64_000))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    line = errors[-1].removeprefix("error:").strip() if errors else (lines[-1] if lines else "")
    line = _LOG_PREFIX.sub("", line)
    return line if len(line) <= 300 else line[:299] + "…"


def _serving(state: Mapping[str, Any], web_port: int | None) -> bool:
    """The web process is up when it is the one listening on its port (uvicorn listens only once its
    startup is done); any other process once supervisord calls it RUNNING."""
    if state["name"] != "web" or web_port is None:
        return True
    return any(owner.pid == state.get("pid") for owner in port_owner.listeners(web_port))


def _why(p: Paths, name: str, state: Mapping[str, Any], offset: int, web_port: int | None) -> str:
    said = last_words(p, name, offset)
    if said:
        return said
    if name == "web" and web_port is not None:
        holders = [h for h in port_owner.listeners(web_port) if h.pid != state.get("pid")]
        if holders:
            return f"port {web_port} is in use by {holders[0].describe()}; {_PORT_ADVICE}"
    return f"it stopped while starting ({state['statename']}); see {_log_path(p, name)}"


def settle(
    p: Paths, names: list[str], offsets: Mapping[str, int], *, web_port: int | None, wait_seconds: float
) -> Outcome:
    """Wait until each of ``names`` is up (see :func:`_serving`) or has failed, and stop the failed ones
    (they would only restart-loop). A process has failed when supervisord gives up on it or it exits at
    all while we wait: a start slower than ``startsecs`` is RUNNING before it dies, and supervisord then
    starts it again, so a new pid is the sign of that."""
    deadline = time.monotonic() + wait_seconds
    failed: dict[str, str] = {}
    pids: dict[str, int] = {}

    def give_up(name: str, why: str) -> None:
        failed[name] = why
        with contextlib.suppress(xmlrpc.client.Fault), rpc(p) as server:
            server.supervisor.stopProcess(name, True)

    while True:
        states = {s["name"]: s for s in process_info(p)}
        pending = []
        for name in names:
            state = states.get(name)
            if name in failed or state is None:
                continue
            pid = int(state.get("pid") or 0)
            restarted = pid != 0 and pids.setdefault(name, pid) != pid
            if state["statename"] in _FAILED or restarted:
                give_up(name, _why(p, name, state, offsets.get(name, 0), web_port))
            elif not (state["statename"] == "RUNNING" and _serving(state, web_port)):
                pending.append(name)
        if not pending:
            break
        if time.monotonic() > deadline:
            for name in pending:
                state = states[name]
                if state["statename"] == "RUNNING" and name == "web" and web_port is not None:
                    why = f"it runs but does not listen on port {web_port} after {wait_seconds:g}s"
                    holders = [h for h in port_owner.listeners(web_port) if h.pid != state.get("pid")]
                    if holders:
                        why = f"port {web_port} is in use by {holders[0].describe()}; {_PORT_ADVICE}"
                else:
                    why = f"still {state['statename']} after {wait_seconds:g}s"
                give_up(name, f"{why}; see {_log_path(p, name)}")
            break
        time.sleep(0.1)
    final = process_info(p)  # the failed ones are stopped now
    return Outcome([s for s in final if s["name"] in names], failed)


def _start_stopped(p: Paths, names: list[str]) -> None:
    # `supervisorctl update` starts only new or changed programs; one stopped earlier (a failed start that
    # `up` stopped, or `supervisorctl stop`) is started again by `up` too.
    with rpc(p) as server:
        for s in server.supervisor.getAllProcessInfo():
            if s["name"] in names and s["statename"] in ("STOPPED", "EXITED", "FATAL"):
                with contextlib.suppress(xmlrpc.client.Fault):  # autostarted meanwhile
                    server.supervisor.startProcess(s["name"], False)


def up(
    p: Paths,
    programs: list[Program],
    env: Mapping[str, str],
    *,
    web_port: int | None = None,
    wait_seconds: float = 120.0,
) -> Outcome:
    """Write the config and start supervisord, or make a running one take the new config and environment.
    Returns once each process is up or has failed (``web_port``: where the web process must listen)."""
    if not programs:
        raise SuperviseError("nothing to start: no process kind is installed")
    for d in (p.run, p.logs):
        d.mkdir(parents=True, exist_ok=True)
    running = is_running(p)
    names = [prog.name for prog in programs]
    env_changed: dict[str, list[str]] = {}
    digests: dict[str, str] = {}
    withheld = withheld_from(programs)
    for prog in programs:
        spec = env_spec(p, prog, env, withheld)
        if running and (changed := changed_variables(_read_spec(env_file(p, prog.name)), spec)):
            env_changed[prog.name] = changed
        _write_private(env_file(p, prog.name), json.dumps(spec, indent=1, sort_keys=True))
        digests[prog.name] = _digest(spec)
    p.conf.write_text(render_config(p, programs, digests), encoding="utf-8")
    offsets = _log_sizes(p, names)
    ctl = [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(p.conf)]
    if running:
        out = subprocess.run([*ctl, "update"], capture_output=True, text=True, timeout=120)
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
    while not is_running(p):
        if time.monotonic() > deadline:
            raise SuperviseError(f"supervisord does not answer on {p.sock}")
        time.sleep(0.1)
    try:
        _start_stopped(p, names)
        outcome = settle(
            p, names, offsets, web_port=web_port, wait_seconds=max(deadline - time.monotonic(), 1.0)
        )
    except (OSError, xmlrpc.client.Error) as exc:
        raise SuperviseError(f"supervisord does not answer on {p.sock}: {exc}") from None
    outcome.env_changed = {n: v for n, v in env_changed.items() if n in digests}
    return outcome


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


def restart(
    p: Paths, name: str | None = None, *, web_port: int | None = None, wait_seconds: float = 120.0
) -> Outcome:
    """Restart one program (``name``) or every program under the running supervisord, and return once
    each is up again or has failed (as :func:`up`). A restarted process takes the environment the last
    `agentpost up` passed it. Raises :class:`SuperviseError` with the reason when nothing runs or ``name``
    is not one of its programs."""
    if not is_running(p):
        raise SuperviseError(
            "agentpost is not running, so there is nothing to restart (start it with `agentpost up`)"
        )
    before = {s["name"]: s for s in process_info(p)}
    if name is not None and name not in before:
        known = ", ".join(sorted(before)) or "none"
        raise SuperviseError(f"no process named {name!r} runs under agentpost (running: {known})")
    names = [name] if name is not None else sorted(before)
    offsets = _log_sizes(p, names)
    with rpc(p) as server:
        for each in names:
            # stopProcess waits for the stop (the processor finishes its current runs within its grace
            # period); a process that had already stopped or exited is simply started.
            with contextlib.suppress(xmlrpc.client.Fault):
                server.supervisor.stopProcess(each, True)
            server.supervisor.startProcess(each, False)
    return settle(p, names, offsets, web_port=web_port, wait_seconds=wait_seconds)
