"""Which web pages may talk to ``agentpost run web`` (a real OS process): the server's own origin and
``api.allowed_origins`` only — for REST, SSE and the WebSocket, with and without an API token.

The attack of issue 12: a page on a foreign origin opened ``/api/events/ws`` (no token set, the default),
subscribed to ``*`` and read agent output. Here that page is played by a client sending its ``Origin``."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from shared.settings.model import SettingsError, load_settings
from tests.web_support import free_port, make_home, token_of, web_process

pytestmark = pytest.mark.integration

ALLOWED = "https://office.example.com"
FOREIGN = ["https://evil.example", "http://127.0.0.1:1", "null", "https://office.example.com.evil.example"]


@pytest.fixture(params=["", "tok-origins"], ids=["file-token", "env-token"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, int, str]]:
    token: str = request.param
    port = free_port()
    env = {"AGENTPOST_API_ALLOWED_ORIGINS": f" {ALLOWED}/ , "}
    if token:
        env["AGENTPOST_API_TOKEN"] = token
    with web_process(make_home(tmp_path), port, **env):
        # Without AGENTPOST_API_TOKEN the web process made one in the home, as `agentpost up` would.
        yield f"http://127.0.0.1:{port}", port, token_of(port)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def queued(url: str, token: str) -> int:
    r = httpx.get(f"{url}/api/queue/status", headers=auth(token), timeout=5)
    assert r.status_code == 200, r.text
    return int(r.json()["pending"])


def sse_head(port: int, headers: dict[str, str], host: str = "127.0.0.1") -> tuple[int, dict[str, str]]:
    """The status and headers of ``GET /api/events/stream`` (the stream itself is left unread)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        lines = ["GET /api/events/stream HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    text = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in text[1:])}
    return int(text[0].split(" ")[1]), fields


@contextlib.contextmanager
def websocket(
    port: int, token: str, origin: str | None, host: str = "127.0.0.1"
) -> Iterator[ClientConnection]:
    with connect(
        f"ws://{host}:{port}/api/events/ws",
        sock=socket.create_connection(("127.0.0.1", port), timeout=5),
        origin=origin,  # type: ignore[arg-type]
        additional_headers=auth(token),
        open_timeout=5,
    ) as ws:
        yield ws


@pytest.mark.parametrize("origin", FOREIGN)
def test_foreign_origin_is_refused_on_rest_sse_and_websocket(
    server: tuple[str, int, str], origin: str
) -> None:
    url, port, token = server
    before = queued(url, token)
    headers = {"Origin": origin, **auth(token)}

    r = httpx.post(f"{url}/api/message", json={"message": "from a foreign page"}, headers=headers, timeout=5)
    assert r.status_code == 403, r.text
    assert "not allowed" in r.json()["error"] and "api.allowed_origins" in r.json()["error"]
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(f"{url}/api/queue/status", headers=headers, timeout=5)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    preflight = httpx.options(
        f"{url}/api/message",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        timeout=5,
    )
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers

    status, _ = sse_head(port, headers)
    assert status == 403

    with pytest.raises(InvalidStatus) as refused, websocket(port, token, origin):
        pass
    assert refused.value.response.status_code == 403
    assert queued(url, token) == before


def test_own_and_allowed_origins_and_no_origin_are_served(server: tuple[str, int, str]) -> None:
    url, port, token = server
    before = queued(url, token)
    cases = [
        ("127.0.0.1", f"http://127.0.0.1:{port}"),
        ("localhost", f"http://localhost:{port}"),  # the page's own address, whatever name it was opened by
        ("127.0.0.1", ALLOWED),
        ("127.0.0.1", None),
    ]
    for host, origin in cases:
        headers = {**auth(token), "Host": f"{host}:{port}", **({"Origin": origin} if origin else {})}
        r = httpx.post(f"{url}/api/message", json={"message": f"from {origin}"}, headers=headers, timeout=5)
        assert r.status_code == 201, (origin, r.text)
        status, sse_headers = sse_head(port, {k: v for k, v in headers.items() if k != "Host"}, host)
        assert status == 200, origin
        with websocket(port, token, origin, host) as ws:
            ws.send(json.dumps({"type": "queue_subscribe", "topic": "queue"}))
            answer = json.loads(ws.recv(timeout=5))
            assert answer["type"] == "queue_subscribed" and answer["topic"] == "queue", answer
        if origin == ALLOWED:
            # CORS names the one allowed origin (never "*") and says the answer depends on it.
            for fields in (r.headers, sse_headers):
                assert fields["access-control-allow-origin"] == ALLOWED
                assert "Origin" in fields["vary"]
        else:
            assert "access-control-allow-origin" not in r.headers
    assert queued(url, token) == before + 4


def test_preflight_from_an_allowed_origin(server: tuple[str, int, str]) -> None:
    url, _, _ = server
    r = httpx.options(
        f"{url}/api/message",
        headers={
            "Origin": ALLOWED,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
        timeout=5,
    )
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed_headers = r.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed_headers and "content-type" in allowed_headers
    assert "Origin" in r.headers["vary"]
    assert "access-control-allow-credentials" not in r.headers
    # The preflight carries no token and reveals nothing; the request itself still needs one.
    r = httpx.post(f"{url}/api/message", json={"message": "no token"}, headers={"Origin": ALLOWED}, timeout=5)
    assert r.status_code == 401
    assert r.headers["access-control-allow-origin"] == ALLOWED  # so the page can read why


def test_allowed_origins_setting_is_checked(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    env = {"AGENTPOST_API_ALLOWED_ORIGINS": "https://ok.example,https://bad.example/path"}
    with pytest.raises(SettingsError) as bad:
        load_settings(home, env)
    assert "api.allowed_origins" in str(bad.value) and "AGENTPOST_API_ALLOWED_ORIGINS" in str(bad.value)
    (home / "settings.toml").write_text('[api]\nallowed_origins = ["*"]\n', encoding="utf-8")
    with pytest.raises(SettingsError, match="every web page"):
        load_settings(home, {})
    (home / "settings.toml").write_text('[api]\nallowed_origins = ["https://a.example/"]\n', encoding="utf-8")
    assert load_settings(home, {}).api.allowed_origins == ["https://a.example"]


def test_preflight_allows_every_method_each_route_serves(server: tuple[str, int, str]) -> None:
    """TinyOffice saves settings, agents, teams, heartbeats and schedules with PUT: a preflight that does not
    list PUT makes the browser drop the request ("Failed to fetch") while curl gets 200."""
    url, _, token = server
    spec = httpx.get(f"{url}/openapi.json", headers=auth(token), timeout=5).json()
    pairs = [(path, method.upper()) for path, ops in spec["paths"].items() for method in ops]
    assert ("/api/settings", "PUT") in pairs and ("/api/agents/{agent}", "PUT") in pairs, pairs
    for path, method in pairs:
        concrete = path.replace("{", "x").replace("}", "")
        r = httpx.options(
            f"{url}{concrete}",
            headers={"Origin": ALLOWED, "Access-Control-Request-Method": method},
            timeout=5,
        )
        assert r.status_code == 204, (path, r.text)
        allowed = {m.strip() for m in r.headers["access-control-allow-methods"].split(",")}
        assert method in allowed, f"preflight for {method} {path} allows only {sorted(allowed)}"
