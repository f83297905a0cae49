"""AgentX's event-queue client against a live ``agentpost run web`` over ``/api/events/ws``.

Facts recorded from AgentX's client (its remote client's queue handling and the queue protocol types):

- it subscribes with ``{"type": "queue_subscribe", "topic", "clientId", "afterCursor"}`` where
  ``afterCursor`` is the cursor it stored for (clientId, topic), or ``null`` the first time;
- on ``queue_entry`` it reads ``topic``, ``cursor`` and ``event`` (dispatching on ``event.type``), answers at
  once with ``{"type": "queue_ack", "topic", "clientId", "cursor"}`` and stores the cursor;
- on ``queue_subscribed`` it reads ``latestCursor``; a ``queue_entry`` also carries ``timestamp`` (a number).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from shared.runtime import Runtime
from shared.settings.api_token import tinyagi_base_url
from tests.web_support import free_port, make_home, runtime_for, token_of, wait_until, web_process

pytestmark = pytest.mark.e2e


def agentx_url(port: int) -> str:
    """The queue WebSocket at the base URL given to a client that sends no token: it carries it."""
    base = tinyagi_base_url("127.0.0.1", port, token_of(port))
    return base.replace("http://", "ws://", 1) + "/api/events/ws"


class AgentXClient:
    """AgentX's client behaviour as recorded above, over one WebSocket."""

    def __init__(self, ws: ClientConnection, client_id: str, storage: dict[str, str]) -> None:
        self.ws = ws
        self.client_id = client_id
        self.storage = storage
        self.handled: list[dict[str, Any]] = []
        self.subscribed: list[dict[str, Any]] = []

    def subscribe(self, topic: str) -> None:
        after = self.storage.get(f"agentx:cursor:{self.client_id}:{topic}")
        self.ws.send(
            json.dumps(
                {"type": "queue_subscribe", "topic": topic, "clientId": self.client_id, "afterCursor": after}
            )
        )

    def pump(self, timeout: float = 0.3) -> None:
        try:
            raw = self.ws.recv(timeout=timeout)
        except TimeoutError:
            return
        msg = json.loads(raw)
        if msg["type"] == "queue_entry":
            topic, cursor, event = msg["topic"], msg["cursor"], msg["event"]
            assert isinstance(msg["timestamp"], int) and isinstance(cursor, str)
            self.ws.send(
                json.dumps(
                    {"type": "queue_ack", "topic": topic, "clientId": self.client_id, "cursor": cursor}
                )
            )
            self.storage[f"agentx:cursor:{self.client_id}:{topic}"] = cursor
            assert isinstance(event, dict) and isinstance(event["type"], str)
            self.handled.append(event)
        elif msg["type"] == "queue_subscribed":
            self.subscribed.append(msg)

    def until(self, predicate: Any, timeout: float = 10) -> None:
        def step() -> bool:
            self.pump()
            return bool(predicate())

        wait_until(step, timeout, "the AgentX client to see it")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[int, Runtime]]:
    home = make_home(tmp_path)
    port = free_port()
    rt = runtime_for(home)
    try:
        with web_process(home, port):
            yield port, rt
    finally:
        rt.close()


def test_agentx_client_subscribes_receives_acks_and_resumes(live: tuple[int, Runtime]) -> None:
    port, rt = live
    storage: dict[str, str] = {}
    rt.events.append("session-1", "text_delta", {"text": "before"})
    url = agentx_url(port)
    with connect(url) as ws:
        client = AgentXClient(ws, "client-a", storage)
        client.subscribe("session-1")
        client.until(lambda: client.subscribed)
        assert client.subscribed[0]["latestCursor"] == rt.events.latest_cursor("session-1")
        for n in range(3):
            rt.events.append("session-1", "text_delta", {"text": f"live {n}"})
        client.until(lambda: len(client.handled) == 3)
        assert [e["payload"]["text"] for e in client.handled] == ["live 0", "live 1", "live 2"]
        assert {e["type"] for e in client.handled} == {"text_delta"}  # dispatched on event.type
        # Its acks are stored under its clientId, for its topic.
        last = storage["agentx:cursor:client-a:session-1"]
        wait_until(lambda: rt.events.consumer_cursor("client-a", "session-1") == last, 5, "the ack")

    # Disconnected: two more events. A new connection with the stored cursor gets exactly those.
    rt.events.append("session-1", "text_delta", {"text": "missed 1"})
    rt.events.append("session-1", "text_delta", {"text": "missed 2"})
    with connect(url) as ws:
        again = AgentXClient(ws, "client-a", storage)
        again.subscribe("session-1")
        again.until(lambda: len(again.handled) == 2)
        assert [e["payload"]["text"] for e in again.handled] == ["missed 1", "missed 2"]
        again.pump(0.5)
        assert len(again.handled) == 2  # nothing twice


def test_agentx_latest_cursor_is_per_topic_and_null_when_empty(live: tuple[int, Runtime]) -> None:
    port, rt = live
    rt.events.append("topic-a", "x", {})
    with connect(agentx_url(port)) as ws:
        client = AgentXClient(ws, "client-b", {})
        client.subscribe("empty-topic")
        client.until(lambda: client.subscribed)
        assert client.subscribed[0]["latestCursor"] is None
        rt.events.append("topic-b", "x", {})
        client.subscribe("topic-a")
        client.until(lambda: len(client.subscribed) == 2)
        assert client.subscribed[1]["latestCursor"] == rt.events.latest_cursor("topic-a")
        assert client.subscribed[1]["latestCursor"] != rt.events.last_cursor()
