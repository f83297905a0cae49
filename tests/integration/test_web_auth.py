"""Who may use the web API (adapters.web.auth): no wildcard CORS, foreign Host headers, the bearer token on every API route, where the server may bind."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest

from shared.settings.api_token import read_token_file, token_path
from tests.web_support import (
    LiveServer,
    assert_refused,
    make_home,
    runtime_for,
    snapshot,
)

pytestmark = pytest.mark.integration


def test_no_wildcard_cors(api_client: httpx.Client) -> None:
    r = api_client.options(
        "/api/message",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers
    r = api_client.get("/api/queue/status", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_loopback_asks_for_a_token_by_default(tmp_path: Path) -> None:
    # Issue 37: an agent's command on this machine could PUT /api/settings with no token and turn its own
    # sandbox off. Now a home with no token set gets one, and the API asks for it on 127.0.0.1 too.
    home = make_home(tmp_path)
    runtime = runtime_for(home)
    try:
        with LiveServer(runtime) as live:
            path = token_path(home)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert read_token_file(path) == live.token and len(live.token) >= 40
            before = snapshot(runtime)
            with live.client("") as anon:
                assert_refused(anon.get("/api/queue/status"), 401, "token")
                patch = {"processor": {"sandbox": "none"}}
                assert_refused(anon.put("/api/settings", json=patch), 401, "token")
                assert anon.get("/access").json() == {"tokenRequired": True, "signedIn": False}
            assert snapshot(runtime) == before
            with live.client() as c:  # the token from the file, as the CLI reads it
                assert c.get("/api/queue/status").status_code == 200
    finally:
        runtime.close()


def test_open_loopback_only_when_asked_for_and_only_for_loopback_hosts(tmp_path: Path) -> None:
    # The one way back to a token-less API: no token, and allow_open_loopback = true.
    home = make_home(tmp_path, extra="\n[api]\nallow_open_loopback = true\n")
    runtime = runtime_for(home)
    try:
        with LiveServer(runtime) as live, live.client() as anon:
            assert live.token == "" and not token_path(home).exists()
            assert anon.get("/api/queue/status").status_code == 200
            # DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends Host: evil.example.
            before = snapshot(runtime)
            r = anon.post("/api/message", json={"message": "rebind"}, headers={"Host": "evil.example:3777"})
            assert_refused(r, 403, "loopback")
            assert anon.get("/api/queue/status", headers={"Host": "localhost:3777"}).status_code == 200
            assert snapshot(runtime) == before
            # A token prefix names a token this server does not have.
            assert_refused(anon.get("/t/anything/api/queue/status"), 401, "token")
    finally:
        runtime.close()


def test_bearer_token_required_on_every_api_route(tmp_path: Path) -> None:
    runtime = runtime_for(make_home(tmp_path), AGENTPOST_API_TOKEN="s3cret-token")
    try:
        with LiveServer(runtime) as live:
            openapi = httpx.get(f"{live.url}/openapi.json").json()
            routes = [
                (
                    method.upper(),
                    path.replace("{ref}", "1").replace("{response_id}", "1").replace("{team}", "dev"),
                )
                for path, ops in openapi["paths"].items()
                if path.startswith("/api/")
                for method in ops
            ]
            assert len(routes) >= 18
            before = snapshot(runtime)
            assert not token_path(runtime.settings.home).exists()  # the environment's token is the one
            with httpx.Client(base_url=live.url, timeout=5) as anon:
                for method, path in routes:
                    for headers in (
                        {},
                        {"Authorization": "Bearer wrong"},
                        {"Authorization": "Basic czNjcmV0"},
                    ):
                        r = anon.request(method, path, headers=headers, json={"message": "x"})
                        assert_refused(r, 401, "token")
                assert_refused(anon.get("/metrics"), 401)
                assert anon.get("/healthz").status_code == 200
                assert anon.get("/").status_code == 200  # the page itself asks for the token
            assert snapshot(runtime) == before
            with live.client("s3cret-token") as c:
                assert c.post("/api/message", json={"message": "authorised"}).status_code == 201
                assert c.get("/metrics").status_code == 200
                # A token also lets a request through whatever Host it names (the operator opened it up).
                assert c.get("/api/queue/status", headers={"Host": "agents.example.org"}).status_code == 200
            r = httpx.get(f"{live.url}/api/queue/status", params={"token": "s3cret-token"})
            assert r.status_code == 200
    finally:
        runtime.close()


def test_bind_rules() -> None:
    from adapters.web.auth import check_bind, host_header_is_loopback, is_loopback
    from shared.settings.model import SettingsError

    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
        check_bind(host, "")
    for host in ("0.0.0.0", "::", "192.168.1.10", "example.com", ""):
        assert not is_loopback(host), host
        with pytest.raises(SettingsError, match="refusing to listen"):
            check_bind(host, "")
        check_bind(host, "a-token")
    assert host_header_is_loopback({"host": "127.0.0.1:3777"})
    assert host_header_is_loopback({"host": "[::1]:3777"})
    assert host_header_is_loopback({"host": "localhost"})
    assert not host_header_is_loopback({"host": "evil.example:3777"})
    assert not host_header_is_loopback({})
