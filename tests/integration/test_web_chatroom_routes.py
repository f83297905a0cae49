"""Agents, teams and chat rooms over the web API (adapters.web.chatroom_routes), against a real uvicorn server and SQLite."""

from __future__ import annotations

import json

import httpx
import pytest

from shared.queue.records import MAX_MESSAGE_CHARS
from shared.runtime import Runtime
from tests.web_support import (
    assert_refused,
    snapshot,
)

pytestmark = pytest.mark.integration


def test_agents_teams_and_chatroom(api_client: httpx.Client, api_rt: Runtime) -> None:
    # TinyOffice reads agents and teams as objects keyed by id (AgentConfig, TeamConfig).
    agents = api_client.get("/api/agents").json()
    assert list(agents) == ["alpha", "beta", "gamma"]
    assert agents["alpha"]["default"] is True and agents["alpha"]["name"] == "Alpha"
    assert api_client.get("/api/teams").json() == {
        "dev": {"name": "dev", "agents": ["beta", "gamma"], "leader_agent": "beta"}
    }

    r = api_client.post("/api/chatroom/dev", json={"message": "standup in 5", "sender": "ann"})
    assert r.status_code == 201
    queued = r.json()["queued"]
    assert len(queued) == 2
    assert {api_rt.queue.admin.get_message(m).agent for m in queued} == {"beta", "gamma"}  # type: ignore[union-attr]
    posts = api_client.get("/api/chatroom/dev").json()
    assert [p["message"] for p in posts] == ["standup in 5"]
    assert api_client.get("/api/chatroom/dev", params={"after": posts[0]["id"]}).json() == []
    assert api_client.get("/api/chatroom/dev", params={"since": posts[0]["id"]}).json() == []

    before = snapshot(api_rt)
    assert_refused(api_client.get("/api/chatroom/nope"), 404, "no team")
    assert_refused(api_client.post("/api/chatroom/nope", json={"message": "x"}), 404)
    assert_refused(api_client.post("/api/chatroom/DEV!", json={"message": "x"}), 422)
    assert_refused(api_client.post("/api/chatroom/dev", json={}), 422, "message")
    assert snapshot(api_rt) == before


def test_chatroom_post_reports_each_member_and_the_post_in_order(
    api_client: httpx.Client, api_rt: Runtime
) -> None:
    r = api_client.post("/api/chatroom/dev", json={"message": "standup", "sender": "ann"})
    body = r.json()
    rows = api_rt.db.read("SELECT topic, type, message_id, payload FROM events ORDER BY id")
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
    message = api_rt.queue.admin.get_message(gamma)
    assert message is not None and message.conversation == "team:dev" and message.sender == "ann"
    assert message.message == "[Chat room #dev — ann]: standup" and message.message_id.startswith("chatroom_")


def test_chatroom_post_is_one_transaction(api_client: httpx.Client, api_rt: Runtime) -> None:
    before = snapshot(api_rt)
    too_long = "x" * (MAX_MESSAGE_CHARS - 5)  # fits the field, not with the chat-room heading
    assert_refused(api_client.post("/api/chatroom/dev", json={"message": too_long}), 400, "longer")
    assert snapshot(api_rt) == before
    # The post's own row cannot be written: the members' messages must not stay queued without it.
    with api_rt.db.transaction() as tx:
        tx.execute_raw(
            "CREATE TRIGGER refuse_posts BEFORE INSERT ON chat_messages BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    r = api_client.post("/api/chatroom/dev", json={"message": "standup", "sender": "ann"})
    assert r.status_code == 500, r.text
    assert snapshot(api_rt) == before
