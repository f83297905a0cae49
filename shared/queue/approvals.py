"""Asking a person before a tool runs (``[agents.X] permission_mode = "ask"``): the one owner of the
``approvals`` table and of the tool uses a chat allowed for itself.

A run of an agent in ``ask`` mode hands each tool use its CLI would ask about to :func:`ask`: the request is
written (who may answer, for which message and run, what exactly, until when) with the question to the chat it
came from, in one transaction. Whoever answers — the person who sent the message, pressing a button or typing
``/allow``; an operator through the CLI, the API or the dashboard — goes through :func:`answer`, which lands
only on a request that still waits: an answer is applied at most once, a late one is told the request is
over. The processor waiting for it reads the row (:func:`get`), and ends a request nobody answered in time
or whose run stopped with :func:`end_waiting`. A run started again after a crash asks again: the requests its
earlier attempt left waiting are expired then (:func:`expire_for_messages_in`).

Every change queues a message to the chat the request was asked in: the question (metadata ``{"kind":
"approval", "approval_id": ID}``, shown with buttons where the platform has them), then what became of it
(``{"kind": "approval_closed", "approval_id": ID}``, shown by editing the question in place), and writes an
event with the message's id, so ``agentpost trace`` tells the story.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.ids import new_id
from shared.queue.delivery import Responses
from shared.storage import kv
from shared.storage.db import Database, Row, Tx
from shared.storage.kv import Scope
from shared.storage.queries import approvals as q
from shared.storage.statuses import ApprovalStatus

#: What the buttons of a question answer: allow once, deny, allow this tool and pattern in this chat.
Choice = Literal["allow", "deny", "chat"]
CHOICES: tuple[Choice, ...] = ("allow", "deny", "chat")
#: Their labels, as a person reads them.
CHOICE_LABELS: dict[Choice, str] = {"allow": "Allow", "deny": "Deny", "chat": "Allow for this chat"}
#: How many of a chat's "allow for this chat" rules are kept per agent (the newest).
RULES_KEPT = 50


@dataclass(frozen=True)
class Approval:
    """One row of ``approvals``."""

    id: str
    message_id: str
    run_id: str
    agent: str
    chat: ChatAddress
    tool: str
    summary: str
    detail: str
    pattern: str
    status: str
    decided_by: str
    decided_via: str
    for_chat: bool
    shown_id: str
    created_at: int
    expires_at: int
    decided_at: int

    @classmethod
    def from_row(cls, row: Row) -> Approval:
        return cls(
            id=str(row["id"]),
            message_id=str(row["message_id"]),
            run_id=str(row["run_id"]),
            agent=str(row["agent"]),
            chat=ChatAddress.of(row),
            tool=str(row["tool"]),
            summary=str(row["summary"]),
            detail=str(row["detail"]),
            pattern=str(row["pattern"]),
            status=str(row["status"]),
            decided_by=str(row["decided_by"]),
            decided_via=str(row["decided_via"]),
            for_chat=bool(row["for_chat"]),
            shown_id=str(row["shown_id"]),
            created_at=int(row["created_at"]),
            expires_at=int(row["expires_at"]),
            decided_at=int(row["decided_at"]),
        )

    def waiting(self, now: int | None = None) -> bool:
        """Whether the request still waits for an answer (pending, and its time is not over)."""
        return self.status == ApprovalStatus.PENDING and (now_ms() if now is None else now) < self.expires_at

    def as_dict(self) -> dict[str, Any]:
        """The request as the CLI's ``--json`` and the API show it."""
        try:
            tool_input = json.loads(self.detail) if self.detail else {}
        except ValueError:
            tool_input = {"text": self.detail}
        return {
            "id": self.id,
            "agent": self.agent,
            "tool": self.tool,
            "command": tool_input.get("command", "") if isinstance(tool_input, dict) else "",
            "input": tool_input,
            "summary": self.summary,
            "pattern": self.pattern,
            "status": self.status,
            "message_id": self.message_id,
            "run_id": self.run_id,
            "channel": self.chat.channel,
            "conversation": self.chat.conversation,
            "sender_id": self.chat.sender_id,
            "sender": self.chat.sender,
            "decided_by": self.decided_by,
            "decided_via": self.decided_via,
            "for_chat": self.for_chat,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "decided_at": self.decided_at,
        }


