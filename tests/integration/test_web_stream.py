"""Live streams against a real uvicorn server: SSE replay then live with no gap or duplicate, Last-Event-ID,
topic filter, reset for expired cursors, a slow client cut off without slowing anyone, and the WebSocket
protocol of seed 001."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from adapters.web.stream import StreamLimits
from shared.events.log import PendingEvent, append_events
from shared.runtime import Runtime
from tests.web_support import (
    LiveServer,
    SseReader,
    auth_headers,
    home_runtime,
    make_home,
    runtime_for,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield from home_runtime(tmp_path)


def bulk_append(rt: Runtime, topic: str, start: int, count: int, pad: int = 0) -> None:
    """Append ``count`` events numbered from ``start`` in transactions of up to 1000."""
    filler = "x" * pad
    for base in range(start, start + count, 1000):
        n = min(1000, start + count - base)
        with rt.db.transaction() as tx:
            append_events(
                tx, [PendingEvent("tick", {"n": base + i, "pad": filler}, None, topic) for i in range(n)]
            )


def collect(reader: SseReader, want: int, timeout: float = 20) -> list[dict[str, str]]:
    got: list[dict[str, str]] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        for ev in reader.events(timeout=0.5):
            got.append(ev)
            if len(got) >= want:
                break
        if reader.closed:
            break
    return got


def test_sse_replays_then_follows_live_without_gap_or_duplicate(rt: Runtime) -> None:
    bulk_append(rt, "t", 1, 450)  # more than two pages of replay
    with LiveServer(rt, app_kwargs={"limits": StreamLimits(page_size=200)}) as live:
        reader = SseReader(live.port, "/api/events/stream?after=0&topic=t")
        try:
            # Append while the client is still replaying, from another thread.
            writer = threading.Thread(target=bulk_append, args=(rt, "t", 451, 550))
            writer.start()
            got = collect(reader, 1000)
            writer.join()
            assert reader.status == 200
            assert [json.loads(e["data"])["payload"]["n"] for e in got] == list(range(1, 1001))
            cursors = [int(e["id"]) for e in got]
            assert cursors == sorted(set(cursors))
            assert all(json.loads(e["data"])["cursor"] == e["id"] for e in got)
        finally:
            reader.close()

        # Resume with Last-Event-ID from the middle: exactly the rest.
        last = got[699]["id"]
        reader = SseReader(live.port, "/api/events/stream?topic=t", headers={"Last-Event-ID": last})
        try:
            rest = collect(reader, 300)
            assert [json.loads(e["data"])["payload"]["n"] for e in rest] == list(range(701, 1001))
            bulk_append(rt, "other", 1, 5)
            bulk_append(rt, "t", 1001, 2)
            live_ones = collect(reader, 2)
            assert [json.loads(e["data"])["payload"]["n"] for e in live_ones] == [1001, 1002]
        finally:
            reader.close()


def test_sse_without_cursor_starts_at_now_and_bad_cursor_is_400(rt: Runtime) -> None:
    bulk_append(rt, "t", 1, 3)
    with LiveServer(rt) as live:
        reader = SseReader(live.port, "/api/events/stream")
        try:
            # TinyAGI's clients start polling on "connected": from then on nothing appended is missed.
            wait_until(lambda: list(reader.events(timeout=0.2)) == [] and reader.connected, 5, "connected")
            assert json.loads(reader.connected[0]["data"])["cursor"] == "3"
            bulk_append(rt, "t", 4, 1)
            got = collect(reader, 1)
            assert [json.loads(e["data"])["payload"]["n"] for e in got] == [4]
        finally:
            reader.close()
        with live.client() as c:
            r = c.get("/api/events/stream", headers={"Last-Event-ID": "not-a-cursor"})
            assert r.status_code == 400 and "cursor" in r.json()["error"]


def test_sse_expired_cursor_gets_reset_event(rt: Runtime) -> None:
    bulk_append(rt, "t", 1, 10)
    with rt.db.transaction() as tx:
        tx.execute("UPDATE events SET created_at = 0 WHERE id <= 6")
    assert rt.events.cleanup(ttl_ms=1000, max_per_topic=1000) == 6
    with LiveServer(rt) as live:
        reader = SseReader(live.port, "/api/events/stream", headers={"Last-Event-ID": "2"})
        try:
            got = collect(reader, 5)
        finally:
            reader.close()
        assert got[0]["event"] == "reset"
        assert json.loads(got[0]["data"]) == {"cursor": "2", "retainedAfter": "6"}
        assert got[0]["id"] == "6"
        assert [json.loads(e["data"])["payload"]["n"] for e in got[1:]] == [7, 8, 9, 10]
        assert live.app.state.stream_stats.resets_total == 1


def test_slow_client_is_bounded_cut_off_and_resumes(rt: Runtime) -> None:
    total = 12_000
    # A generous send timeout: a loaded CI machine must not starve the fast reader into a cut-off.
    limits = StreamLimits(page_size=100, send_timeout=3.0)
    with LiveServer(rt, app_kwargs={"limits": limits}) as live:
        stats = live.app.state.stream_stats
        slow = SseReader(live.port, "/api/events/stream?after=0&topic=t", rcvbuf=4096)
        fast = SseReader(live.port, "/api/events/stream?after=0&topic=t")
        try:
            wait_until(lambda: stats.clients == 2, 5, "both streams to open")
            started = time.monotonic()
            bulk_append(rt, "t", 1, total, pad=1000)  # about 12 MB of events
            append_seconds = time.monotonic() - started
            # The fast client gets everything while the slow one reads nothing at all.
            got = collect(fast, total, timeout=60)
            assert [json.loads(e["data"])["payload"]["n"] for e in got] == list(range(1, total + 1))
            wait_until(lambda: stats.slow_disconnects_total == 1, 20, "the slow client to be cut off")
            assert append_seconds < 20
            # Only what fit in the socket and transport buffers reached it: nothing queued up for it in memory.
            received = collect(slow, total, timeout=10)
            assert slow.closed, "the server closes the slow client's connection"
            numbers = [json.loads(e["data"])["payload"]["n"] for e in received]
            assert numbers == list(range(1, len(numbers) + 1))
            assert len(numbers) < total // 2
        finally:
            slow.close()
            fast.close()
        resumed = SseReader(
            live.port,
            "/api/events/stream?topic=t",
            headers={"Last-Event-ID": received[-1]["id"]} if received else {},
        )
        try:
            rest = collect(resumed, total - len(numbers), timeout=60)
            assert [json.loads(e["data"])["payload"]["n"] for e in rest] == list(
                range(len(numbers) + 1, total + 1)
            )
        finally:
            resumed.close()


def test_websocket_protocol(rt: Runtime) -> None:
    bulk_append(rt, "t", 1, 3)
    with (
        LiveServer(rt) as live,
        connect(
            f"ws://127.0.0.1:{live.port}/api/events/ws", additional_headers=auth_headers(live.port)
        ) as ws,
    ):

        def recv() -> dict[str, object]:
            data = json.loads(ws.recv(timeout=5))
            assert isinstance(data, dict)
            return data

        ws.send(json.dumps({"type": "queue_subscribe", "topic": "t", "afterCursor": "1"}))
        # AgentX's shape: the topic's latest cursor with the confirmation.
        assert recv() == {"type": "queue_subscribed", "topic": "t", "latestCursor": "3"}
        replay = [recv(), recv()]
        assert [m["type"] for m in replay] == ["queue_entry", "queue_entry"]
        assert [m["cursor"] for m in replay] == ["2", "3"]
        bulk_append(rt, "t", 4, 1)
        live_entry = recv()
        # AgentX's queue_entry: the event under "event" (its "type" is the event's name) and a timestamp.
        assert live_entry["cursor"] == "4" and live_entry["event"]["payload"]["n"] == 4  # type: ignore[index]
        assert isinstance(live_entry["timestamp"], int)

        ws.send(json.dumps({"type": "queue_ack", "topic": "t", "cursor": "4", "consumer": "dash"}))
        assert recv() == {"type": "queue_acked", "topic": "t", "cursor": "4"}
        assert rt.events.consumer_cursor("dash", "t") == "4"

        ws.send("not json")
        assert recv()["type"] == "error"
        ws.send(json.dumps({"type": "queue_ack", "topic": "t", "cursor": "x"}))
        assert recv()["type"] == "error"
        ws.send(json.dumps({"type": "queue_subscribe", "topic": "t"}))
        assert "already subscribed" in str(recv()["error"])
        ws.send(json.dumps({"type": "nope"}))
        assert recv()["type"] == "error"

        ws.send(json.dumps({"type": "queue_unsubscribe", "topic": "t"}))
        assert recv() == {"type": "queue_unsubscribed", "topic": "t"}
        bulk_append(rt, "t", 5, 1)
        ws.send(json.dumps({"type": "queue_subscribe", "topic": "t", "afterCursor": "4"}))
        assert recv()["type"] == "queue_subscribed"
        again = recv()
        assert again["type"] == "queue_entry" and again["cursor"] == "5"


def test_websocket_requires_token_when_set(tmp_path: Path) -> None:
    runtime = runtime_for(make_home(tmp_path), AGENTPOST_API_TOKEN="tok-123")
    try:
        with LiveServer(runtime) as live:
            for url in ("/api/events/ws", "/api/events/ws?token=wrong"):
                with pytest.raises(InvalidStatus) as info:
                    connect(f"ws://127.0.0.1:{live.port}{url}")
                assert info.value.response.status_code == 403  # the handshake is refused
            with connect(f"ws://127.0.0.1:{live.port}/api/events/ws?token=tok-123") as ws:
                ws.send(json.dumps({"type": "queue_subscribe"}))
                assert json.loads(ws.recv(timeout=5)) == {
                    "type": "queue_subscribed",
                    "topic": "*",
                    "latestCursor": None,
                }
    finally:
        runtime.close()


def test_websocket_without_token_answers_only_loopback_hosts(tmp_path: Path) -> None:
    # With open loopback (no token, allow_open_loopback), the same rule as every /api route: a page of
    # another site reaching us through DNS rebinding names its own host in the handshake, and is refused.
    rt = runtime_for(make_home(tmp_path, extra="\n[api]\nallow_open_loopback = true\n"))
    with rt, LiveServer(rt) as live:
        with socket.create_connection(("127.0.0.1", live.port)) as sock, pytest.raises(InvalidStatus) as info:
            connect(f"ws://rebound.example:{live.port}/api/events/ws", sock=sock)
        assert info.value.response.status_code == 403
        with connect(f"ws://localhost:{live.port}/api/events/ws") as ws:
            ws.send(json.dumps({"type": "queue_subscribe", "topic": "t"}))
            assert json.loads(ws.recv(timeout=5))["type"] == "queue_subscribed"
