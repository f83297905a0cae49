"""Cursors a client made up: past 2^63−1, negative, not a number. REST and SSE answer 400 with a reason, the
WebSocket answers an error frame and stays open; valid cursors keep working on the same server and socket.

Before: ``?after=9223372036854775808`` answered 500 (the driver's OverflowError), the SSE stream was accepted
and then died, and a WebSocket subscription with it took the whole connection down.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.sync.client import ClientConnection, connect

from shared.events.entries import MAX_CURSOR
from shared.events.log import PendingEvent, append_events
from shared.runtime import Runtime
from tests.web_support import LiveServer, SseReader, auth_headers, home_runtime

pytestmark = pytest.mark.integration

BAD_CURSORS = [str(MAX_CURSOR + 1), str(2**64), "9" * 19, "9" * 25, "-1", "abc", "1.5", " 1", "١٢"]


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield from home_runtime(tmp_path)


@pytest.fixture
def live(rt: Runtime) -> Iterator[LiveServer]:
    with LiveServer(rt) as server:
        yield server


def append(rt: Runtime, n: int) -> None:
    with rt.db.transaction() as tx:
        append_events(tx, [PendingEvent("tick", {"n": n}, None, "t")])


def test_rest_refuses_out_of_range_cursors_with_400(rt: Runtime, live: LiveServer) -> None:
    append(rt, 1)
    with live.client() as client:
        for bad in BAD_CURSORS:
            r = client.get("/api/events", params={"after": bad})
            assert r.status_code == 400, (bad, r.status_code, r.text)
            assert "cursor" in r.json()["error"], r.text
            r = client.post("/api/events/ack", json={"consumer": "dash", "topic": "t", "cursor": bad})
            assert r.status_code == 400, (bad, r.status_code, r.text)
        # The edges of the range are fine: the largest cursor simply has nothing after it.
        top = client.get("/api/events", params={"after": str(MAX_CURSOR)})
        assert top.status_code == 200 and top.json()["events"] == []
        page = client.get("/api/events", params={"after": "0"}).json()
        assert [e["payload"]["n"] for e in page["events"]] == [1]
        assert rt.events.consumer_cursor("dash", "t") is None  # no refused ack was stored


def test_sse_refuses_bad_cursors_and_keeps_serving_good_ones(rt: Runtime, live: LiveServer) -> None:
    with live.client() as client:
        for bad in BAD_CURSORS:
            tries: list[tuple[dict[str, str], dict[str, str]]] = [({"after": bad}, {})]
            # HTTP drops a header value's outer spaces (" 1" arrives as "1") and carries only ASCII.
            if bad.strip() == bad and bad.isascii():
                tries.append(({}, {"Last-Event-ID": bad}))
            for params, headers in tries:
                # Streamed: only the status line and headers are read, so a stream wrongly accepted
                # shows up as a 200 at once instead of a hang.
                with client.stream("GET", "/api/events/stream", params=params, headers=headers) as r:
                    assert r.status_code == 400, (bad, params, headers, r.status_code)
                    r.read()
                    assert "cursor" in r.json()["error"]
    append(rt, 1)
    reader = SseReader(live.port, "/api/events/stream?after=0&topic=t")
    try:
        got = next(reader.events(timeout=5))
        assert reader.status == 200 and json.loads(got["data"])["payload"] == {"n": 1}
        append(rt, 2)
        live_event = next(reader.events(timeout=5))
        assert json.loads(live_event["data"])["payload"] == {"n": 2}
    finally:
        reader.close()


def _recv(ws: ClientConnection) -> dict[str, object]:
    data = json.loads(ws.recv(timeout=5))
    assert isinstance(data, dict)
    return data


def test_websocket_answers_an_error_frame_and_stays_open(rt: Runtime, live: LiveServer) -> None:
    append(rt, 1)
    with connect(
        f"ws://127.0.0.1:{live.port}/api/events/ws", additional_headers=auth_headers(live.port)
    ) as ws:
        for bad in [*BAD_CURSORS, 2**63, -1]:  # as strings and as JSON numbers
            ws.send(json.dumps({"type": "queue_subscribe", "topic": "t", "afterCursor": bad}))
            answer = _recv(ws)
            assert answer["type"] == "error" and "cursor" in str(answer["error"]), (bad, answer)
            ws.send(json.dumps({"type": "queue_ack", "topic": "t", "cursor": bad, "consumer": "dash"}))
            answer = _recv(ws)
            assert answer["type"] == "error" and "cursor" in str(answer["error"]), (bad, answer)
        # The same connection still subscribes, replays and follows with a valid cursor.
        ws.send(json.dumps({"type": "queue_subscribe", "topic": "t", "afterCursor": "0"}))
        assert _recv(ws) == {"type": "queue_subscribed", "topic": "t", "latestCursor": "1"}
        first = _recv(ws)
        assert first["type"] == "queue_entry" and first["cursor"] == "1"
        append(rt, 2)
        second = _recv(ws)
        assert second["type"] == "queue_entry" and second["cursor"] == "2"
        # No late failure of a refused subscription arrives afterwards either.
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                extra = ws.recv(timeout=0.1)
            except TimeoutError:
                continue
            raise AssertionError(f"unexpected frame {extra!r}")
