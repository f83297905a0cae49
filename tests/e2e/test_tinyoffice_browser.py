"""TinyOffice runs on its own origin and talks to the API from the browser: what a real browser enforces
(CORS preflights) is checked in Chromium, not with an HTTP client that ignores it.

Facts from TinyOffice's published client (``tinyoffice/src/lib/api.ts``): it saves settings with
``PUT /api/settings``, agents with ``PUT /api/agents/{id}``, a system prompt with
``PUT /api/agents/{id}/system-prompt``, teams with ``PUT /api/teams/{id}``, a heartbeat with
``PUT /api/agents/{id}/heartbeat`` and schedules with ``PUT /api/schedules/{id}``, all with a JSON body. It
sends no token: its API base URL (``NEXT_PUBLIC_API_URL``, or the one saved on its settings page) is given as
``http://host:3777/t/<token>``, which works for its fetches and its ``EventSource`` alike."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from shared.settings.api_token import tinyagi_base_url
from tests.web_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    free_port,
    make_home,
    need_chromium,
    token_of,
    web_process,
)

pytestmark = pytest.mark.e2e


class _BlankPage(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><title>office</title><p>office"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@contextlib.contextmanager
def office_origin() -> Iterator[str]:
    """A page served from another port: the origin TinyOffice's pages have."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BlankPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


SAVE = """async ([api, path, body]) => {
  try {
    const r = await fetch(api + path, {
      method: "PUT", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    return String(r.status);
  } catch (e) { return "blocked: " + e.message; }
}"""


CHECK = """async ([api]) => {
  try { const r = await fetch(api + "/api/settings"); return String(r.status); }
  catch (e) { return "blocked: " + e.message; }
}"""

LISTEN = """([api]) => new Promise((resolve) => {
  const es = new EventSource(api + "/api/events/stream");
  const timer = setTimeout(() => { es.close(); resolve("no event"); }, 8000);
  es.addEventListener("connected", () => { clearTimeout(timer); es.close(); resolve("connected"); });
})"""


def test_tinyoffice_saves_with_put_from_its_own_origin(tmp_path: Path) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    port = free_port()
    with office_origin() as office:
        home = make_home(tmp_path)
        with web_process(home, port, AGENTPOST_API_ALLOWED_ORIGINS=office), sync_playwright() as pw:
            # TinyOffice sends no token: it is given a base URL that carries it (docs/compatibility.md).
            api = tinyagi_base_url("127.0.0.1", port, token_of(port))
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page()
                page.goto(office + "/")
                saves = {
                    "/api/agents/gamma": {"name": "Gamma", "provider": "anthropic", "model": "sonnet"},
                    "/api/agents/gamma/system-prompt": {"content": "be brief"},
                    "/api/teams/crew": {"name": "Crew", "agents": ["gamma"], "leader_agent": "gamma"},
                }
                results = {path: page.evaluate(SAVE, [api, path, body]) for path, body in saves.items()}
                connection = page.evaluate(CHECK, [api])
                stream = page.evaluate(LISTEN, [api])
                # The bare address, as TinyOffice's default: refused (the API asks for the token).
                bare = page.evaluate(CHECK, [f"http://127.0.0.1:{port}"])
                refused_save = page.evaluate(
                    SAVE, [f"http://127.0.0.1:{port}", "/api/teams/x", {"agents": ["gamma"]}]
                )
            finally:
                browser.close()
        assert results == dict.fromkeys(saves, "200"), results
        assert connection == "200" and stream == "connected", (connection, stream)
        assert bare == "401" and refused_save == "401", (bare, refused_save)
        settings = (home / "settings.toml").read_text(encoding="utf-8")
        assert "gamma" in settings and "crew" in settings and "[teams.x]" not in settings
