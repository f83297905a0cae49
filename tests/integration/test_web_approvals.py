"""``/api/approvals`` over a real uvicorn server and a real database (SQLite and PostgreSQL): the requests that
wait, an operator's answer applied once (the chat told what became of it), and the refusals — no token, an
unknown request, one that no longer waits, a decision that is none of the three."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.chat.address import ChatAddress
from shared.queue import approvals
from shared.runtime import Runtime
from shared.storage.statuses import ApprovalStatus
from tests.approval_support import ask_for_bash
from tests.web_support import LiveServer, assert_refused, make_home, runtime_for

pytestmark = pytest.mark.integration

CHAT = ChatAddress("telegram", "ann", sender_id="7", conversation="c1")


@pytest.fixture
def rt(tmp_path: Path, db_url: str) -> Iterator[Runtime]:
    runtime = runtime_for(make_home(tmp_path, db_url=db_url))
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def live(rt: Runtime) -> Iterator[LiveServer]:
    with LiveServer(rt) as server:
        yield server


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with live.client() as c:
        yield c


def ask(rt: Runtime, command: str, *, chat: ChatAddress | None = CHAT, timeout_ms: int = 600_000) -> str:
    """A request as a run of alpha in ``ask`` mode writes it, for the message ``chat`` sent."""
    message = rt.queue.intake.enqueue_message(chat or CHAT, f"please run {command}")
    return ask_for_bash(
        rt,
        chat,
        message.message_id,
        command=command,
        description="run it",
        run_id="run-1",
        timeout_ms=timeout_ms,
    ).id


def closing_texts(rt: Runtime, approval_id: str) -> list[str]:
    """What the request's chat was told became of it (the ``approval_closed`` replies)."""
    rows = rt.db.read("SELECT message, metadata FROM responses ORDER BY id")
    metas = [(str(r["message"]), json.loads(r["metadata"] or "{}")) for r in rows]
    return [
        text
        for text, meta in metas
        if meta.get("kind") == "approval_closed" and meta.get("approval_id") == approval_id
    ]


def test_without_the_token_nothing_is_listed_or_answered(rt: Runtime, live: LiveServer) -> None:
    apr = ask(rt, "ls -la")
    with live.client(token="") as anon, live.client(token="wrong") as wrong:
        for c in (anon, wrong):
            assert_refused(c.get("/api/approvals"), 401, "token")
            assert_refused(c.post(f"/api/approvals/{apr}", json={"decision": "allow"}), 401, "token")
    current = approvals.get(rt.db, apr)
    assert current is not None and current.status == ApprovalStatus.PENDING


def test_the_list_shows_what_waits_and_all_adds_the_answered(rt: Runtime, client: httpx.Client) -> None:
    assert client.get("/api/approvals").json() == []
    first = ask(rt, "ls -la")
    second = ask(rt, "make test", chat=None)  # a scheduled run: nobody in a chat to ask
    over = ask(rt, "rm -rf build")
    approvals.answer(rt.db, rt.queue.responses, over, "deny", by="operator", via="cli")
    r = client.get("/api/approvals")
    assert r.status_code == 200, r.text
    rows = r.json()
    assert [a["id"] for a in rows] == [first, second]  # oldest first, the denied one gone
    a = rows[0]
    assert a["agent"] == "alpha" and a["tool"] == "Bash" and a["command"] == "ls -la"
    assert a["input"] == {"command": "ls -la", "description": "run it"}
    assert (a["channel"], a["conversation"], a["sender"], a["sender_id"]) == ("telegram", "c1", "ann", "7")
    assert a["status"] == "pending" and a["waiting"] is True
    assert a["expires_at"] - a["created_at"] == 600_000
    stored = approvals.get(rt.db, first)
    assert stored is not None and {k: v for k, v in a.items() if k != "waiting"} == stored.as_dict()
    assert rows[1]["channel"] == "" and rows[1]["command"] == "make test"

    everything = client.get("/api/approvals", params={"all": "1"}).json()
    assert [x["id"] for x in everything] == [first, second, over]
    denied = everything[2]
    assert (denied["status"], denied["waiting"], denied["decided_by"]) == ("denied", False, "operator")


def test_allow_applies_once_and_tells_the_chat(rt: Runtime, client: httpx.Client) -> None:
    apr = ask(rt, "ls -la")
    r = client.post(f"/api/approvals/{apr}", json={"decision": "allow"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ok"] is True and body["outcome"] == "applied"
    assert body["text"] == "✅ Allowed by operator — Bash: ls -la"
    assert body["approval"]["status"] == "allowed" and body["approval"]["waiting"] is False
    stored = approvals.get(rt.db, apr)
    assert stored is not None
    assert (stored.status, stored.decided_by, stored.decided_via, stored.for_chat) == (
        "allowed",
        "operator",
        "api",
        False,
    )
    assert closing_texts(rt, apr) == ["✅ Allowed by operator — Bash: ls -la"]
    assert client.get("/api/approvals").json() == []

    # A second answer is refused: the request no longer waits, and nothing changes.
    again = client.post(f"/api/approvals/{apr}", json={"decision": "deny"})
    assert_refused(again, 409, "already answered")
    assert again.json()["outcome"] == "over" and again.json()["approval"]["status"] == "allowed"
    stored = approvals.get(rt.db, apr)
    assert stored is not None and stored.status == ApprovalStatus.ALLOWED
    assert len(closing_texts(rt, apr)) == 1


def test_deny_and_allow_for_the_chat(rt: Runtime, client: httpx.Client) -> None:
    denied, for_chat = ask(rt, "rm -rf build"), ask(rt, "git status")
    r = client.post(f"/api/approvals/{denied}", json={"decision": "deny"})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == "🚫 Denied by operator — not run: Bash: rm -rf build"
    stored = approvals.get(rt.db, denied)
    assert stored is not None and stored.status == ApprovalStatus.DENIED

    r = client.post(f"/api/approvals/{for_chat}", json={"decision": "allow_chat"})
    assert r.status_code == 200, r.text
    assert r.json()["approval"]["for_chat"] is True
    # The chat now allows git for itself: the next run asking about it in this chat is not asked.
    rules = approvals.chat_rules(rt.db, "alpha", CHAT)
    assert rules == [("Bash", "git *")]
    assert approvals.allowed_by_rule(rules, "Bash", "git log")


def test_unknown_expired_and_bad_decisions_are_refused(rt: Runtime, client: httpx.Client) -> None:
    assert_refused(client.post("/api/approvals/apr_nosuch", json={"decision": "allow"}), 404, "apr_nosuch")

    expired = ask(rt, "sleep 1", timeout_ms=0)  # its time is over as soon as it is written
    r = client.post(f"/api/approvals/{expired}", json={"decision": "allow"})
    assert_refused(r, 409, "expired")
    stored = approvals.get(rt.db, expired)
    assert stored is not None and stored.status == ApprovalStatus.PENDING  # the processor ends it, not this
    assert client.get("/api/approvals").json() == []  # no longer waiting, so not listed

    waiting = ask(rt, "ls")
    for body in ({"decision": "yes"}, {"decision": "chat"}, {}, {"decision": None}):
        assert_refused(client.post(f"/api/approvals/{waiting}", json=body), 422, "decision")
    stored = approvals.get(rt.db, waiting)
    assert stored is not None and stored.status == ApprovalStatus.PENDING
