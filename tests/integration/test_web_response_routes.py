"""Replies over the web API (adapters.web.response_routes): pending, ack and proactive replies, and one chat's replies found past the first thousand of its channel."""

from __future__ import annotations

import httpx
import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.web_support import (
    assert_refused,
    play_processor,
    snapshot,
)

pytestmark = pytest.mark.integration


def test_responses_pending_ack_and_proactive(api_client: httpx.Client, api_rt: Runtime) -> None:
    mid = api_client.post("/api/message", json={"message": "q", "conversation": "tab-1"}).json()["messageId"]
    play_processor(api_rt.queue, "alpha", lambda m: f"answer to {m.message}")
    other = api_client.post("/api/message", json={"message": "r", "conversation": "tab-2"}).json()[
        "messageId"
    ]
    play_processor(api_rt.queue, "alpha", lambda m: "other tab")

    recent = api_client.get("/api/responses").json()
    # TinyAGI's ResponseData: camelCase (messageId, senderId, originalMessage, timestamp).
    assert [r["messageId"] for r in recent] == [other, mid]
    assert recent[1]["originalMessage"] == "q" and isinstance(recent[1]["timestamp"], int)
    pending = api_client.get("/api/responses/pending", params={"channel": "web"}).json()
    assert [r["message"] for r in pending] == ["answer to q", "other tab"]
    mine = api_client.get("/api/responses/pending", params={"channel": "web", "conversation": "tab-1"}).json()
    assert [r["messageId"] for r in mine] == [mid]

    r = api_client.post(f"/api/responses/{mine[0]['id']}/ack")
    assert r.status_code == 200 and r.json() == {"ok": True, "acked": True}
    assert api_client.post(f"/api/responses/{mine[0]['id']}/ack").json()["ok"] is True  # idempotent
    assert (
        api_client.get("/api/responses/pending", params={"channel": "web", "conversation": "tab-1"}).json()
        == []
    )

    before = snapshot(api_rt)
    assert_refused(api_client.post("/api/responses/999999/ack"), 404)
    assert_refused(api_client.post("/api/responses/abc/ack"), 422)
    assert_refused(api_client.get("/api/responses/pending"), 422, "channel")
    assert_refused(api_client.get("/api/responses/pending", params={"channel": "Bad Name"}), 422)
    assert snapshot(api_rt) == before

    made = api_client.post(
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
    before = snapshot(api_rt)
    assert_refused(api_client.post("/api/responses", json={"channel": "telegram"}), 422, "message")
    assert_refused(api_client.post("/api/responses", json={"channel": "telegram", "message": " "}), 400)
    assert_refused(
        api_client.post("/api/responses", json={"channel": "x", "message": "m", "agent": "B@d"}), 400
    )
    assert snapshot(api_rt) == before


def test_pending_replies_of_one_chat_are_found_past_the_channels_first_thousand(
    api_client: httpx.Client, api_rt: Runtime
) -> None:
    # A busy chat has more replies waiting than one page of the channel: the one reply of the quiet chat,
    # queued after them, is still found (filtered in the query, not in the first 1,000 rows of the channel).
    for i in range(1001):
        api_rt.queue.responses.enqueue_response(
            ChatAddress("web", "bot", conversation="busy"), f"to the busy chat {i}"
        )
    mine = api_rt.queue.responses.enqueue_response(
        ChatAddress("web", "bot", conversation="tab-1"), "to tab-1"
    )
    got = api_client.get("/api/responses/pending", params={"channel": "web", "conversation": "tab-1"}).json()
    assert [r["id"] for r in got] == [mine.id]
    busy = api_client.get(
        "/api/responses/pending", params={"channel": "web", "conversation": "busy", "limit": 3}
    )
    assert [r["message"] for r in busy.json()] == [f"to the busy chat {i}" for i in range(3)]
