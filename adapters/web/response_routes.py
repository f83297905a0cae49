"""``/api/responses…``: recent replies, the replies a channel (or one chat) still has to deliver, acks, and
proactive messages (TinyAGI's send-message skill)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import Field

from shared.chat.address import ChatAddress
from shared.file_access import check_send_path, send_roots
from shared.queue.records import MAX_MESSAGE_CHARS
from shared.reads import api_views
from shared.settings.model import Settings

from .dialect import AckOut, ProactiveAccepted, ResponseOut, response_out
from .errors import ApiError
from .params import NAME_PATTERN, Body
from .state import Web, WebState

router = APIRouter()


class ProactiveIn(Body):
    """``POST /api/responses``: send a message nobody asked for."""

    channel: str = Field(pattern=NAME_PATTERN)
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    sender: str = Field(default="", max_length=200)
    senderId: str = Field(default="", max_length=200)
    conversation: str = Field(default="", max_length=500)
    agent: str = Field(default="", max_length=32)
    files: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=10)


@router.get("/responses", summary="Recent responses, newest first")
async def responses(
    web: Web,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    channel: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
) -> list[ResponseOut]:
    return [response_out(r) for r in await web.run(web.queue.admin.list_responses, limit, channel)]


@router.get("/responses/pending", summary="Undelivered responses of one channel, oldest first")
async def responses_pending(
    web: Web,
    channel: Annotated[str, Query(pattern=NAME_PATTERN)],
    conversation: Annotated[str | None, Query(max_length=500)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[ResponseOut]:
    if conversation is None:
        rows = await web.run(web.queue.admin.list_responses, limit, channel, True)
    else:
        chat = ChatAddress(channel, conversation=conversation)
        rows = await web.run(api_views.pending_chat_replies, web.db, chat, limit)
    return [response_out(r) for r in rows]


@router.post("/responses/{response_id}/ack", summary="Mark a response delivered")
async def ack_response(response_id: Annotated[int, PathParam(ge=1, le=2**62)], web: Web) -> AckOut:
    changed = await web.run(web.queue.responses.ack_response, response_id)
    return AckOut(ok=True, acked=bool(changed))


@router.post("/responses", status_code=201, summary="Queue a proactive message")
async def post_response(body: ProactiveIn, web: Web) -> ProactiveAccepted:
    conversation = body.conversation or await _chat_of_sender(web, body)
    # Read now, not at start-up: agents added since (settings.toml is reloaded) have workspaces too.
    files = await web.run(checked_files, web.settings, body, conversation) if body.files else []
    row = await web.run(
        web.queue.responses.enqueue_response,
        ChatAddress(body.channel, body.sender, sender_id=body.senderId, conversation=conversation),
        body.message,
        agent=body.agent,
        files=files,
    )
    return ProactiveAccepted(ok=True, messageId=row.message_id, response=response_out(row))


async def _chat_of_sender(web: WebState, body: ProactiveIn) -> str:
    """The chat a proactive message given only ``senderId`` goes to (400 when none is known)."""
    if not body.senderId:
        raise ApiError(400, "give senderId (the user to write to) or conversation (the chat)")
    found = await web.run(api_views.chat_of_sender, web.db, body.channel, body.senderId)
    if found is None:
        raise ApiError(
            400,
            f"no chat with sender {body.senderId!r} on {body.channel} is known yet (they have not "
            "written here lately); give conversation (the chat id)",
        )
    return found


def checked_files(settings: Settings, body: ProactiveIn, conversation: str) -> list[str]:
    """The files of a proactive message, each resolved and inside the roots a reply of its agent to its
    chat may send from (:mod:`shared.file_access`: the agent's workspace, that chat's uploads)."""
    roots = send_roots(settings, body.agent, ChatAddress(body.channel, conversation=conversation))
    base = settings.workspace(body.agent) if body.agent in settings.agents else None
    resolved = []
    for raw in body.files:
        try:
            path, reason = check_send_path(raw, roots, base)
        except (RuntimeError, ValueError, OSError) as exc:  # e.g. "~nobody/x": no such home folder
            raise ApiError(400, f"files: cannot resolve {raw!r}: {exc}", file=raw) from None
        if path is None:
            raise ApiError(400, f"files: refusing to send {raw!r}: {reason}", file=raw)
        resolved.append(path)
    return resolved
