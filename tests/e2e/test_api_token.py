"""The management API asks for a token on loopback too (issue 37), against ``agentpost run web`` as its own
process: before, an agent's command on the same machine could ``PUT /api/settings`` with no token and turn its
own sandbox off. The token is found the way a real client finds it (the home's ``api-token`` file, as the CLI
and ``agentpost up`` read it); clients that cannot send one get a ``/t/<token>`` base URL; browsers a sign-in
cookie."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from shared.settings.api_token import cookie_name, tinyagi_base_url, token_path
from tests.web_support import (
    AGENTPOST,
    SseReader,
    free_port,
    home_token,
    make_home,
    runtime_for,
    web_process,
)

pytestmark = pytest.mark.e2e

OPEN = "\n[api]\nallow_open_loopback = true\n"


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), NO_COLOR="1")
    return subprocess.run([AGENTPOST, *args], env=env, capture_output=True, text=True, timeout=60)


def test_init_writes_a_private_token(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = os.umask(0o022)  # the shell's usual umask: the token must be private all the same
    try:
        assert _cli(home, "init").returncode == 0
    finally:
        os.umask(old)
    path = token_path(home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = home_token(home)
    assert len(token) >= 40
    # A second init keeps it: clients given the token keep working.
    assert _cli(home, "init", "--force").returncode == 0
    assert home_token(home) == token
    shown = _cli(home, "token", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["signInLink"] == f"http://127.0.0.1:3777/signin#{token}"
    assert data["baseUrl"] == f"http://127.0.0.1:3777/t/{token}"


def test_without_a_token_loopback_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with web_process(home, port):
        # The web process made the token itself (no `init` needed): 0600 in the home.
        assert stat.S_IMODE(token_path(home).stat().st_mode) == 0o600
        token = home_token(home)
        before = (home / "settings.toml").read_text()
        assert httpx.get(f"{url}/api/queue/status", timeout=5).status_code == 401
        attack = httpx.put(f"{url}/api/settings", json={"processor": {"sandbox": "none"}}, timeout=5)
        assert attack.status_code == 401, attack.text
        for path, body in (
            ("/api/agents/evil", {"name": "Evil"}),
            ("/api/pairing/approve", {"code": "ABCD"}),
        ):
            assert httpx.put(url + path, json=body, timeout=5).status_code in (401, 405)
            assert httpx.post(url + path, json=body, timeout=5).status_code in (401, 405)
        assert httpx.post(f"{url}/api/message", json={"message": "as anyone"}, timeout=5).status_code == 401
        assert (home / "settings.toml").read_text() == before
        # Still open: liveness and whether a token is asked for.
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{url}/access", timeout=5).json()["tokenRequired"] is True
        # The token from the file, as the CLI reads it.
        bearer = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{url}/api/queue/status", headers=bearer, timeout=5).status_code == 200
        assert httpx.get(f"{url}/metrics", headers=bearer, timeout=5).status_code == 200
    rt = runtime_for(home)
    with rt:
        assert rt.db.read_scalar("SELECT COUNT(*) FROM messages") == 0


def test_a_token_prefix_opens_rest_sse_and_websocket_and_a_wrong_one_does_not(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    port = free_port()
    with web_process(home, port):
        token = home_token(home)
        base = tinyagi_base_url("127.0.0.1", port, token)
        wrong = tinyagi_base_url("127.0.0.1", port, token[:-1] + ("x" if token[-1] != "x" else "y"))
        # REST
        posted = httpx.post(f"{base}/api/message", json={"message": "via the prefix", "sender": "office"})
        assert posted.status_code == 201, posted.text
        assert httpx.get(f"{base}/api/queue/status").json()["pending"] == 1
        refused = httpx.get(f"{wrong}/api/queue/status")
        assert refused.status_code == 401 and "token" in refused.json()["error"]
        assert httpx.get(f"http://127.0.0.1:{port}/t/{token}x/healthz").status_code == 401
        # SSE: TinyAGI's SSE client sends no header at all.
        prefix = "/t/" + token
        stream = SseReader(port, f"{prefix}/api/events/stream?after=0", token="")
        try:
            first = next(stream.events(timeout=5))
            assert (
                stream.status == 200 and json.loads(first["data"])["messageId"] == posted.json()["messageId"]
            )
        finally:
            stream.close()
        refused_stream = SseReader(port, "/t/wrong/api/events/stream", token="")
        try:
            list(refused_stream.events(timeout=2))
            assert refused_stream.status == 401
        finally:
            refused_stream.close()
        # WebSocket
        with connect(f"ws://127.0.0.1:{port}{prefix}/api/events/ws", open_timeout=5) as ws:
            ws.send(json.dumps({"type": "queue_subscribe", "topic": "queue"}))
            assert json.loads(ws.recv(timeout=5))["type"] == "queue_subscribed"
        for path in ("/t/wrong/api/events/ws", "/api/events/ws"):
            with pytest.raises(InvalidStatus) as closed:
                connect(f"ws://127.0.0.1:{port}{path}", open_timeout=5)
            assert closed.value.response.status_code == 403


def test_the_sign_in_cookie_opens_the_api_to_this_site_only(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with web_process(home, port):
        token = home_token(home)
        wrong = httpx.post(f"{url}/signin", json={"token": "guess"})
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        signed = httpx.post(f"{url}/signin", json={"token": token})
        assert signed.status_code == 204, signed.text
        cookie = signed.headers["set-cookie"]
        assert cookie.startswith(f"{cookie_name(port)}=")
        assert token not in cookie  # a value derived from the token, not the token
        for attribute in ("HttpOnly", "SameSite=strict", "Path=/"):
            assert attribute.lower() in cookie.lower(), cookie
        jar = {cookie_name(port): signed.cookies[cookie_name(port)]}
        with httpx.Client(base_url=url, cookies=jar, timeout=5) as browser:
            assert browser.get("/access").json() == {"tokenRequired": True, "signedIn": True}
            assert browser.get("/api/queue/status").status_code == 200
            assert browser.post("/api/message", json={"message": "from the dashboard"}).status_code == 201
            # The same cookie on a request a page of another site makes: refused before anything else
            # (CSRF; a browser would not even attach a SameSite=Strict cookie to it).
            foreign = browser.post(
                "/api/message", json={"message": "csrf"}, headers={"Origin": "https://evil.example"}
            )
            assert foreign.status_code == 403, foreign.text
            assert (
                browser.put(
                    "/api/settings",
                    json={"processor": {"sandbox": "none"}},
                    headers={"Origin": "http://localhost:1"},
                ).status_code
                == 403
            )
            # /metrics takes the token in the header only, not the browser's cookie.
            assert browser.get("/metrics").status_code == 401
        # Another port's server (another agentpost) has its own cookie name: this one means nothing there.
        assert cookie_name(port) != cookie_name(port + 1)
    rt = runtime_for(home)
    with rt:
        texts = [r["message"] for r in rt.db.read("SELECT message FROM messages")]
    assert texts == ["from the dashboard"]


def test_allow_open_loopback_restores_open_access_and_doctor_warns(tmp_path: Path) -> None:
    home = make_home(tmp_path, extra=OPEN)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with web_process(home, port):
        assert not token_path(home).exists()
        assert httpx.get(f"{url}/api/queue/status", timeout=5).status_code == 200
        assert httpx.get(f"{url}/access", timeout=5).json()["tokenRequired"] is False
    doctor = _cli(home, "doctor", "--json")
    found = {(c["area"], c["name"]): c for c in json.loads(doctor.stdout)}
    check = found[("security", "API token")]
    assert check["level"] == "warn" and "agents' commands included" in check["detail"], check
    assert "remove api.allow_open_loopback" in check["fix"]
    # An empty token in the environment does not open it: only the setting does.
    closed = make_home(tmp_path / "closed")
    port = free_port()
    with web_process(closed, port, AGENTPOST_API_TOKEN=""):
        assert httpx.get(f"http://127.0.0.1:{port}/api/queue/status", timeout=5).status_code == 401
