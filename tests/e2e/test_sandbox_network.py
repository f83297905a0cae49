"""The network from inside an agent run, tried as an attacker would: a real processor process runs an agent
that tries PostgreSQL, Redis, agentpost's own API (turning the sandbox off through ``PUT /api/settings``), a
host service's abstract Unix socket, a local server the operator allowed and one it did not — directly and
through the egress proxy. With ``[processor] sandbox = "none"`` the same probe reaches the host's services
(the control: the probe finds what it looks for); in the sandbox only the allowed server answers, and the
refusals are in the message's trace. Then the real claude CLI's Bash tool runs the same probe while the CLI
itself answers through the proxy."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.chat.address import ChatAddress
from tests.e2e.test_sandbox import _as_service_user, _give, _need_bwrap, _service_user, service_tmp
from tests.fakes.anthropic_api import (
    JSON,
    Computed,
    FakeAnthropic,
    Reply,
    ToolUse,
    last_user_text,
    tool_results,
)
from tests.fakes.claude_env import claude_binary, claude_env
from tests.homes import open_home
from tests.probes import free_port, service_unavailable, wait_for
from tests.processor_support import make_home

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as the sandbox user (needs root)"),
]
__all__ = ["service_tmp"]  # the fixture, imported for these tests

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))

#: One line per attempt: NAME VERDICT. Direct attempts say OPEN/CLOSED; through the proxy, the HTTP status.
NET_PROBE = r"""
import json, os, socket, urllib.error, urllib.request

def direct(name, port):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        print(name, "OPEN")
    except OSError:
        print(name, "CLOSED")
    finally:
        s.close()

def abstract(name, address):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("\0" + address)
        print(name, "OPEN")
    except OSError:
        print(name, "CLOSED")
    finally:
        s.close()

proxy = os.environ.get("HTTP_PROXY", "")
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy} if proxy else {}))

def via_proxy(name, url, data=None, method="GET"):
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with opener.open(request, timeout=10) as answer:
            print(name, answer.status, answer.read().decode()[:40].replace(" ", "_"))
    except urllib.error.HTTPError as exc:
        print(name, exc.code)
    except OSError as exc:
        print(name, "CLOSED")

def connect_through(name, host, port):
    if not proxy:
        print(name, "NOPROXY")
        return
    s = socket.create_connection(("127.0.0.1", int(proxy.rsplit(":", 1)[1])), timeout=10)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    print(name, s.recv(64).split(b" ")[1].decode())
    s.close()

env = os.environ
direct("postgres-direct", 5432)
direct("redis-direct", 6379)
direct("api-direct", int(env["AP_API_PORT"]))
abstract("abstract-socket", env["AP_ABSTRACT"])
connect_through("postgres-proxy", "127.0.0.1", 5432)
connect_through("redis-proxy", "localhost", 6379)
api = "http://127.0.0.1:" + env["AP_API_PORT"]
via_proxy("api-settings-proxy", api + "/api/settings", b'{"processor": {"sandbox": "none"}}', "PUT")
via_proxy("allowed-proxy", env["AP_ALLOWED_URL"])
via_proxy("other-proxy", env["AP_OTHER_URL"])
"""

#: What the probe finds from inside a confined run: nothing but the allowed server, through the proxy.
CONFINED = {
    "postgres-direct": "CLOSED",
    "redis-direct": "CLOSED",
    "api-direct": "CLOSED",
    "abstract-socket": "CLOSED",
    "postgres-proxy": "403",
    "redis-proxy": "403",
    "api-settings-proxy": "403",
    "allowed-proxy": "200 hello_from_the_allowed_server",
    "other-proxy": "403",
}
VERDICT_NAMES = {
    "postgres-direct", "redis-direct", "api-direct", "abstract-socket", "postgres-proxy", "redis-proxy",
    "api-settings-proxy", "allowed-proxy", "other-proxy",
}  # fmt: skip


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from the allowed server"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def _http_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _abstract_socket(name: str) -> Iterator[None]:
    """A host service listening on an abstract Unix socket (per network namespace, no file to hide)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("\0" + name)
    listener.listen(4)
    try:
        yield
    finally:
        listener.close()