@dataclass(frozen=True)
class Question:
    """What a run asks: the agent, the tool and its input in a person's words, and where to ask."""

    agent: str
    tool: str
    summary: str
    detail: str
    pattern: str
    message_id: str
    run_id: str
    #: The chat to ask in (None: nobody to ask there, a heartbeat: operators answer from the CLI).
    chat: ChatAddress | None
    timeout_ms: int


@dataclass(frozen=True)
class Answered:
    """What came of an answer: ``applied`` (it decided the request), ``not_yours`` (someone else pressed),
    ``over`` (the request no longer waits) or ``unknown`` (no such request); ``text`` tells the one who
    answered."""

    outcome: Literal["applied", "not_yours", "over", "unknown"]
    text: str
    approval: Approval | None = None


# -- asking -----------------------------------------------------------------------------------------------
def ask(db: Database, responses: Responses, question: Question) -> Approval:
    """Write the request and queue its question to the chat, in one transaction; returns the request."""
    now = now_ms()
    chat = question.chat or ChatAddress("")
    params = {
        "id": new_id("apr"),
        "message_id": question.message_id,
        "run_id": question.run_id,
        "agent": question.agent,
        "channel": chat.channel,
        "conversation": chat.conversation,
        "sender_id": chat.sender_id,
        "sender": chat.sender,
        "tool": question.tool,
        "summary": question.summary,
        "detail": question.detail,
        "pattern": question.pattern,
        "now": now,
        "expires_at": now + question.timeout_ms,
    }
    with db.transaction() as tx:
        tx.execute(q.INSERT, params)
        row = tx.one(q.GET, {"id": params["id"]})
        assert row is not None
        approval = Approval.from_row(row)
        _tell(tx, responses, approval, "approval", question_text(approval), "approval_requested")
    return approval


def expire_for_messages_in(tx: Tx, responses: Responses, message_ids: Sequence[str]) -> int:
    """In the transaction that starts a run again: the requests an earlier attempt of these messages left
    waiting are over (the run asks again); their questions in the chat say so. Returns how many."""
    now, expired = now_ms(), 0
    for message_id in message_ids:
        for row in tx.rows(q.PENDING_OF_MESSAGE, {"message_id": message_id}):
            approval = Approval.from_row(row)
            if _decide(tx, responses, approval, ApprovalStatus.EXPIRED, by="", via="restart", now=now):
                expired += 1
    return expired


#: How long past its time a request may still wait before the scheduler ends it. The processor that asked
#: ends its own at its time; one still waiting a minute later was left by a processor that is gone (killed
#: while it waited), and its question would otherwise keep its buttons in the chat.
OVERDUE_GRACE_MS = 60_000


def end_overdue(db: Database, responses: Responses, now: int | None = None, limit: int = 500) -> int:
    """End the requests still waiting :data:`OVERDUE_GRACE_MS` past their time as ``timed_out`` (their
    questions in the chat say so: "No answer within … — not run"); returns how many. A processor still
    waiting on one reads the same outcome as its own timeout."""
    now = now_ms() if now is None else now
    ended = 0
    with db.transaction() as tx:
        for row in tx.rows(q.OVERDUE, {"before": now - OVERDUE_GRACE_MS, "limit": limit}):
            approval = Approval.from_row(row)
            if _decide(tx, responses, approval, ApprovalStatus.TIMED_OUT, by="", via="overdue", now=now):
                ended += 1
    return ended


def end_waiting(
    db: Database, responses: Responses, approval_id: str, status: ApprovalStatus, via: str
) -> bool:
    """End a request nobody answered: ``timed_out`` (its time ran out) or ``cancelled`` (its run stopped).
    False when an answer landed first (read it with :func:`get`)."""
    with db.transaction() as tx:
        row = tx.one(q.GET_LOCKED, {"id": approval_id})
        if row is None:
            return False
        return _decide(tx, responses, Approval.from_row(row), status, by="", via=via, now=now_ms())


