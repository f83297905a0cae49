"""The event log over the web API (adapters.web.event_routes): pages and acks, against a real uvicorn server and SQLite."""

from __future__ import annotations

import httpx
import pytest

from shared.runtime import Runtime
from tests.web_support import (
    assert_refused,
)

pytestmark = pytest.mark.integration


def test_events_page_and_ack(api_client: httpx.Client, api_rt: Runtime) -> None:
    ids = [api_client.post("/api/message", json={"message": f"m{i}"}).json()["messageId"] for i in range(3)]
    page = api_client.get("/api/events", params={"after": "0", "limit": 2}).json()
    # "type" is TinyAGI's event name, "event" ours.
    assert [e["event"] for e in page["events"]] == ["message_received"] * 2
    assert [e["type"] for e in page["events"]] == ["message:incoming"] * 2
    assert [e["messageId"] for e in page["events"]] == ids[:2]
    rest = api_client.get("/api/events", params={"after": page["cursor"]}).json()
    assert [e["messageId"] for e in rest["events"]] == ids[2:]
    assert api_client.get("/api/events", params={"after": rest["cursor"]}).json()["events"] == []
    assert (
        api_client.get("/api/events", params={"topic": "nothing-here", "after": "0"}).json()["events"] == []
    )

    r = api_client.post(
        "/api/events/ack", json={"consumer": "dash", "topic": "queue", "cursor": page["cursor"]}
    )
    assert r.status_code == 200
    assert api_rt.events.consumer_cursor("dash", "queue") == page["cursor"]

    assert_refused(api_client.get("/api/events", params={"after": "abc"}), 400, "cursor")
    assert_refused(api_client.get("/api/events", params={"limit": 100_000}), 422)
    assert_refused(
        api_client.post("/api/events/ack", json={"consumer": "dash", "topic": "queue"}), 422, "cursor"
    )
    assert_refused(
        api_client.post("/api/events/ack", json={"consumer": "", "topic": "q", "cursor": "1"}), 422
    )

    # Cleanup removed everything: an old cursor gets an explicit reset answer, never a silent jump.
    with api_rt.db.transaction() as tx:
        tx.execute("UPDATE events SET created_at = 0")
    api_rt.events.cleanup(ttl_ms=1000, max_per_topic=1000)
    r = api_client.get("/api/events", params={"after": "1"})
    assert_refused(r, 410)
    assert r.json()["reset"] is True and int(r.json()["retainedAfter"]) >= 3
