"""Helpers for the web adapter's tests: a real uvicorn server (in a thread or as its own OS process), an SSE
reader over a raw socket, and the processor's part played through the real queue API."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from adapters.web.app import create_app
from shared.events.entries import EventLog
from shared.queue.core import Queue, QueuedMessage
from shared.runtime import Runtime, open_runtime
from shared.settings.api_token import read_token_file, resolve, token_path
from shared.settings.model import load_settings
from tests.probes import free_port, service_unavailable, wait_for  # noqa: F401  (free_port re-exported: tests import it from here)

REPO = Path(__file__).resolve().parents[1]
AGENTPOST = str(Path(sys.executable).parent / "agentpost")

SETTINGS = """\
[queue]
default_agent = "alpha"
max_retries = {max_retries}
backoff_base_seconds = 0
backoff_max_seconds = 0

[agents.alpha]
name = "Alpha"

[agents.beta]
name = "Beta"

[agents.gamma]
name = "Gamma"

[teams.dev]
agents = ["beta", "gamma"]
leader = "beta"

[processor]
sandbox = "none"  # scripted agents report through files the agent sandbox would hide
"""


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    return wait_for(predicate, timeout, what, interval=0.02)


def make_home(tmp: Path, *, db_url: str | None = None, max_retries: int = 2, extra: str = "") -> Path:
    """An agentpost home with agents alpha (default), beta, gamma and team dev."""
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    text = SETTINGS.format(max_retries=max_retries) + extra
    if db_url:
        text = f'[database]\nurl = "{db_url}"\n\n' + text
    (home / "settings.toml").write_text(text, encoding="utf-8")
    return home


#: The browser of the dashboard tests (Playwright drives it), and its flags.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def need_chromium() -> None:
    """Skip the test when Chromium is not installed; fail it in CI, where it must be."""
    if not os.path.exists(CHROMIUM):
        service_unavailable("chromium", "not installed (.ci/install-system-packages installs it)")


#: The API token of each server a test started, by port: the test's clients show it as a real client would
#: (the CLI and `agentpost up` read the home's api-token file; a browser signs in with the link).
_TOKENS: dict[int, str] = {}


def home_token(home: Path) -> str:
    """The token in ``home``'s api-token file, as the CLI reads it (the web process wrote it at its start)."""
    token = read_token_file(token_path(home))
    assert token, f"no API token in {token_path(home)}"
    return token


def token_of(port: int) -> str:
    """The API token of the server a test started on ``port`` ("" for a server without one)."""
    return _TOKENS.get(port, "")


def auth_headers(server: int | str) -> dict[str, str]:
    """``Authorization: Bearer`` for the server on a port or at a ``http://host:port`` URL (none when it
    asks for no token)."""
    token = token_of(server if isinstance(server, int) else _port_of(server))
    return {"Authorization": f"Bearer {token}"} if token else {}


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def sign_in(page: Any, base_url: str, fragment: str = "", *, token: str | None = None) -> None:
    """Open the dashboard in a Playwright ``page`` through the sign-in link `agentpost up` prints, then go
    to ``fragment`` (``"#ops"``). ``token``: the server's, when it was not started by this module."""
    page.goto(f"{base_url}/signin#{token_of(_port_of(base_url)) if token is None else token}")
    page.wait_for_url(f"{base_url}/", timeout=10_000)
    if fragment:
        # A new load, not a jump within the page: the dashboard picks its view from the fragment at start.
        page.goto("about:blank")
        page.goto(f"{base_url}/{fragment}")


def runtime_for(home: Path, **env: str) -> Runtime:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    return open_runtime(home, {**base, **env})


def home_runtime(tmp: Path) -> Iterator[Runtime]:
    """The body of a test's ``rt`` fixture: a runtime over :func:`make_home` in ``tmp``, closed afterwards."""
    runtime = runtime_for(make_home(tmp))
    try:
        yield runtime
    finally:
        runtime.close()


@dataclass
class LiveServer:
    """The web app served by a real uvicorn on 127.0.0.1 in a background thread."""

    runtime: Runtime
    app_kwargs: dict[str, Any] = field(default_factory=dict)
    events: EventLog | None = None
    url: str = ""
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    def __enter__(self) -> LiveServer:
        app = create_app(self.runtime, events=self.events, **self.app_kwargs)
        self.app = app
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
            ws="websockets-sansio",
            lifespan="on",
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
        self._thread.start()
        wait_until(lambda: server.started, 10, "uvicorn to start")
        port = server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.port = int(port)
        #: The token the app asks for (made in the home's api-token file when none was set).
        self.token: str = app.state.web.token
        _TOKENS[self.port] = self.token
        return self

    def __exit__(self, *_: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=10)
        _TOKENS.pop(self.port, None)

    def client(self, token: str | None = None) -> httpx.Client:
        """An HTTP client carrying the server's token (``token`` instead when given; ``""``: none)."""
        chosen = self.token if token is None else token
        headers = {"Authorization": f"Bearer {chosen}"} if chosen else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)