# -- answering --------------------------------------------------------------------------------------------
def answer(
    db: Database,
    responses: Responses,
    approval_id: str,
    choice: Choice,
    *,
    by: str,
    via: str,
    asker: ChatAddress | None = None,
) -> Answered:
    """Answer a request: ``asker`` is who pressed in a chat (only the person who sent the message may
    answer there); None is an operator (the CLI, the API, the dashboard), who may answer any request."""
    now = now_ms()
    with db.transaction() as tx:
        row = tx.one(q.GET_LOCKED, {"id": approval_id})
        if row is None:
            return Answered("unknown", f"There is no approval request {approval_id}.")
        approval = Approval.from_row(row)
        if asker is not None and not _may_answer(approval, asker):
            who = approval.chat.sender or "the person who sent the message"
            return Answered("not_yours", f"Only {who} can answer this request.", approval)
        if not approval.waiting(now):
            return Answered("over", _over_text(approval, now), approval)
        status = ApprovalStatus.DENIED if choice == "deny" else ApprovalStatus.ALLOWED
        if not _decide(tx, responses, approval, status, by=by, via=via, now=now, for_chat=choice == "chat"):
            return Answered("over", "This request has expired.", approval)
        if choice == "chat" and approval.chat.channel:
            _remember_rule(tx, approval, now)
        decided = tx.one(q.GET, {"id": approval_id})
    final = Approval.from_row(decided) if decided is not None else approval
    return Answered("applied", decided_text(final), final)


def _may_answer(approval: Approval, asker: ChatAddress) -> bool:
    if asker.channel != approval.chat.channel:
        return False
    if approval.chat.sender_id:
        return asker.sender_id == approval.chat.sender_id
    return bool(asker.sender) and asker.sender == approval.chat.sender


def _decide(
    tx: Tx,
    responses: Responses,
    approval: Approval,
    status: ApprovalStatus,
    *,
    by: str,
    via: str,
    now: int,
    for_chat: bool = False,
) -> bool:
    """Move a waiting request to ``status`` (at most once); queue what became of it to its chat and write
    the event. False when it no longer waited."""
    changed = tx.execute(
        q.DECIDE,
        {
            "status": status.value,
            "by": by,
            "via": via,
            "for_chat": int(for_chat),
            "now": now,
            "id": approval.id,
        },
    ).rowcount
    if changed != 1:
        return False
    decided = Approval(
        **{
            **approval.__dict__,
            "status": status.value,
            "decided_by": by,
            "decided_via": via,
            "for_chat": for_chat,
        }
    )
    _tell(tx, responses, decided, "approval_closed", decided_text(decided), "approval_answered")
    return True


def _tell(tx: Tx, responses: Responses, approval: Approval, kind: str, text: str, event: str) -> None:
    """Queue ``text`` (a response of ``kind``) to the request's chat, when it has one, and write ``event``."""
    if approval.chat.channel:
        responses.enqueue_response_in(
            tx,
            approval.chat,
            text,
            agent=approval.agent,
            metadata={"kind": kind, "approval_id": approval.id, "agent": approval.agent},
            message_id=approval.message_id,
        )
    append_events(tx, [_event(event, approval)])
    tx.signal("approvals")


# -- reading ----------------------------------------------------------------------------------------------
def get(db: Database | Tx, approval_id: str) -> Approval | None:
    """The request ``approval_id``, or None."""
    rows = _read(db, q.GET, {"id": approval_id})
    return Approval.from_row(rows[0]) if rows else None


def waiting(db: Database) -> list[Approval]:
    """Every request that still waits for an answer, oldest first."""
    now = now_ms()
    return [a for a in map(Approval.from_row, db.read(q.PENDING_OLDEST_FIRST)) if a.waiting(now)]


def waiting_in_chat(db: Database, chat: ChatAddress) -> list[Approval]:
    """The requests of one chat that still wait, oldest first (``/allow``, ``/deny``)."""
    now = now_ms()
    rows = db.read(q.PENDING_IN_CHAT, {"channel": chat.channel, "conversation": chat.conversation})
    return [a for a in map(Approval.from_row, rows) if a.waiting(now)]


def recent(db: Database, limit: int = 50) -> list[Approval]:
    """The latest requests, whatever became of them, newest first."""
    return [Approval.from_row(r) for r in db.read(q.RECENT, {"limit": limit})]


def _read(src: Database | Tx, sql: str, params: dict[str, Any]) -> list[Row]:
    return src.rows(sql, params) if isinstance(src, Tx) else src.read(sql, params)


def shown_in(tx: Tx, approval_id: str, shown_id: str) -> None:
    """Record the platform's id of the message showing the question (to edit it to the answer later)."""
    tx.execute(q.SHOWN, {"id": approval_id, "shown_id": shown_id})


# -- "allow for this chat" ----------------------------------------------------------------------------------
def _rules_key(agent: str, chat: ChatAddress) -> str:
    return f"{agent}|{chat.row_key}"


