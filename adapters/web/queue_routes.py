"""``/api/message`` and ``/api/queue/…``: queue a message, the queue's counts, what is being processed (and
stopping it), dead letters."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import Field

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.ids import MESSAGE_ID_RE
from shared.queue.core import Queue
from shared.queue.records import MAX_MESSAGE_CHARS
from shared.reads import api_views
from shared.storage.db import Database

from .dialect import KillOut, MessageAccepted, ProcessingOut, QueueStatusOut, processing_out, queue_status_out
from .errors import ApiError
from .params import NAME_PATTERN, Body
from .state import Web

DeadRef = Annotated[str, PathParam(pattern=r"^([0-9]{1,18}|" + MESSAGE_ID_RE.pattern[1:-1] + ")$")]
RowId = Annotated[int, PathParam(ge=1, le=2**62)]

router = APIRouter()


class MessageIn(Body):
    """``POST /api/message``: queue a message (seed 000's fields)."""

    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    agent: str | None = Field(default=None, pattern=NAME_PATTERN)
    sender: str = Field(default="web", max_length=200)
    senderId: str = Field(default="", max_length=200)
    channel: str = Field(default="web", pattern=NAME_PATTERN)
    messageId: str | None = Field(default=None, pattern=MESSAGE_ID_RE.pattern)
    conversation: str = Field(default="", max_length=500)


@router.post("/message", status_code=201, summary="Queue a message")
async def post_message(body: MessageIn, web: Web) -> MessageAccepted:
    result = await web.run(
        web.queue.intake.enqueue_message,
        ChatAddress(body.channel, body.sender, sender_id=body.senderId, conversation=body.conversation),
        body.message,
        message_id=body.messageId,
        agent=body.agent,
    )
    if result.duplicate:
        raise ApiError(
            409,
            f"message id {result.message_id} is already queued",
            ok=False,
            messageId=result.message_id,
            agent=result.agent,
            duplicate=True,
        )
    return MessageAccepted(ok=True, messageId=result.message_id, agent=result.agent, duplicate=False)


def read_queue_status(queue: Queue, db: Database) -> QueueStatusOut:
    """The queue's counts and how many chats are busy, as ``GET /api/queue/status`` answers them."""
    return queue_status_out(queue.admin.queue_status(), api_views.active_conversations(db))


@router.get("/queue/status", summary="Messages per status and undelivered responses")
async def queue_status(web: Web) -> QueueStatusOut:
    return await web.run(read_queue_status, web.queue, web.db)


@router.get("/queue/agents", summary="Pending and processing messages per agent")
async def queue_agents(web: Web) -> list[dict[str, Any]]:
    return await web.run(web.queue.admin.agent_queue_depths)


@router.get("/queue/processing", summary="Messages being processed now")
async def queue_processing(web: Web) -> list[ProcessingOut]:
    now = now_ms()
    return [processing_out(m, now) for m in await web.run(web.queue.admin.list_processing)]


@router.post("/queue/processing/{row_id}/kill", summary="Stop the run working on a message")
async def kill_session(row_id: RowId, web: Web) -> KillOut:
    def stop() -> KillOut:
        row = api_views.processing_message(web.db, row_id)
        if row is None:
            raise ApiError(404, f"message {row_id} is not being processed")
        web.queue.control.request_stop(str(row["agent"]), str(row["conversation"] or "*"))
        return KillOut(ok=True, agent=str(row["agent"]), processKilled=row["run_started_at"] is not None)

    return await web.run(stop)


@router.get("/queue/dead", summary="Dead letters, newest first")
async def queue_dead(
    web: Web,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> list[dict[str, Any]]:
    return [m.as_dict() for m in await web.run(web.queue.admin.list_dead, limit, offset)]


@router.post("/queue/dead/{ref}/retry", summary="Retry a dead letter (row id or message id)")
async def retry_dead(ref: DeadRef, web: Web) -> dict[str, Any]:
    row = await web.run(web.queue.admin.retry_dead, ref)
    return {"ok": True, "message": row.as_dict()}


@router.delete("/queue/dead/{ref}", summary="Delete a dead letter for good")
async def delete_dead(ref: DeadRef, web: Web) -> dict[str, Any]:
    row = await web.run(web.queue.admin.delete_dead, ref)
    return {"ok": True, "messageId": row.message_id}
