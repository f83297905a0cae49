"""TinyAGI's own clients against a live ``agentpost run web`` (its own OS process, as an operator starts it).

Written from reading the clients' published source (TinyAGI/tinyagi: TinyOffice's ``tinyoffice/src/lib/api.ts``,
the channels' SSE client and response loop in ``packages/channels/src``, the CLI's ``sendMessage`` in
``packages/cli/src/messaging.ts``, the send-message skill). Recorded here as facts — each call's method, path
and body, and the fields the client reads with the type it expects — never as their code.
``docs/compatibility.md`` lists the same calls with agentpost's answers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.pairing import check_sender
from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from shared.settings.api_token import tinyagi_base_url
from tests.web_support import (
    AGENTPOST,
    REPO,
    free_port,
    home_token,
    make_home,
    play_processor,
    runtime_for,
    wait_until,
    web_process,
)

pytestmark = pytest.mark.e2e

TINYOFFICE_ORIGIN = "http://localhost:3000"
EXTRA = f"""
[api]
allowed_origins = ["{TINYOFFICE_ORIGIN}"]

[agents.alpha.env]
SERVICE_CREDENTIAL_VALUE = "env-secret-value"
BOT_TOKEN = "123456:very-secret-token"
"""

JSON = {"Content-Type": "application/json"}  # TinyOffice sends it on every call


@dataclass
class Live:
    home: Path
    port: int
    #: The base URL TinyAGI's clients are given: it carries the token (``/t/<token>``), as they send none.
    url: str
    rt: Runtime

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=JSON, timeout=10)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    home = make_home(tmp_path_factory.mktemp("contract"), extra=EXTRA)
    port = free_port()
    rt = runtime_for(home)
    try:
        with web_process(home, port):
            # As docs/compatibility.md says: `agentpost token` prints this base URL for token-less clients.
            yield Live(home, port, tinyagi_base_url("127.0.0.1", port, home_token(home)), rt)
    finally:
        rt.close()


def has(obj: Any, spec: dict[str, type | tuple[type, ...]]) -> None:
    """``obj`` is a JSON object with each field of ``spec`` present and of its type."""
    assert isinstance(obj, dict), obj
    for name, kind in spec.items():
        assert name in obj, f"{name!r} missing from {obj}"
        assert isinstance(obj[name], kind), f"{name!r} is {type(obj[name]).__name__} in {obj}"


# -- TinyOffice: api.ts ---------------------------------------------------------------------------------------
AGENT_CONFIG: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "provider": str,
    "model": str,
    "working_directory": str,
}
TEAM_CONFIG: dict[str, type | tuple[type, ...]] = {"name": str, "agents": list, "leader_agent": str}
RESPONSE_DATA: dict[str, type | tuple[type, ...]] = {
    "channel": str,
    "sender": str,
    "message": str,
    "originalMessage": str,
    "timestamp": int,
    "messageId": str,
    "agent": str,
    "files": list,
}


def test_check_connection_and_settings_read_write(live: Live) -> None:
    with live.client() as c:
        # checkConnection: GET /api/settings, res.ok.
        r = c.get("/api/settings")
        assert r.status_code == 200
        settings = r.json()
        # getSettings: Settings (agents and teams keyed by id); secrets never leave the server.
        has(settings, {"agents": dict, "teams": dict})
        assert settings["agents"]["alpha"]["env"] == {"SERVICE_CREDENTIAL_VALUE": "***", "BOT_TOKEN": "***"}
        assert "very-secret-token" not in r.text
        assert "env-secret-value" not in r.text
        # updateSettings: PUT /api/settings (partial) -> {ok, settings}; the file really changes.
        r = c.put(
            "/api/settings",
            json={"queue": {"max_retries": 4}, "agents": {"alpha": {"env": {"BOT_TOKEN": "***"}}}},
        )
        assert r.status_code == 200, r.text
        has(r.json(), {"ok": bool, "settings": dict})
        assert r.json()["ok"] is True and r.json()["settings"]["queue"]["max_retries"] == 4
        text = (live.home / "settings.toml").read_text()
        assert "max_retries = 4" in text and "very-secret-token" in text  # "***" kept the secret
        # An invalid change is refused and leaves the file as it was.
        r = c.put("/api/settings", json={"queue": {"max_retries": 0}})
        assert r.status_code == 400 and "max_retries" in r.json()["error"]
        assert (live.home / "settings.toml").read_text() == text


def test_settings_page_reads_tinyagi_keys_and_saves_them_back(live: Live) -> None:
    """settings/page.tsx shows ``models.provider`` (falling back to "anthropic") and
    ``monitoring.heartbeat_interval`` (else "Disabled"), and its Save PUTs the whole object it read."""
    with live.client() as c:
        r = c.put("/api/agents/gamma/heartbeat", json={"content": "Ping.", "enabled": True, "interval": 900})
        assert r.json() == {"ok": True}
        c.put("/api/agents/beta", json={"name": "Beta", "provider": "openai", "model": "gpt-5"})
        settings = c.get("/api/settings").json()
        assert settings["monitoring"] == {"heartbeat_interval": 900}
        assert settings["models"]["provider"] == "anthropic"  # alpha, the default agent, runs claude
        before = (live.home / "settings.toml").read_text()
        r = c.put("/api/settings", json=settings)
        assert r.status_code == 200, r.text
        assert r.json()["settings"]["monitoring"] == {"heartbeat_interval": 900}
        after = (live.home / "settings.toml").read_text()
        assert "monitoring" not in after and "[models" not in after
        assert "very-secret-token" in after and after.count("[agents.") == before.count("[agents.")
        # A default agent on codex is shown as TinyAGI's "openai".
        c.put("/api/settings", json={"queue": {"default_agent": "beta"}})
        assert c.get("/api/settings").json()["models"] == {"provider": "openai", "openai": {"model": "gpt-5"}}
        c.put("/api/settings", json={"queue": {"default_agent": "alpha"}})


def test_agents_and_teams_keyed_by_id_with_create_update_delete(live: Live) -> None:
    with live.client() as c:
        agents = c.get("/api/agents").json()  # getAgents: Record<string, AgentConfig>
        assert set(agents) >= {"alpha", "beta", "gamma"}
        for a in agents.values():
            has(a, AGENT_CONFIG)
        teams = c.get("/api/teams").json()  # getTeams: Record<string, TeamConfig>
        has(teams["dev"], TEAM_CONFIG)
        assert teams["dev"]["leader_agent"] == "beta"

        # saveAgent: PUT /api/agents/:id {name, provider, model, ...} -> {ok, agent}
        r = c.put("/api/agents/delta", json={"name": "Delta", "provider": "anthropic", "model": "sonnet"})
        assert r.status_code == 200, r.text
        has(r.json(), {"ok": bool, "agent": dict})
        has(r.json()["agent"], AGENT_CONFIG)
        assert r.json()["agent"]["provider"] == "claude"  # TinyAGI's "anthropic" runs the claude CLI
        assert "delta" in c.get("/api/agents").json()
        # A workspace is an absolute folder (a relative one would land wherever the server was started).
        bad = c.put(
            "/api/agents/delta",
            json={"name": "D", "provider": "claude", "model": "", "working_directory": "rel/dir"},
        )
        assert bad.status_code == 400 and "absolute" in bad.json()["error"]
        # saveTeam: PUT /api/teams/:id TeamConfig -> {ok, team}
        r = c.put(
            "/api/teams/ops", json={"name": "Ops", "agents": ["alpha", "delta"], "leader_agent": "delta"}
        )
        assert r.status_code == 200, r.text
        has(r.json()["team"], TEAM_CONFIG)
        assert c.get("/api/teams").json()["ops"]["name"] == "Ops"
        # A member of a team cannot go first; deleteTeam then deleteAgent -> {ok}
        assert c.delete("/api/agents/delta").status_code == 400
        assert c.delete("/api/teams/ops").json() == {"ok": True}
        assert c.delete("/api/agents/delta").json() == {"ok": True}
        assert "delta" not in c.get("/api/agents").json()
        assert c.delete("/api/agents/delta").status_code == 404
        # reset (TinyAGI's /reset): a fresh conversation
        r = c.post("/api/agents/alpha/reset")
        assert r.status_code == 200 and r.json()["ok"] is True


def test_send_message_queue_status_processing_and_kill(live: Live) -> None:
    with live.client() as c:
        # sendMessage: POST /api/message {message, agent?, sender?, channel?} -> {ok, messageId}
        r = c.post(
            "/api/message", json={"message": "@gamma status please", "sender": "Web", "channel": "web"}
        )
        assert r.status_code == 201
        has(r.json(), {"ok": bool, "messageId": str})
        assert r.json()["ok"] is True
        # getQueueStatus: QueueStatus
        status = c.get("/api/queue/status").json()
        has(
            status,
            {"incoming": int, "queued": int, "processing": int, "outgoing": int, "activeConversations": int},
        )
        assert status["incoming"] >= 1
        # getProcessingMessages: ProcessingMessage[]
        live.rt.queue.messages.claim_all_pending_messages("gamma", "contract-processor")
        rows = c.get("/api/queue/processing").json()
        row = next(m for m in rows if m["messageId"] == r.json()["messageId"])
        has(
            row,
            {
                "id": int,
                "messageId": str,
                "channel": str,
                "sender": str,
                "message": str,
                "agent": str,
                "status": str,
                "processAlive": bool,
                "startedAt": int,
                "duration": int,
            },
        )
        assert row["status"] in ("queued", "processing")
        assert c.get("/api/queue/status").json()["activeConversations"] >= 1
        # killAgentSession: POST /api/queue/processing/:id/kill -> {ok, agent, processKilled}
        killed = c.post(f"/api/queue/processing/{row['id']}/kill")
        assert killed.status_code == 200
        has(killed.json(), {"ok": bool, "agent": str, "processKilled": bool})
        assert killed.json()["agent"] == "gamma"
        assert live.rt.queue.control.agent_state("gamma")["stop_requested"]  # the processor sees the request
        assert c.post("/api/queue/processing/999999/kill").status_code == 404
        play_processor(live.rt.queue, "gamma", lambda m: "done")


def test_responses_and_agent_history_and_chatroom(live: Live) -> None:
    with live.client() as c:
        mid = c.post("/api/message", json={"message": "@beta what time is it"}).json()["messageId"]
        play_processor(live.rt.queue, "beta", lambda m: "noon")
        # getResponses: GET /api/responses?limit= -> ResponseData[]
        responses = c.get("/api/responses", params={"limit": 20}).json()
        mine = next(r for r in responses if r["messageId"] == mid)
        has(mine, RESPONSE_DATA)
        assert mine["originalMessage"] == "@beta what time is it" and mine["message"] == "noon"

        # getAgentMessages: GET /api/agents/:id/messages?limit=&since_id= -> AgentMessage[]
        with live.rt.db.transaction() as tx:
            for role, content in (("user", "hello beta"), ("assistant", "hello")):
                tx.execute(
                    "INSERT INTO agent_messages (agent_id, role, channel, sender, message_id, content, created_at) "
                    "VALUES ('beta', :r, 'web', 'Web', :m, :c, :t)",
                    {"r": role, "m": mid, "c": content, "t": int(time.time() * 1000)},
                )
        history = c.get("/api/agents/beta/messages", params={"limit": 100, "since_id": 0}).json()
        assert [h["content"] for h in history[:2]] == ["hello", "hello beta"]  # newest first
        for h in history:
            has(
                h,
                {
                    "id": int,
                    "agent_id": str,
                    "role": str,
                    "channel": str,
                    "sender": str,
                    "message_id": str,
                    "content": str,
                    "created_at": int,
                },
            )
        newer = c.get("/api/agents/beta/messages", params={"since_id": history[1]["id"]}).json()
        assert [h["content"] for h in newer] == ["hello"]

        # postChatMessage: POST /api/chatroom/:team {message} -> {ok}
        first = c.post("/api/chatroom/dev", json={"message": "standup"})
        assert first.json()["ok"] is True
        c.post("/api/chatroom/dev", json={"message": "retro"})
        # getChatMessages: GET /api/chatroom/:team?limit=&since= -> ChatMessage[] newest first (the view
        # reverses it)
        posts = c.get("/api/chatroom/dev", params={"limit": 100, "since": 0}).json()
        assert [p["message"] for p in posts] == ["retro", "standup"]
        has(posts[0], {"id": int, "team_id": str, "from_agent": str, "message": str, "created_at": int})
        # chatroom-view.tsx styles a post as the person's only when from_agent is exactly "user".
        assert [p["from_agent"] for p in posts] == ["user", "user"]
        assert [
            p["message"] for p in c.get("/api/chatroom/dev", params={"since": posts[1]["id"]}).json()
        ] == ["retro"]


def test_logs_system_prompt_heartbeat_and_status(live: Live) -> None:
    logs = live.home / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "processor.log").write_text("one\ntwo\nthree\n")
    with live.client() as c:
        # getLogs: GET /api/logs?limit= -> {lines: string[]}
        got = c.get("/api/logs", params={"limit": 2}).json()
        has(got, {"lines": list})
        assert got["lines"] == ["[processor] two", "[processor] three"]
        # getAgentSystemPrompt / saveAgentSystemPrompt
        assert c.put("/api/agents/alpha/system-prompt", json={"content": "Be brief."}).json() == {"ok": True}
        prompt = c.get("/api/agents/alpha/system-prompt").json()
        has(prompt, {"content": str, "path": str})
        assert prompt["content"] == "Be brief."
        # saveAgentHeartbeat / getAgentHeartbeat: {content, path, enabled, interval?}
        r = c.put(
            "/api/agents/alpha/heartbeat",
            json={"content": "Check the build.", "enabled": True, "interval": 1800},
        )
        assert r.json() == {"ok": True}
        beat = c.get("/api/agents/alpha/heartbeat").json()
        has(beat, {"content": str, "path": str, "enabled": bool})
        assert beat["content"] == "Check the build." and beat["interval"] == 1800 and beat["enabled"] is True
        assert Path(beat["path"]).read_text() == "Check the build."
        # getSystemStatus: GET /api/status
        status = c.get("/api/status").json()
        has(status, {"ok": bool, "uptime": int, "server": dict, "channels": dict, "heartbeat": dict})
        # control/page.tsx prints the seconds as they come: a float showed "6m 25.211000000000013s".
        assert not isinstance(status["uptime"], bool) and status["uptime"] >= 0
        has(status["server"], {"running": bool, "port": int})
        has(status["heartbeat"], {"running": bool, "interval": (int, float), "lastSent": dict})
        assert status["server"]["port"] == live.port and status["heartbeat"]["running"] is True


def test_schedules_crud(live: Live) -> None:
    with live.client() as c:
        # createSchedule: POST /api/schedules {cron|runAt, agentId, message, label?} -> {ok, schedule}
        r = c.post(
            "/api/schedules",
            json={"cron": "0 9 * * 1-5", "agentId": "alpha", "message": "standup", "label": "Morning"},
        )
        assert r.status_code == 201, r.text
        sched = r.json()["schedule"]
        has(
            sched,
            {
                "id": str,
                "label": str,
                "cron": str,
                "agentId": str,
                "message": str,
                "channel": str,
                "sender": str,
                "enabled": bool,
                "createdAt": int,
            },
        )
        once = c.post(
            "/api/schedules", json={"runAt": "2030-01-01T09:00:00Z", "agentId": "beta", "message": "new year"}
        )
        assert once.status_code == 201 and once.json()["schedule"]["runAt"].startswith("2030-01-01T09:00")
        # getSchedules(agentId?)
        assert [s["id"] for s in c.get("/api/schedules", params={"agent": "alpha"}).json()] == [sched["id"]]
        # updateSchedule: PUT /api/schedules/:id partial
        r = c.put(f"/api/schedules/{sched['id']}", json={"enabled": False})
        assert r.json()["ok"] is True and r.json()["schedule"]["enabled"] is False
        assert "[[schedules]]" in (live.home / "settings.toml").read_text()
        # Refused plainly: a bad cron, an unknown agent
        assert (
            c.post(
                "/api/schedules", json={"cron": "every day", "agentId": "alpha", "message": "x"}
            ).status_code
            == 400
        )
        assert (
            c.post(
                "/api/schedules", json={"cron": "* * * * *", "agentId": "nobody", "message": "x"}
            ).status_code
            == 400
        )
        # deleteSchedule
        for s in c.get("/api/schedules").json():
            assert c.delete(f"/api/schedules/{s['id']}").json() == {"ok": True}
        assert c.get("/api/schedules").json() == []


def test_pairing_list_approve_dismiss_revoke(live: Live) -> None:
    first = check_sender(live.rt.db, "telegram", "5001", "Ann")
    second = check_sender(live.rt.db, "telegram", "5002", "Bob")
    with live.client() as c:
        # getPairings: {pending: PairingPending[], approved: PairingApproved[]}
        state = c.get("/api/pairing").json()
        has(state, {"pending": list, "approved": list})
        pend = next(p for p in state["pending"] if p["senderId"] == "5001")
        has(
            pend,
            {
                "channel": str,
                "senderId": str,
                "sender": str,
                "code": str,
                "createdAt": int,
                "lastSeenAt": int,
            },
        )
        # approvePairing: POST /api/pairing/approve {code} -> {ok, entry?}
        r = c.post("/api/pairing/approve", json={"code": first.code})
        assert r.status_code == 200 and r.json()["ok"] is True
        has(r.json()["entry"], {"channel": str, "senderId": str, "sender": str, "approvedAt": int})
        approved = c.get("/api/pairing").json()["approved"]
        assert [a["senderId"] for a in approved] == ["5001"]
        # dismissPending: DELETE /api/pairing/pending/:code
        assert c.delete(f"/api/pairing/pending/{second.code}").json() == {"ok": True}
        assert all(p["senderId"] != "5002" for p in c.get("/api/pairing").json()["pending"])
        # revokePairing: DELETE /api/pairing/:channel/:senderId
        assert c.delete("/api/pairing/telegram/5001").json() == {"ok": True}
        assert c.get("/api/pairing").json()["approved"] == []
        assert c.post("/api/pairing/approve", json={"code": "NOPE2345"}).status_code == 404


def test_features_agentpost_lacks_answer_empty_or_501(live: Live) -> None:
    with live.client() as c:
        # Lists the client can display empty.
        assert c.get("/api/tasks").json() == []
        assert c.get("/api/projects").json() == []
        assert c.get("/api/custom-providers").json() == {}
        assert c.get("/api/agents/alpha/skills").json() == []
        # Every change or action among them: 501 with a sentence (apiFetch shows body.error).
        for method, path, body in [
            ("POST", "/api/tasks", {"title": "t"}),
            ("PUT", "/api/tasks/reorder", {"columns": {}}),
            ("GET", "/api/tasks/t1", None),
            ("PUT", "/api/tasks/t1", {"title": "x"}),
            ("DELETE", "/api/tasks/t1", None),
            ("GET", "/api/tasks/t1/comments", None),
            ("POST", "/api/tasks/t1/comments", {"author": "a", "authorType": "user", "content": "c"}),
            ("DELETE", "/api/comments/c1", None),
            ("POST", "/api/projects", {"name": "p", "description": ""}),
            ("PUT", "/api/projects/p1", {"name": "p"}),
            ("DELETE", "/api/projects/p1", None),
            (
                "PUT",
                "/api/custom-providers/x",
                {"name": "x", "harness": "claude", "base_url": "u", "api_key": "k"},
            ),
            ("DELETE", "/api/custom-providers/x", None),
            ("GET", "/api/agents/alpha/skills/registry?query=git", None),
            ("POST", "/api/agents/alpha/skills/install", {"ref": "x"}),
            ("GET", "/api/agents/alpha/memory", None),
            ("POST", "/api/setup", {}),
            ("POST", "/api/services/apply", None),
            ("POST", "/api/services/restart", None),
            ("POST", "/api/services/channel/telegram/start", None),
            ("POST", "/api/services/channel/telegram/stop", None),
            ("POST", "/api/services/channel/telegram/restart", None),
        ]:
            r = c.request(method, path, json=body)
            assert r.status_code == 501, (method, path, r.status_code, r.text)
            assert "agentpost has no" in r.json()["error"], (method, path)


def test_tinyoffice_origin_passes_cors_when_allowed(live: Live) -> None:
    # A browser on TinyOffice's origin preflights every call (it sends Content-Type: application/json).
    pre = httpx.options(
        f"{live.url}/api/settings",
        headers={
            "Origin": TINYOFFICE_ORIGIN,
            "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert pre.status_code in (200, 204), pre.text
    assert pre.headers["access-control-allow-origin"] == TINYOFFICE_ORIGIN
    got = httpx.get(f"{live.url}/api/settings", headers={"Origin": TINYOFFICE_ORIGIN, **JSON})
    assert got.status_code == 200 and got.headers["access-control-allow-origin"] == TINYOFFICE_ORIGIN
    other = httpx.get(f"{live.url}/api/settings", headers={"Origin": "http://evil.example"})
    assert other.status_code == 403


# -- TinyAGI's SSE client, channel response loop, CLI send and send-message skill -------------------------------
class TinySse:
    """The parsing rule of TinyAGI's SSE clients: an event is dispatched when a blank line ends a frame that
    had both an ``event:`` line and a ``data:`` line (unnamed frames are dropped)."""

    def __init__(self, base_url: str) -> None:
        port = int(base_url.rsplit(":", 1)[1].split("/", 1)[0])
        prefix = "/" + base_url.split("/", 3)[3] if base_url.count("/") > 2 else ""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        request = f"GET {prefix}/api/events/stream HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n"
        self.sock.sendall(request.encode())
        self.buf = b""
        self.status = 0
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._event = ""
        self._data = ""

    def pump(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return
        self.buf += chunk
        if not self.status and b"\r\n\r\n" in self.buf:
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            self.status = int(head.split(b" ")[1])
        # Decode HTTP chunking into lines.
        while b"\r\n" in self.buf:
            size_line, rest = self.buf.split(b"\r\n", 1)
            size = int(size_line, 16)
            if len(rest) < size + 2:
                break
            for line in rest[:size].decode().split("\n"):
                self._line(line)
            self.buf = rest[size + 2 :]

    def _line(self, line: str) -> None:
        if line.startswith("event: "):
            self._event = line[7:].strip()
        elif line.startswith("data: "):
            self._data = line[6:]
        elif line == "":
            if self._event and self._data:
                self.events.append((self._event, json.loads(self._data)))
            self._event = self._data = ""

    def wait_for(self, name: str, where: Any = lambda d: True, timeout: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event, data in self.events:
                if event == name and where(data):
                    return data
            self.pump(0.2)
        raise AssertionError(f"no {name!r} event within {timeout}s; got {[e for e, _ in self.events]}")

    def close(self) -> None:
        self.sock.close()


def test_sse_names_tinyoffice_and_channels_listen_to(live: Live) -> None:
    sse = TinySse(live.url)
    try:
        connected = sse.wait_for("connected")  # the channels poll once on connect
        assert sse.status == 200 and isinstance(connected["timestamp"], int)
        with live.client() as c:
            mid = c.post(
                "/api/message",
                json={"message": "@alpha hi", "channel": "telegram", "sender": "Ann", "senderId": "777"},
            ).json()["messageId"]
        incoming = sse.wait_for("message:incoming", lambda d: d.get("messageId") == mid)
        has(incoming, {"type": str, "timestamp": int, "messageId": str, "channel": str, "sender": str})
        assert incoming["type"] == "message:incoming"
        play_processor(live.rt.queue, "alpha", lambda m: "hello Ann")
        # The channels' wake-up: message:done with data.channel equal to their own.
        done = sse.wait_for("message:done", lambda d: d.get("channel") == "telegram")
        has(done, {"type": str, "timestamp": int, "channel": str, "agentId": str, "messageId": str})
        # TinyOffice's default list: each name it listens to is one we send (agent:invoke, agent:progress,
        # agent:response come from the processor; their mapping is checked here on the events we append).
        for ours, theirs in [
            ("chain_step_start", "agent:invoke"),
            ("agent_progress", "agent:progress"),
            ("chain_step_done", "agent:response"),
            ("chain_handoff", "agent:mention"),
        ]:
            live.rt.events.append(
                "queue", ours, {"agent": "alpha", "text": "step", "from": "alpha", "to": "beta"}
            )
            data = sse.wait_for(theirs)
            assert data["type"] == theirs and data["event"] == ours and isinstance(data["timestamp"], int)
    finally:
        sse.close()


def test_channel_response_loop_delivers_replies_by_message_id_or_sender_id(live: Live) -> None:
    """TinyAGI's channel loop: GET /api/responses/pending?channel=X; for each row read ``messageId`` (its own
    pending map), else ``senderId`` as the chat to write to; send; POST /api/responses/:id/ack. A row
    without either is acked unsent — that must never happen for a real reply."""
    with live.client() as c:
        # The channel enqueues like TinyAGI's Telegram client does.
        queued = c.post(
            "/api/message",
            json={
                "channel": "telegram",
                "sender": "Ann",
                "senderId": "4242",
                "message": "@beta ping",
                "messageId": "telegram_ab12cd34",
            },
        )
        assert queued.status_code == 201 and queued.json()["ok"] is True
        play_processor(live.rt.queue, "beta", lambda m: "pong")
        # The send-message skill: POST /api/responses {channel, sender, senderId, message} (no chat id).
        skill = c.post(
            "/api/responses",
            json={"channel": "telegram", "sender": "Ann", "senderId": "4242", "message": "reminder"},
        )
        assert skill.status_code == 201
        has(skill.json(), {"ok": bool, "messageId": str})  # it prints result.messageId

        pending_map = {"telegram_ab12cd34": 4242}  # the client's own: message id -> chat id
        sent: list[tuple[int, str]] = []
        rows = c.get("/api/responses/pending", params={"channel": "telegram"}).json()
        assert len(rows) >= 2
        for resp in rows:
            has(
                resp,
                {"id": int, "message": str, "messageId": str, "sender": str, "senderId": str, "files": list},
            )
            target = pending_map.get(resp["messageId"]) or (
                int(resp["senderId"]) if resp["senderId"] else None
            )
            assert target is not None, f"the loop would ack {resp} unsent"
            sent.append((target, resp["message"]))
            assert c.post(f"/api/responses/{resp['id']}/ack").json()["ok"] is True
        assert (4242, "pong") in sent and (4242, "reminder") in sent
        # Our own Telegram adapter delivers by conversation: the skill's reply went to the user's private
        # chat (its id is the user's id).
        assert skill.json()["response"]["conversation"] == "4242"


def test_reply_by_sender_id_alone_on_discord_goes_to_their_chat(live: Live) -> None:
    q = live.rt.queue
    with live.client() as c:
        # Bo wrote in a guild channel only: the reply goes there.
        q.intake.enqueue_message(
            ChatAddress("discord", "Bo", sender_id="9001", conversation="333444"),
            "hi",
            metadata={"guild_id": "77"},
        )
        r = c.post(
            "/api/responses",
            json={"channel": "discord", "sender": "Bo", "senderId": "9001", "message": "later"},
        )
        assert r.status_code == 201 and r.json()["response"]["conversation"] == "333444"
        # Once Bo has written in a direct message, a reply by id alone is private.
        q.intake.enqueue_message(
            ChatAddress("discord", "Bo", sender_id="9001", conversation="555666"),
            "psst",
            metadata={"guild_id": ""},
        )
        q.intake.enqueue_message(
            ChatAddress("discord", "Bo", sender_id="9001", conversation="333444"),
            "again",
            metadata={"guild_id": "77"},
        )
        r = c.post(
            "/api/responses", json={"channel": "discord", "sender": "Bo", "senderId": "9001", "message": "dm"}
        )
        assert r.json()["response"]["conversation"] == "555666"
        unknown = c.post("/api/responses", json={"channel": "discord", "senderId": "1", "message": "x"})
        assert unknown.status_code == 400 and "conversation" in unknown.json()["error"]


def test_cli_send_message(live: Live) -> None:
    # TinyAGI's CLI: POST /api/message {message, channel: "cli", sender}; it checks result.ok and prints
    # result.messageId.
    r = httpx.post(
        f"{live.url}/api/message", json={"message": "from the cli", "channel": "cli", "sender": "cli"}
    )
    assert r.status_code == 201 and r.json()["ok"] is True and isinstance(r.json()["messageId"], str)


def test_tinyagi_api_port_is_honoured(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTPOST_", "TINYAGI_"))}
    env.update({"AGENTPOST_HOME": str(home), "TINYAGI_API_PORT": str(port)})
    proc = subprocess.Popen(
        [AGENTPOST, "run", "web"], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 20, "the web process on TINYAGI_API_PORT")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()


def test_without_the_token_in_their_base_url_the_clients_are_refused(live: Live) -> None:
    # The same calls at the bare address (as before issue 37) or with a wrong token in the base URL: 401,
    # for the REST calls and the event stream alike, and nothing is queued.
    bare = f"http://127.0.0.1:{live.port}"
    wrong = tinyagi_base_url("127.0.0.1", live.port, "not-the-token")
    before = live.rt.db.read_scalar("SELECT COUNT(*) FROM messages")
    for base in (bare, wrong):
        with httpx.Client(base_url=base, headers=JSON, timeout=10) as c:
            assert c.get("/api/settings").status_code == 401
            assert c.post("/api/message", json={"message": "sneak", "channel": "cli"}).status_code == 401
        sse = TinySse(base)
        try:
            sse.pump(5)
            assert sse.status == 401
        finally:
            sse.close()
    assert live.rt.db.read_scalar("SELECT COUNT(*) FROM messages") == before