def chat_rules(db: Database | Tx, agent: str, chat: ChatAddress) -> list[tuple[str, str]]:
    """The ``(tool, pattern)`` pairs this chat allowed ``agent`` for itself."""
    record = kv.get(db, Scope.APPROVAL_RULES, _rules_key(agent, chat))
    if not record:
        return []
    try:
        rules = json.loads(record)
    except ValueError:
        return []
    return [(str(r[0]), str(r[1])) for r in rules if isinstance(r, list) and len(r) == 2]


def allowed_by_rule(rules: Sequence[tuple[str, str]], tool: str, subject: str) -> bool:
    """Whether a chat's rules allow ``tool`` on ``subject`` (the command, the file): a rule names the tool
    and a pattern where ``*`` stands for anything (an empty pattern: any use of the tool)."""
    for rule_tool, pattern in rules:
        if rule_tool != tool:
            continue
        if not pattern or fnmatch.fnmatchcase(subject, pattern.replace("[", "[[]")):
            return True
    return False


def _remember_rule(tx: Tx, approval: Approval, now: int) -> None:
    rules = [
        r for r in chat_rules(tx, approval.agent, approval.chat) if r != (approval.tool, approval.pattern)
    ]
    rules.append((approval.tool, approval.pattern))
    value = json.dumps([list(r) for r in rules[-RULES_KEPT:]], separators=(",", ":"))
    kv.put(tx, Scope.APPROVAL_RULES, _rules_key(approval.agent, approval.chat), value, now)


def forget_chat_rules(db: Database, agent: str, chat: ChatAddress) -> int:
    """``/reset``: the chat's "allow for this chat" answers for ``agent`` are forgotten."""
    with db.transaction() as tx:
        return kv.delete(tx, Scope.APPROVAL_RULES, _rules_key(agent, chat))


# -- words ------------------------------------------------------------------------------------------------
def question_text(approval: Approval) -> str:
    """The question as the chat shows it: which agent, which tool, what exactly, and until when."""
    within = wait_words(approval.expires_at - approval.created_at)
    return (
        f"🔐 {approval.agent} asks to use {approval.tool}:\n{approval.summary}\n\n"
        f"Allow it? Without an answer within {within} it is not run."
    )


def wait_words(ms: int) -> str:
    """How long a request waits, as a person reads it: ``45 s``, ``10 min``, ``1 h 30 min``."""
    seconds = max(1, round(ms / 1000))
    if seconds < 60:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    return (
        f"{minutes} min"
        if minutes < 60
        else f"{minutes // 60} h" + (f" {minutes % 60} min" if minutes % 60 else "")
    )


def decided_text(approval: Approval) -> str:
    """What became of a request, as its question is edited to (and as the one who answered is told)."""
    what = f"{approval.tool}: {_first_line(approval.summary)}"
    who = f" by {approval.decided_by}" if approval.decided_by else ""
    status = approval.status
    if status == ApprovalStatus.ALLOWED:
        scope = " (and for the rest of this chat)" if approval.for_chat else ""
        return f"✅ Allowed{who}{scope} — {what}"
    if status == ApprovalStatus.DENIED:
        return f"🚫 Denied{who} — not run: {what}"
    if status == ApprovalStatus.TIMED_OUT:
        return (
            f"⌛ No answer within {wait_words(approval.expires_at - approval.created_at)} — not run: {what}"
        )
    if status == ApprovalStatus.CANCELLED:
        return f"⏹ The run stopped before an answer — not run: {what}"
    if status == ApprovalStatus.EXPIRED:
        return f"↻ This request expired (the agent was restarted and asks again) — {what}"
    return f"Waiting for an answer — {what}"


def _over_text(approval: Approval, now: int) -> str:
    if approval.status == ApprovalStatus.PENDING and now >= approval.expires_at:
        return "This request has expired."
    if approval.status in (ApprovalStatus.ALLOWED, ApprovalStatus.DENIED):
        return f"This request was already answered: {decided_text(approval)}"
    return "This request has expired."


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= 120 else line[:119] + "…"


def _event(kind: str, approval: Approval) -> PendingEvent:
    payload = {
        "approval_id": approval.id,
        "agent": approval.agent,
        "tool": approval.tool,
        "summary": _first_line(approval.summary),
        "run_id": approval.run_id,
        "status": approval.status,
        **({"decided_by": approval.decided_by, "via": approval.decided_via} if approval.decided_via else {}),
        **({"for_chat": True} if approval.for_chat else {}),
    }
    return PendingEvent(kind, payload, approval.message_id or None, topic="queue")