@contextmanager
def _web(home: Path, env: dict[str, str], prefix: list[str], port: int) -> Iterator[None]:
    """agentpost's own API, as ``agentpost run web`` serves it."""
    proc = subprocess.Popen(
        [*prefix, AGENTPOST, "run", "web"],
        env={**env, "AGENTPOST_API_PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def serving() -> bool:
        assert proc.poll() is None, "agentpost run web exited"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).is_success
        except httpx.HTTPError:
            return False

    try:
        wait_for(serving, 60, "agentpost run web to serve")
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _verdicts(reply: str) -> dict[str, str]:
    found = {}
    for line in reply.splitlines():
        name, _, verdict = line.partition(" ")
        if name in VERDICT_NAMES:
            found[name] = verdict
    assert set(found) == VERDICT_NAMES, reply
    return found


def _net_home(tmp: Path, sandbox: str, allowed: str, probe_env: dict[str, str]) -> Path:
    home = tmp / "home"
    script = tmp / "netprobe.py"
    script.write_text(NET_PROBE)
    script.chmod(0o755)
    allowed_port = allowed.rstrip("/").rsplit(":", 1)[1]
    agents = {
        "prober": {
            "provider": "command",
            "command": ["/usr/bin/python3", str(script)],
            "network": [f"127.0.0.1:{allowed_port}"],
            "env": probe_env,
        }
    }
    built = make_home(tmp, f"sqlite:///{home / 'agentpost.db'}", agents, processor={"sandbox": sandbox})
    assert built == home
    return built


def _run(
    home: Path, env: dict[str, str], prefix: list[str], owner: tuple[int, int] | None
) -> tuple[str, str]:
    """Queue one message to the prober, run a processor until it is answered; (reply, message id)."""
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "probe", agent="prober")
        if owner is not None:
            _give(home, owner)
        log = home.parent / "processor.out"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*prefix, AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
            )

            def replied() -> object:
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                return rt.db.read_scalar(
                    "SELECT message FROM responses WHERE message_id = :m", {"m": sent.message_id}
                )

            try:
                reply = wait_for(replied, 90, "the probe's reply")
            finally:
                proc.kill()
                proc.wait(timeout=10)
    return str(reply), sent.message_id


def _trace(home: Path, env: dict[str, str], message_id: str) -> str:
    done = subprocess.run(
        [AGENTPOST, "trace", message_id], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("sandbox", "service"), [("auto", "root"), ("auto", "service-user"), ("none", "root")]
)
def test_from_inside_a_run_only_the_allowed_server_answers(
    service_tmp: Path, sandbox: str, service: str
) -> None:
    """``service``: the processor runs as root (the run as the sandbox user) or as an unprivileged service
    user (bubblewrap in a user namespace of its own)."""
    _need_bwrap()
    tmp_path = service_tmp
    owner = _service_user() if service == "service-user" else None
    prefix = _as_service_user(*owner) if owner else []
    name = f"agentpost-test-{os.getpid()}-{sandbox}-{service}"
    with _http_server() as allowed, _http_server() as other, _abstract_socket(name):
        api_port = free_port()
        probe_env = {"AP_API_PORT": str(api_port), "AP_ABSTRACT": name, "AP_ALLOWED_URL": allowed,
                     "AP_OTHER_URL": other}  # fmt: skip
        home = _net_home(tmp_path, sandbox, allowed, probe_env)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path),
            "LANG": "C.UTF-8",
            "AGENTPOST_HOME": str(home),
        }
        settings_before = (home / "settings.toml").read_text()
        with _web(home, env, [], api_port):
            reply, message_id = _run(home, env, prefix, owner)
        verdicts = _verdicts(reply)
        if sandbox == "none":
            # The control: without the sandbox the run reaches the host's own services.
            assert {
                verdicts[k] for k in ("postgres-direct", "redis-direct", "api-direct", "abstract-socket")
            } == {"OPEN"}, verdicts
            return
        assert verdicts == CONFINED, verdicts
        assert (home / "settings.toml").read_text() == settings_before  # the sandbox stays on
        trace = _trace(home, env, message_id)
    assert "network_refused" in trace and "host=127.0.0.1:5432" in trace and "host=localhost:6379" in trace, (
        trace
    )
    assert f"host=127.0.0.1:{api_port}" in trace, trace


