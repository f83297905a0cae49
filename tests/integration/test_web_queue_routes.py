"""The queue over the web API (adapters.web.queue_routes) against a real uvicorn server on 127.0.0.1 and a real SQLite database.

Every endpoint is exercised with good and bad input; a refused request must answer a 4xx JSON error and
change nothing (checked by comparing the queue before and after)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from shared.runtime import Runtime
from tests.web_support import (
    assert_refused,
    kill_until_dead,
    snapshot,
)

pytestmark = pytest.mark.integration


def test_post_message_queues_and_routes(api_client: httpx.Client, api_rt: Runtime) -> None:
    r = api_client.post("/api/message", json={"message": "hello", "sender": "ann", "senderId": "u1"})
    assert r.status_code == 201
    body = r.json()
    assert body["agent"] == "alpha" and body["messageId"].startswith("web_")
    row = api_rt.queue.admin.get_message(body["messageId"])
    assert row is not None and row.status == "pending" and row.channel == "web" and row.sender_id == "u1"

    r = api_client.post("/api/message", json={"message": "@beta please look", "channel": "api"})
    assert r.json()["agent"] == "beta" and r.json()["messageId"].startswith("api_")
    r = api_client.post(
        "/api/message", json={"message": "to the team", "agent": "dev", "conversation": "c-1"}
    )
    assert r.json()["agent"] == "beta"
    assert api_rt.queue.admin.get_message(r.json()["messageId"]).conversation == "c-1"  # type: ignore[union-attr]


def test_post_message_duplicate_id_is_409_and_changes_nothing(
    api_client: httpx.Client, api_rt: Runtime
) -> None:
    first = api_client.post("/api/message", json={"message": "once", "messageId": "api_abcdefgh"})
    assert first.status_code == 201
    before = snapshot(api_rt)
    again = api_client.post("/api/message", json={"message": "twice", "messageId": "api_abcdefgh"})
    assert_refused(again, 409, "already queued")
    assert again.json()["messageId"] == "api_abcdefgh"
    assert snapshot(api_rt) == before


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
    api_client: httpx.Client, api_rt: Runtime, body: bytes, status: int, contains: str
) -> None:
    before = snapshot(api_rt)
    r = api_client.post("/api/message", content=body, headers={"content-type": "application/json"})
    assert_refused(r, status, contains)
    assert snapshot(api_rt) == before


def test_oversize_bodies_are_refused(api_client: httpx.Client, api_rt: Runtime) -> None:
    before = snapshot(api_rt)
    big = b'{"message": "' + b"x" * 400_000 + b'"}'
    assert_refused(
        api_client.post("/api/message", content=big, headers={"content-type": "application/json"}), 413
    )

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        yield b'{"message": "'
        for _ in range(40):
            yield b"y" * 10_000
        yield b'"}'

    r = api_client.post("/api/message", content=chunks(), headers={"content-type": "application/json"})
    assert_refused(r, 413)
    assert snapshot(api_rt) == before


def test_non_json_content_type_is_refused(api_client: httpx.Client, api_rt: Runtime) -> None:
    # A cross-site form or text/plain post must not be accepted as a message.
    before = snapshot(api_rt)
    r = api_client.post("/api/message", content=b'{"message": "hi"}', headers={"content-type": "text/plain"})
    assert r.status_code in (400, 415, 422) and "error" in r.json()
    r = api_client.post("/api/message", data={"message": "hi"})
    assert r.status_code in (400, 415, 422) and "error" in r.json()
    assert snapshot(api_rt) == before


def test_queue_views(api_client: httpx.Client, api_rt: Runtime) -> None:
    for text in ("one", "two", "@beta three"):
        api_client.post("/api/message", json={"message": text})
    api_rt.queue.messages.claim_all_pending_messages("beta", "w1")
    status = api_client.get("/api/queue/status").json()
    assert status["pending"] == 2 and status["processing"] == 1 and status["dead"] == 0
    depths = {d["agent"]: d for d in api_client.get("/api/queue/agents").json()}
    assert (
        depths["alpha"]["pending"] == 2
        and depths["beta"]["processing"] == 1
        and depths["gamma"]["pending"] == 0
    )
    processing = api_client.get("/api/queue/processing").json()
    assert [m["message"] for m in processing] == ["@beta three"]
    # TinyOffice's ProcessingMessage: camelCase, claimed but not yet run is "queued".
    assert processing[0]["claimedBy"] == "w1" and processing[0]["status"] == "queued"
    assert processing[0]["processAlive"] is True and isinstance(processing[0]["duration"], int)


def test_dead_letters_list_retry_delete(api_client: httpx.Client, api_rt: Runtime) -> None:
    a = api_client.post("/api/message", json={"message": "doomed one"}).json()["messageId"]
    b = api_client.post("/api/message", json={"message": "doomed two", "conversation": "other"}).json()[
        "messageId"
    ]
    assert sorted(kill_until_dead(api_rt.queue, "alpha")) == sorted([a, b])
    dead = api_client.get("/api/queue/dead").json()
    assert {d["message_id"] for d in dead} == {a, b}
    assert all(d["last_error"] == "the CLI exited with status 1" for d in dead)

    r = api_client.post(f"/api/queue/dead/{a}/retry")
    assert r.status_code == 200 and r.json()["message"]["status"] == "pending"
    row_id = next(d["id"] for d in dead if d["message_id"] == b)
    r = api_client.delete(f"/api/queue/dead/{row_id}")
    assert r.status_code == 200 and r.json()["messageId"] == b
    assert api_rt.queue.admin.get_message(b) is None
    assert api_client.get("/api/queue/dead").json() == []

    before = snapshot(api_rt)
    assert_refused(api_client.post(f"/api/queue/dead/{a}/retry"), 404)  # no longer dead
    assert_refused(api_client.delete("/api/queue/dead/api_zzzzzzzz"), 404)
    assert_refused(api_client.post("/api/queue/dead/../retry"), 404)
    assert_refused(api_client.delete("/api/queue/dead/not-an-id"), 422)
    assert_refused(api_client.get("/api/queue/dead", params={"limit": 0}), 422)
    assert snapshot(api_rt) == before


def test_retry_budget_exhausted_is_409(api_client: httpx.Client, api_rt: Runtime) -> None:
    mid = api_client.post("/api/message", json={"message": "again and again"}).json()["messageId"]
    for _ in range(api_rt.queue.config.manual_retry_budget):
        kill_until_dead(api_rt.queue, "alpha")
        assert api_client.post(f"/api/queue/dead/{mid}/retry").status_code == 200
    kill_until_dead(api_rt.queue, "alpha")
    before = snapshot(api_rt)
    assert_refused(api_client.post(f"/api/queue/dead/{mid}/retry"), 409, "budget")
    assert snapshot(api_rt) == before
