"""``/api/approvals``: the requests agents in ``permission_mode = "ask"`` make before a tool runs, and an
operator's answer to one (the dashboard's buttons, in its chat and on the Operations page, call these).

An answer here is an operator's (:func:`shared.queue.approvals.answer` with no asker): it may decide any
request that still waits, at most once; the chat the request was asked in is told what became of it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import BaseModel

from shared.clock import now_ms
from shared.queue import approvals
from shared.queue.approvals import Approval, Choice
from shared.storage.db import Database

from .errors import ApiError
from .params import Body
from .state import Web

router = APIRouter()

#: Who an answer given here is recorded as (the dashboard has no named users: its sign-in is the token).
OPERATOR = "operator"
#: The API's words for the answers, and the store's.
DECISIONS: dict[str, Choice] = {"allow": "allow", "deny": "deny", "allow_chat": "chat"}

ApprovalRef = Annotated[str, PathParam(min_length=1, max_length=100)]


class ApprovalOut(BaseModel):
    """One request, as ``agentpost``'s ``--json`` shows it (:meth:`Approval.as_dict`), and whether it still
    waits for an answer (pending and its time not over)."""

    id: str
    agent: str
    tool: str
    command: str
    input: Any
    summary: str
    pattern: str
    status: str
    waiting: bool
    message_id: str
    run_id: str
    channel: str
    conversation: str
    sender_id: str
    sender: str
    decided_by: str
    decided_via: str
    for_chat: bool
    created_at: int
    expires_at: int
    decided_at: int


class DecisionIn(Body):
    """``POST /api/approvals/{id}``: allow once, deny, or allow this tool and pattern for the rest of the
    chat the request was asked in."""

    decision: Literal["allow", "deny", "allow_chat"]


class AnsweredOut(BaseModel):
    """An answer that decided the request: ``text`` says what became of it (as its chat is told)."""

    ok: bool
    outcome: Literal["applied"]
    text: str
    approval: ApprovalOut


def approval_out(approval: Approval, now: int) -> ApprovalOut:
    """The API's view of one request at ``now`` (epoch ms)."""
    return ApprovalOut(**approval.as_dict(), waiting=approval.waiting(now))


def listed(db: Database, include_recent: bool, limit: int) -> list[ApprovalOut]:
    """The requests still waiting (oldest first), then with ``include_recent`` the latest others (newest
    first, ``limit`` at most)."""
    now = now_ms()
    waiting = approvals.waiting(db)
    rows = list(waiting)
    if include_recent:
        shown = {a.id for a in waiting}
        rows += [a for a in approvals.recent(db, limit) if a.id not in shown]
    return [approval_out(a, now) for a in rows]


@router.get(
    "/approvals",
    summary="Agents' requests to use a tool that wait for an answer (?all=1: recent answered ones too)",
)
async def list_approvals(
    web: Web,
    include_recent: Annotated[
        bool, Query(alias="all", description="Also the latest requests that no longer wait.")
    ] = False,
    limit: Annotated[int, Query(ge=1, le=500, description="How many of the recent ones at most.")] = 50,
) -> list[ApprovalOut]:
    return await web.run(listed, web.db, include_recent, limit)


@router.post(
    "/approvals/{approval_id}",
    summary="Answer a request as an operator: allow, deny, or allow_chat (for the rest of its chat)",
    responses={
        404: {"description": "No such request"},
        409: {"description": "The request no longer waits (answered, timed out or its run stopped)"},
    },
)
async def answer_approval(approval_id: ApprovalRef, body: DecisionIn, web: Web) -> AnsweredOut:
    answered = await web.run(
        approvals.answer,
        web.db,
        web.queue.responses,
        approval_id,
        DECISIONS[body.decision],
        by=OPERATOR,
        via="api",
        asker=None,
    )
    now = now_ms()
    shown: dict[str, Any] = (
        {"approval": approval_out(answered.approval, now).model_dump()} if answered.approval else {}
    )
    if answered.outcome == "unknown":
        raise ApiError(404, answered.text, ok=False)
    if answered.outcome != "applied" or answered.approval is None:
        raise ApiError(409, answered.text, ok=False, outcome=answered.outcome, **shown)
    return AnsweredOut(
        ok=True, outcome="applied", text=answered.text, approval=approval_out(answered.approval, now)
    )