def _probe_with_bash(body: JSON) -> str | Reply:
    """The scripted model: "probe" runs the network probe in the Bash tool and answers with its output."""
    results = tool_results(body)
    if "probe" in last_user_text(body) and not results:
        return ToolUse("Bash", {"command": "python3 netprobe.py", "description": "Probe the network"})
    return "\n".join(str(r.get("content", "")) for r in results) if results else "hello"


def test_the_claude_cli_answers_through_the_proxy_while_its_bash_reaches_nothing_else(
    service_tmp: Path,
) -> None:
    """The real claude CLI, as root's sandbox user: its API requests go through the egress proxy to the fake
    API (named by ANTHROPIC_BASE_URL, a loopback address the proxy lets through by that exact name) while
    the commands its Bash tool runs reach neither the databases nor agentpost's API."""
    _need_bwrap()
    try:
        claude_binary()
    except FileNotFoundError as exc:
        service_unavailable("the claude CLI", exc)
    tmp_path = service_tmp
    name = f"agentpost-test-{os.getpid()}-claude"
    with (
        FakeAnthropic(default=Computed(_probe_with_bash)) as api,
        _http_server() as allowed,
        _http_server() as other,
        _abstract_socket(name),
    ):
        home = tmp_path / "home"
        api_port = free_port()
        probe_env = {"AP_API_PORT": str(api_port), "AP_ABSTRACT": name, "AP_ALLOWED_URL": allowed,
                     "AP_OTHER_URL": other}  # fmt: skip
        agents = {
            "prober": {
                "provider": "claude",
                "permission_mode": "bypassPermissions",
                "network": [f"127.0.0.1:{allowed.rstrip('/').rsplit(':', 1)[1]}"],
                "env": probe_env,
            }
        }
        built = make_home(
            tmp_path, f"sqlite:///{home / 'agentpost.db'}", agents, processor={"sandbox": "namespaces"}
        )
        assert built == home
        (home / "workspace" / "prober").mkdir(parents=True)
        (home / "workspace" / "prober" / "netprobe.py").write_text(NET_PROBE)
        env = {**claude_env(api.base_url, tmp_path), "AGENTPOST_HOME": str(home)}
        with _web(home, env, [], api_port):
            reply, _ = _run(home, env, [], None)
        requests = len(api.main_requests())
    verdicts = _verdicts(reply)
    assert verdicts == CONFINED, verdicts
    assert requests >= 2  # the tool call and the answer both went through the proxy to the fake API


def test_a_folder_holding_agentposts_home_is_never_handed_to_the_agent(service_tmp: Path) -> None:
    """An agent whose workspace is the folder that holds agentpost's home (as an agent added through the API
    once had a root-owned folder): the run is refused with the reason, and nothing of the folder — the
    database included — is given to the agent's user; nothing ran in it."""
    _need_bwrap()
    tmp_path = service_tmp
    home = tmp_path / "home"
    agents = {
        "prober": {"provider": "command", "command": ["/bin/sh", "-c", "echo ran > ran.txt"],
                   "workspace": str(tmp_path)},
    }  # fmt: skip
    make_home(tmp_path, f"sqlite:///{home / 'agentpost.db'}", agents, processor={"sandbox": "namespaces"})
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "AGENTPOST_HOME": str(home),
    }
    reply, message_id = _run(home, env, [], None)
    assert "could not answer your message" in reply and message_id in reply, reply
    trace = _trace(home, env, message_id)  # the operator's reason
    assert "will not hand the folder" in trace and "holds agentpost's own home" in trace, trace
    assert tmp_path.stat().st_uid == 0 and (home / "agentpost.db").stat().st_uid == 0
    assert (home / "settings.toml").stat().st_uid == 0
    assert not (tmp_path / "ran.txt").exists()
