"""The web adapter's HTTP API against a real uvicorn server on 127.0.0.1 and a real SQLite database.

Every endpoint is exercised with good and bad input; a refused request must answer a 4xx JSON error and
change nothing (checked by comparing the queue before and after)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.queue.records import MAX_MESSAGE_CHARS
from shared.runtime import Runtime
from tests.web_support import (
    LiveServer,
    home_runtime,
    kill_until_dead,
    make_home,
    play_processor,
    runtime_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield from home_runtime(tmp_path)


@pytest.fixture
def server(rt: Runtime) -> Iterator[LiveServer]:
    with LiveServer(rt, app_kwargs={"max_body_bytes": 300_000}) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def snapshot(rt: Runtime) -> dict[str, Any]:
    """Everything a refused request must leave untouched."""
    return {
        "messages": rt.db.read("SELECT * FROM messages ORDER BY id"),
        "responses": rt.db.read("SELECT * FROM responses ORDER BY id"),
        "events": rt.db.read_scalar("SELECT COUNT(*) FROM events"),
        "chat": rt.db.read_scalar("SELECT COUNT(*) FROM chat_messages"),
    }


def assert_refused(response: httpx.Response, status: int, contains: str = "") -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    assert contains.lower() in body["error"].lower(), body


def test_post_message_queues_and_routes(client: httpx.Client, rt: Runtime) -> None:
    r = client.post("/api/message", json={"message": "hello", "sender": "ann", "senderId": "u1"})
    assert r.status_code == 201
    body = r.json()
    assert body["agent"] == "alpha" and body["messageId"].startswith("web_")
    row = rt.queue.get_message(body["messageId"])
    assert row is not None and row.status == "pending" and row.channel == "web" and row.sender_id == "u1"

    r = client.post("/api/message", json={"message": "@beta please look", "channel": "api"})
    assert r.json()["agent"] == "beta" and r.json()["messageId"].startswith("api_")
    r = client.post("/api/message", json={"message": "to the team", "agent": "dev", "conversation": "c-1"})
    assert r.json()["agent"] == "beta"
    assert rt.queue.get_message(r.json()["messageId"]).conversation == "c-1"  # type: ignore[union-attr]


def test_post_message_duplicate_id_is_409_and_changes_nothing(client: httpx.Client, rt: Runtime) -> None:
    first = client.post("/api/message", json={"message": "once", "messageId": "api_abcdefgh"})
    assert first.status_code == 201
    before = snapshot(rt)
    again = client.post("/api/message", json={"message": "twice", "messageId": "api_abcdefgh"})
    assert_refused(again, 409, "already queued")
    assert again.json()["messageId"] == "api_abcdefgh"
    assert snapshot(rt) == before


@pytest.mark.parametrize(
    ("body", "status", "contains"),
    [
        (b"{not json", 400, "malformed JSON"),
        (b"[1, 2]", 422, ""),
        (b"{}", 422, "message"),
        (b'{"message": ""}', 422, "message"),
        (b'{"message": 42}', 422, "message"),
        (b'{"message": "   "}', 400, "empty"),
        (b'{"message": "hi", "agent": "../etc"}', 422, "agent"),
        (b'{"message": "hi", "agent": "Alpha"}', 422, "agent"),
        (b'{"message": "hi", "agent": "nobody"}', 400, "unknown agent"),
        (b'{"message": "hi", "channel": "no such channel"}', 422, "channel"),
        (b'{"message": "hi", "messageId": "nope"}', 422, "messageId"),
    ],
)
def test_post_message_bad_input(
    client: httpx.Client, rt: Runtime, body: bytes, status: int, contains: str
) -> None:
    before = snapshot(rt)
    r = client.post("/api/message", content=body, headers={"content-type": "application/json"})
    assert_refused(r, status, contains)
    assert snapshot(rt) == before


def test_oversize_bodies_are_refused(client: httpx.Client, rt: Runtime) -> None:
    before = snapshot(rt)
    big = b'{"message": "' + b"x" * 400_000 + b'"}'
    assert_refused(
        client.post("/api/message", content=big, headers={"content-type": "application/json"}), 413
    )

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        yield b'{"message": "'
        for _ in range(40):
            yield b"y" * 10_000
        yield b'"}'

    r = client.post("/api/message", content=chunks(), headers={"content-type": "application/json"})
    assert_refused(r, 413)
    assert snapshot(rt) == before


def test_non_json_content_type_is_refused(client: httpx.Client, rt: Runtime) -> None:
    # A cross-site form or text/plain post must not be accepted as a message.
    before = snapshot(rt)
    r = client.post("/api/message", content=b'{"message": "hi"}', headers={"content-type": "text/plain"})
    assert r.status_code in (400, 415, 422) and "error" in r.json()
    r = client.post("/api/message", data={"message": "hi"})
    assert r.status_code in (400, 415, 422) and "error" in r.json()
    assert snapshot(rt) == before


def test_queue_views(client: httpx.Client, rt: Runtime) -> None:
    for text in ("one", "two", "@beta three"):
        client.post("/api/message", json={"message": text})
    rt.queue.claim_all_pending_messages("beta", "w1")
    status = client.get("/api/queue/status").json()
    assert status["pending"] == 2 and status["processing"] == 1 and status["dead"] == 0
    depths = {d["agent"]: d for d in client.get("/api/queue/agents").json()}
    assert (
        depths["alpha"]["pending"] == 2
        and depths["beta"]["processing"] == 1
        and depths["gamma"]["pending"] == 0
    )
    processing = client.get("/api/queue/processing").json()
    assert [m["message"] for m in processing] == ["@beta three"]
    # TinyOffice's ProcessingMessage: camelCase, claimed but not yet run is "queued".
    assert processing[0]["claimedBy"] == "w1" and processing[0]["status"] == "queued"
    assert processing[0]["processAlive"] is True and isinstance(processing[0]["duration"], int)


def test_responses_pending_ack_and_proactive(client: httpx.Client, rt: Runtime) -> None:
    mid = client.post("/api/message", json={"message": "q", "conversation": "tab-1"}).json()["messageId"]
    play_processor(rt.queue, "alpha", lambda m: f"answer to {m.message}")
    other = client.post("/api/message", json={"message": "r", "conversation": "tab-2"}).json()["messageId"]
    play_processor(rt.queue, "alpha", lambda m: "other tab")

    recent = client.get("/api/responses").json()
    # TinyAGI's ResponseData: camelCase (messageId, senderId, originalMessage, timestamp).
    assert [r["messageId"] for r in recent] == [other, mid]
    assert recent[1]["originalMessage"] == "q" and isinstance(recent[1]["timestamp"], int)
    pending = client.get("/api/responses/pending", params={"channel": "web"}).json()
    assert [r["message"] for r in pending] == ["answer to q", "other tab"]
    mine = client.get("/api/responses/pending", params={"channel": "web", "conversation": "tab-1"}).json()
    assert [r["messageId"] for r in mine] == [mid]

    r = client.post(f"/api/responses/{mine[0]['id']}/ack")
    assert r.status_code == 200 and r.json() == {"ok": True, "acked": True}
    assert client.post(f"/api/responses/{mine[0]['id']}/ack").json()["ok"] is True  # idempotent
    assert (
        client.get("/api/responses/pending", params={"channel": "web", "conversation": "tab-1"}).json() == []
    )

    before = snapshot(rt)
    assert_refused(client.post("/api/responses/999999/ack"), 404)
    assert_refused(client.post("/api/responses/abc/ack"), 422)
    assert_refused(client.get("/api/responses/pending"), 422, "channel")
    assert_refused(client.get("/api/responses/pending", params={"channel": "Bad Name"}), 422)
    assert snapshot(rt) == before

    made = client.post(
        "/api/responses",
        json={"channel": "telegram", "message": "hi there", "senderId": "42", "conversation": "chat-42"},
    )
    assert made.status_code == 201
    row = made.json()["response"]
    assert (
        row["channel"] == "telegram"
        and row["messageId"].startswith("proactive_")
        and made.json()["messageId"] == row["messageId"]
        and row["status"] == "pending"
    )
    before = snapshot(rt)
    assert_refused(client.post("/api/responses", json={"channel": "telegram"}), 422, "message")
    assert_refused(client.post("/api/responses", json={"channel": "telegram", "message": " "}), 400)
    assert_refused(client.post("/api/responses", json={"channel": "x", "message": "m", "agent": "B@d"}), 400)
    assert snapshot(rt) == before


def test_pending_replies_of_one_chat_are_found_past_the_channels_first_thousand(
    client: httpx.Client, rt: Runtime
) -> None:
    # A busy chat has more replies waiting than one page of the channel: the one reply of the quiet chat,
    # queued after them, is still found (filtered in the query, not in the first 1,000 rows of the channel).
    for i in range(1001):
        rt.queue.enqueue_response("web", "bot", f"to the busy chat {i}", conversation="busy")
    mine = rt.queue.enqueue_response("web", "bot", "to tab-1", conversation="tab-1")
    got = client.get("/api/responses/pending", params={"channel": "web", "conversation": "tab-1"}).json()
    assert [r["id"] for r in got] == [mine.id]
    busy = client.get("/api/responses/pending", params={"channel": "web", "conversation": "busy", "limit": 3})
    assert [r["message"] for r in busy.json()] == [f"to the busy chat {i}" for i in range(3)]


def test_dead_letters_list_retry_delete(client: httpx.Client, rt: Runtime) -> None:
    a = client.post("/api/message", json={"message": "doomed one"}).json()["messageId"]
    b = client.post("/api/message", json={"message": "doomed two", "conversation": "other"}).json()[
        "messageId"
    ]
    assert sorted(kill_until_dead(rt.queue, "alpha")) == sorted([a, b])
    dead = client.get("/api/queue/dead").json()
    assert {d["message_id"] for d in dead} == {a, b}
    assert all(d["last_error"] == "the CLI exited with status 1" for d in dead)

    r = client.post(f"/api/queue/dead/{a}/retry")
    assert r.status_code == 200 and r.json()["message"]["status"] == "pending"
    row_id = next(d["id"] for d in dead if d["message_id"] == b)
    r = client.delete(f"/api/queue/dead/{row_id}")
    assert r.status_code == 200 and r.json()["messageId"] == b
    assert rt.queue.get_message(b) is None
    assert client.get("/api/queue/dead").json() == []

    before = snapshot(rt)
    assert_refused(client.post(f"/api/queue/dead/{a}/retry"), 404)  # no longer dead
    assert_refused(client.delete("/api/queue/dead/api_zzzzzzzz"), 404)
    assert_refused(client.post("/api/queue/dead/../retry"), 404)
    assert_refused(client.delete("/api/queue/dead/not-an-id"), 422)
    assert_refused(client.get("/api/queue/dead", params={"limit": 0}), 422)
    assert snapshot(rt) == before


def test_retry_budget_exhausted_is_409(client: httpx.Client, rt: Runtime) -> None:
    mid = client.post("/api/message", json={"message": "again and again"}).json()["messageId"]
    for _ in range(rt.queue.config.manual_retry_budget):
        kill_until_dead(rt.queue, "alpha")
        assert client.post(f"/api/queue/dead/{mid}/retry").status_code == 200
    kill_until_dead(rt.queue, "alpha")
    before = snapshot(rt)
    assert_refused(client.post(f"/api/queue/dead/{mid}/retry"), 409, "budget")
    assert snapshot(rt) == before


def test_agents_teams_and_chatroom(client: httpx.Client, rt: Runtime) -> None:
    # TinyOffice reads agents and teams as objects keyed by id (AgentConfig, TeamConfig).
    agents = client.get("/api/agents").json()
    assert list(agents) == ["alpha", "beta", "gamma"]
    assert agents["alpha"]["default"] is True and agents["alpha"]["name"] == "Alpha"
    assert client.get("/api/teams").json() == {
        "dev": {"name": "dev", "agents": ["beta", "gamma"], "leader_agent": "beta"}
    }

    r = client.post("/api/chatroom/dev", json={"message": "standup in 5", "sender": "ann"})
    assert r.status_code == 201
    queued = r.json()["queued"]
    assert len(queued) == 2
    assert {rt.queue.get_message(m).agent for m in queued} == {"beta", "gamma"}  # type: ignore[union-attr]
    posts = client.get("/api/chatroom/dev").json()
    assert [p["message"] for p in posts] == ["standup in 5"]
    assert client.get("/api/chatroom/dev", params={"after": posts[0]["id"]}).json() == []
    assert client.get("/api/chatroom/dev", params={"since": posts[0]["id"]}).json() == []

    before = snapshot(rt)
    assert_refused(client.get("/api/chatroom/nope"), 404, "no team")
    assert_refused(client.post("/api/chatroom/nope", json={"message": "x"}), 404)
    assert_refused(client.post("/api/chatroom/DEV!", json={"message": "x"}), 422)
    assert_refused(client.post("/api/chatroom/dev", json={}), 422, "message")
    assert snapshot(rt) == before


def test_chatroom_post_reports_each_member_and_the_post_in_order(client: httpx.Client, rt: Runtime) -> None:
    r = client.post("/api/chatroom/dev", json={"message": "standup", "sender": "ann"})
    body = r.json()
    rows = rt.db.read("SELECT topic, type, message_id, payload FROM events ORDER BY id")
    beta, gamma = body["queued"]
    assert [(e["type"], e["message_id"]) for e in rows] == [
        ("message_received", beta),
        ("message_received", gamma),
        ("chatroom_post", None),
    ]
    # Each member was named by the post, not guessed: said in the one event of its message.
    assert json.loads(rows[0]["payload"]) == {
        "channel": "chatroom",
        "sender": "ann",
        "agent": "beta",
        "named": True,
    }
    assert json.loads(rows[1]["payload"]) == {
        "channel": "chatroom",
        "sender": "ann",
        "agent": "gamma",
        "named": True,
    }
    assert json.loads(rows[2]["payload"]) == {"team": "dev", "id": body["id"], "queued": [beta, gamma]}
    message = rt.queue.get_message(gamma)
    assert message is not None and message.conversation == "team:dev" and message.sender == "ann"
    assert message.message == "[Chat room #dev — ann]: standup" and message.message_id.startswith("chatroom_")


def test_chatroom_post_is_one_transaction(client: httpx.Client, rt: Runtime) -> None:
    before = snapshot(rt)
    too_long = "x" * (MAX_MESSAGE_CHARS - 5)  # fits the field, not with the chat-room heading
    assert_refused(client.post("/api/chatroom/dev", json={"message": too_long}), 400, "longer")
    assert snapshot(rt) == before
    # The post's own row cannot be written: the members' messages must not stay queued without it.
    with rt.db.transaction() as tx:
        tx.execute_raw(
            "CREATE TRIGGER refuse_posts BEFORE INSERT ON chat_messages BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    r = client.post("/api/chatroom/dev", json={"message": "standup", "sender": "ann"})
    assert r.status_code == 500, r.text
    assert snapshot(rt) == before


def test_events_page_and_ack(client: httpx.Client, rt: Runtime) -> None:
    ids = [client.post("/api/message", json={"message": f"m{i}"}).json()["messageId"] for i in range(3)]
    page = client.get("/api/events", params={"after": "0", "limit": 2}).json()
    # "type" is TinyAGI's event name, "event" ours.
    assert [e["event"] for e in page["events"]] == ["message_received"] * 2
    assert [e["type"] for e in page["events"]] == ["message:incoming"] * 2
    assert [e["messageId"] for e in page["events"]] == ids[:2]
    rest = client.get("/api/events", params={"after": page["cursor"]}).json()
    assert [e["messageId"] for e in rest["events"]] == ids[2:]
    assert client.get("/api/events", params={"after": rest["cursor"]}).json()["events"] == []
    assert client.get("/api/events", params={"topic": "nothing-here", "after": "0"}).json()["events"] == []

    r = client.post("/api/events/ack", json={"consumer": "dash", "topic": "queue", "cursor": page["cursor"]})
    assert r.status_code == 200
    assert rt.events.consumer_cursor("dash", "queue") == page["cursor"]

    assert_refused(client.get("/api/events", params={"after": "abc"}), 400, "cursor")
    assert_refused(client.get("/api/events", params={"limit": 100_000}), 422)
    assert_refused(client.post("/api/events/ack", json={"consumer": "dash", "topic": "queue"}), 422, "cursor")
    assert_refused(client.post("/api/events/ack", json={"consumer": "", "topic": "q", "cursor": "1"}), 422)

    # Cleanup removed everything: an old cursor gets an explicit reset answer, never a silent jump.
    with rt.db.transaction() as tx:
        tx.execute("UPDATE events SET created_at = 0")
    rt.events.cleanup(ttl_ms=1000, max_per_topic=1000)
    r = client.get("/api/events", params={"after": "1"})
    assert_refused(r, 410)
    assert r.json()["reset"] is True and int(r.json()["retainedAfter"]) >= 3


def test_health_metrics_dashboard_and_unknown_routes(client: httpx.Client, rt: Runtime) -> None:
    assert client.get("/healthz").json() == {"ok": True, "database": "sqlite"}
    client.post("/api/message", json={"message": "count me"})
    play_processor(rt.queue, "alpha", lambda m: "done")
    text = client.get("/metrics").text
    assert "# TYPE agentpost_queue_messages gauge" in text
    assert 'agentpost_queue_messages{status="completed"} 1' in text
    assert 'agentpost_agent_queue_depth{agent="alpha",status="pending"} 0' in text
    assert "agentpost_messages_received_total 1" in text
    assert "agentpost_messages_completed_total 1" in text
    assert 'agentpost_agent_run_seconds_count{agent="alpha"} 1' in text

    page = client.get("/")
    assert page.status_code == 200 and "<title>agentpost</title>" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for asset in ("/static/app.js", "/static/style.css"):
        assert client.get(asset).status_code == 200
    assert "http" not in "".join(line for line in page.text.splitlines() if "src=" in line or "href=" in line)

    assert_refused(client.get("/api/nothing"), 404)
    assert_refused(client.get("/nothing/at/all"), 404)
    assert_refused(client.put("/api/message", json={"message": "x"}), 405)
    openapi = client.get("/openapi.json").json()
    assert "/api/message" in openapi["paths"] and "/api/events/stream" in openapi["paths"]


def test_no_wildcard_cors(client: httpx.Client) -> None:
    r = client.options(
        "/api/message",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers
    r = client.get("/api/queue/status", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_foreign_host_header_refused_without_token(client: httpx.Client, rt: Runtime) -> None:
    # DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends Host: evil.example.
    before = snapshot(rt)
    r = client.post("/api/message", json={"message": "rebind"}, headers={"Host": "evil.example:3777"})
    assert_refused(r, 403, "loopback")
    assert client.get("/api/queue/status", headers={"Host": "localhost:3777"}).status_code == 200
    assert snapshot(rt) == before


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
