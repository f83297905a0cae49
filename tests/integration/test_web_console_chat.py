"""The dashboard's per-chat actions over a real uvicorn server and SQLite: ``POST /api/conversations/{channel}/stop``
asks the processor to stop the run of that chat only (and asks nothing when none runs), and ``…/reset`` clears
the agent's session of that chat."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.chat.address import ChatAddress
from shared.chat.sessions import get_session, set_session
from shared.reads.conversation_status import record_run
from shared.runtime import Runtime
from tests.processor_support import run_idle
from tests.web_support import LiveServer, home_runtime

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield from home_runtime(tmp_path)  # agents alpha (default), beta, gamma


@pytest.fixture
def client(rt: Runtime) -> Iterator[httpx.Client]:
    with LiveServer(rt) as live, live.client() as c:
        yield c


def test_stop_asks_only_the_run_of_that_chat(client: httpx.Client, rt: Runtime) -> None:
    r = client.post("/api/conversations/telegram/stop", json={"conversation": "42"})
    assert r.status_code == 200, r.text
    assert r.json() == {"ok": True, "stopping": []}
    assert (
        rt.queue.control.agent_state("alpha")["stop_requested"] == ""
    )  # nothing runs: no request left behind
    rt.queue.intake.enqueue_message(ChatAddress("telegram", "ann", sender_id="42", conversation="42"), "work")
    ids = [m.message_id for m in rt.queue.messages.claim_all_pending_messages("alpha", "proc-1")]
    record_run(
        rt.db,
        "alpha",
        run_id="run-1",
        worker="proc-1",
        chat=ChatAddress("telegram", conversation="42"),
        message_ids=ids,
        started_at=int(time.time() * 1000),
    )
    other = client.post("/api/conversations/telegram/stop", json={"conversation": "43"})
    assert other.json() == {"ok": True, "stopping": []}
    assert rt.queue.control.agent_state("alpha")["stop_requested"] == ""
    r = client.post("/api/conversations/telegram/stop", json={"conversation": "42"})
    assert r.json() == {"ok": True, "stopping": ["alpha"]}
    assert rt.queue.control.agent_state("alpha")["stop_requested"] == "telegram:42"


def test_stop_reaches_a_message_whose_run_has_not_started(client: httpx.Client, rt: Runtime) -> None:
    """Stop pressed before the processor took the message, or after it claimed it but before the run's
    record exists (the CLI starting on a busy machine): the request is written all the same, and the message
    ends stopped without its CLI ever running."""
    chat = ChatAddress("telegram", "ann", sender_id="42", conversation="42")
    waiting = rt.queue.intake.enqueue_message(chat, "not yet taken").message_id
    r = client.post("/api/conversations/telegram/stop", json={"conversation": "42"})
    assert r.json() == {"ok": True, "stopping": ["alpha"]}
    assert rt.queue.control.agent_state("alpha")["stop_requested"] == "telegram:42"
    stats = run_idle(rt)
    assert stats.invocations == 0
    status = rt.db.read_scalar("SELECT status FROM messages WHERE message_id = :m", {"m": waiting})
    assert status == "completed"
    told = rt.db.read("SELECT metadata FROM responses WHERE message_id = :m", {"m": waiting})
    assert [json.loads(row["metadata"])["kind"] for row in told] == ["stopped"]

    rt.queue.intake.enqueue_message(chat, "claimed, run starting")
    assert rt.queue.messages.claim_all_pending_messages("alpha", "proc-1")
    r = client.post("/api/conversations/telegram/stop", json={"conversation": "42"})
    assert r.json() == {"ok": True, "stopping": ["alpha"]}
    assert rt.queue.control.agent_state("alpha")["stop_requested"] == "telegram:42"


def test_reset_clears_the_session_of_that_chat(client: httpx.Client, rt: Runtime) -> None:
    # alpha keeps one session per chat (session_scope = "conversation", the default), keyed channel:chat.
    set_session(rt.db, "alpha", "telegram:42", "session-42")
    set_session(rt.db, "alpha", "telegram:43", "session-43")
    r = client.post("/api/conversations/telegram/reset", json={"conversation": "42", "agent": "alpha"})
    assert r.status_code == 200, r.text
    assert r.json() == {"ok": True, "agent": "alpha", "sessionsReset": 1}
    assert get_session(rt.db, "alpha", "telegram:42") in (None, "")
    assert get_session(rt.db, "alpha", "telegram:43") == "session-43"  # another chat keeps its own
    again = client.post("/api/conversations/telegram/reset", json={"conversation": "42"})
    assert again.json() == {"ok": True, "agent": "alpha", "sessionsReset": 0}