@contextlib.contextmanager
def web_process(home: Path, port: int, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """``agentpost run web`` as its own OS process, as an operator starts it; waits for /healthz. Its token
    (``AGENTPOST_API_TOKEN`` when given, else the one it wrote to the home) is :func:`token_of` the port."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    full.update({"AGENTPOST_HOME": str(home), "AGENTPOST_API_PORT": str(port), **env})
    proc = subprocess.Popen(
        [AGENTPOST, "run", "web"], env=full, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:

        def healthy() -> bool:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise AssertionError(f"web process exited with {proc.returncode}: {err}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        # A start, not a latency bound: on two cores busy with six tests a Python process may take long to start.
        wait_until(healthy, 60, "the web process to answer /healthz")
        # Found as the web process found it: the environment, the settings, else the file it wrote.
        _TOKENS[port] = resolve(load_settings(home, full)).value
        yield proc
    finally:
        _TOKENS.pop(port, None)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


class SseReader:
    """A minimal SSE client on a raw socket, so a test can cut the connection at any byte."""

    def __init__(
        self,
        port: int,
        path: str,
        headers: dict[str, str] | None = None,
        rcvbuf: int | None = None,
        *,
        skip_connected: bool = True,
        token: str | None = None,
    ):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Accept: text/event-stream"]
        # The server's token, as a client that has it sends it (``token=""``: none).
        chosen = token_of(port) if token is None else token
        sent = {**({"Authorization": f"Bearer {chosen}"} if chosen else {}), **(headers or {})}
        lines += [f"{k}: {v}" for k, v in sent.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buffer = b""
        self.headers_done = False
        self.status = 0
        self.closed = False
        #: The ``connected`` events the server sent first on each stream (not yielded when skipped).
        self.skip_connected = skip_connected
        self.connected: list[dict[str, str]] = []

    def _fill(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return False
        if not chunk:
            self.closed = True
            return False
        self.buffer += chunk
        return True

    def events(self, timeout: float = 5.0) -> Iterator[dict[str, str]]:
        """Yield parsed events (``id``, ``event``, ``data``) until nothing arrives for ``timeout`` seconds.
        The ``connected`` event that opens every stream is kept in :attr:`connected` unless
        ``skip_connected`` is false."""
        text = b""
        while True:
            if not self.headers_done:
                if b"\r\n\r\n" not in self.buffer:
                    if not self._fill(timeout):
                        return
                    continue
                head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
                self.status = int(head.split(b" ", 2)[1])
                self.headers_done = True
                continue
            # Chunked transfer encoding: decode complete chunks into text.
            while True:
                if b"\r\n" not in self.buffer:
                    break
                size_line, rest = self.buffer.split(b"\r\n", 1)
                size = int(size_line, 16)
                if size == 0:
                    self.closed = True
                    return
                if len(rest) < size + 2:
                    break
                text += rest[:size]
                self.buffer = rest[size + 2 :]
            while b"\n\n" in text:
                frame, text = text.split(b"\n\n", 1)
                event: dict[str, str] = {}
                for line in frame.decode().split("\n"):
                    if line.startswith(":") or not line:
                        continue
                    key, _, value = line.partition(":")
                    event[key] = value[1:] if value.startswith(" ") else value
                if event.get("event") == "connected" and self.skip_connected:
                    self.connected.append(event)
                    continue
                if "data" in event or "event" in event:
                    yield event
            if not self._fill(timeout):
                return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def play_processor(
    queue: Queue, agent: str, reply: Callable[[QueuedMessage], str], worker: str = "test-processor"
) -> list[str]:
    """Do what the processor does for one agent: claim every pending message and complete each group with a
    response (the real queue API; the test stands in for the processor process)."""
    claimed = queue.messages.claim_all_pending_messages(agent, worker)
    done = []
    for m in claimed:
        queue.messages.complete_messages([m.message_id], worker, reply(m))
        done.append(m.message_id)
    if claimed:
        queue.leases.release_agent(agent, worker)
    return done


def kill_until_dead(queue: Queue, agent: str, error: str = "the CLI exited with status 1") -> list[str]:
    """Fail the agent's pending messages until they are dead letters (max_retries attempts)."""
    dead: list[str] = []
    for _ in range(queue.config.max_retries + 1):
        claimed = queue.messages.claim_all_pending_messages(agent, "test-processor")
        if not claimed:
            break
        outcome = queue.failures.fail_messages([m.message_id for m in claimed], "test-processor", error)
        dead.extend(outcome.dead)
        queue.leases.release_agent(agent, "test-processor")
    return dead


def snapshot(rt: Runtime) -> dict[str, Any]:
    """Everything a refused request must leave untouched."""
    return {
        "messages": rt.db.read("SELECT * FROM messages ORDER BY id"),
        "responses": rt.db.read("SELECT * FROM responses ORDER BY id"),
        "events": rt.db.read_scalar("SELECT COUNT(*) FROM events"),
        "chat": rt.db.read_scalar("SELECT COUNT(*) FROM chat_messages"),
    }


def assert_refused(response: httpx.Response, status: int, contains: str = "") -> None:
    """``response`` is a JSON error with ``status`` whose ``error`` names ``contains``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    assert contains.lower() in body["error"].lower(), body
