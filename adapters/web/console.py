"""Read views and chat actions the dashboard uses (any client may): whether a token is required, the chats
across channels, one chat's history page by page with its live state, sending in a web chat, stopping or
resetting one chat, each agent's state and the channels' health. Backed by :mod:`shared.reads.conversations`,
:mod:`shared.reads.conversation_status` and :mod:`shared.chat.health`; no SQL here."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import Field

from adapters.chat_commands import reset_conversation
from shared.chat import health
from shared.chat.address import ChatAddress
from shared.queue.core import EnqueueResult, NotFound, Queue, RetryBudgetExhausted, UnknownMention
from shared.queue.records import MAX_MESSAGE_CHARS
from shared.reads import conversations
from shared.storage.db import Database

from .errors import ApiError
from .params import NAME_PATTERN, Body, Name
from .state import Web

router = APIRouter()


class ChatIn(Body):
    """One chat: the conversation of a channel; ``agent`` for a reset (else the chat's agents)."""

    conversation: str = Field(min_length=1, max_length=500)
    agent: str | None = Field(default=None, pattern=NAME_PATTERN)


class TypedIn(Body):
    """A message typed in a web chat; ``agent`` is the one chosen beside the box (an ``@name`` at the start
    of the text wins over it)."""

    conversation: str = Field(min_length=1, max_length=500)
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    agent: str | None = Field(default=None, pattern=NAME_PATTERN)


def chosen_unless_named(queue: Queue, text: str, chosen: str | None) -> str | None:
    """The agent chosen beside the chat box, unless the text itself addresses someone: a leading ``@agent``
    or ``@team`` wins (as on every channel), and an unknown ``@name`` is left for the queue to refuse."""
    routes = queue.directory.routes  # the table the queue routes with
    if chosen is None or routes.unknown_mention(text) is not None or routes.resolve(text).explicit:
        return None
    return chosen


def send_typed(queue: Queue, body: TypedIn) -> EnqueueResult:
    """Queue a message typed in the web chat ``body.conversation``, routed as any channel's message."""
    agent = chosen_unless_named(queue, body.message, body.agent)
    return queue.intake.enqueue_message(
        ChatAddress("web", "web", conversation=body.conversation), body.message, agent=agent
    )


def unknown_name_refusal(exc: UnknownMention) -> ApiError:
    """``@nosuch …``: nothing was sent; who can be addressed instead, in words."""
    known = f"Agents: {', '.join('@' + a for a in exc.agents) or 'none'}."
    if exc.teams:
        known += f" Teams: {', '.join('@' + t for t in exc.teams)}."
    return ApiError(
        400,
        f"There is no agent or team called @{exc.name} here, so your message was not sent. {known}",
        unknown=exc.name,
        agents=exc.agents,
        teams=exc.teams,
    )


@router.post(
    "/conversations/web/messages",
    status_code=201,
    summary="Send a message in a web chat (an @agent at its start wins over the agent chosen)",
)
async def send_in_web_chat(body: TypedIn, web: Web) -> dict[str, Any]:
    try:
        result = await web.run(send_typed, web.queue, body)
    except UnknownMention as exc:
        raise unknown_name_refusal(exc) from None
    return {"ok": True, "messageId": result.message_id, "agent": result.agent}


@router.get(
    "/conversations",
    summary="Chats across channels, most recently active first, a page at a time (the next page's address "
    'is in the Link header, rel="next"; none on the last page)',
)
async def list_chats(
    web: Web,
    request: Request,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=conversations.MAX_PAGE)] = 50,
    before: Annotated[
        str | None,
        Query(pattern=r"^[0-9]{1,19}$", description="The cursor of the page to show (from a Link header)."),
    ] = None,
) -> list[dict[str, Any]]:
    page = await web.run(
        conversations.list_conversations, web.db, limit=limit, before=conversations.parse_cursor(before)
    )
    if page.next is not None:
        after = request.url.include_query_params(limit=limit, before=page.next)
        response.headers["Link"] = f'<{after.path}?{after.query}>; rel="next"'
    return page.chats


@router.get(
    "/conversations/{channel}/history",
    summary="One chat's messages and replies (oldest first), the newest before ?before=, and its state",
)
async def chat_history(
    channel: Name,
    web: Web,
    conversation: Annotated[str, Query(min_length=1, max_length=500)],
    before: Annotated[int, Query(ge=0, le=2**62, description="The time (ms) of the first item shown.")] = 0,
    beforeKind: Annotated[str, Query(pattern=r"^(message|reply)?$")] = "",
    beforeId: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> dict[str, Any]:
    return await web.run(
        conversations.conversation_history,
        web.db,
        ChatAddress(channel, conversation=conversation),
        before=before,
        before_kind=beforeKind,
        before_id=beforeId,
        limit=limit,
    )


@router.post("/conversations/{channel}/stop", summary="Stop the runs working for one chat")
async def stop_chat(channel: Name, body: ChatIn, web: Web) -> dict[str, Any]:
    chat = ChatAddress(channel, conversation=body.conversation)
    stopped = await web.run(web.queue.control.stop_chat, chat)
    return {"ok": True, "stopping": stopped}


@router.post("/conversations/{channel}/reset", summary="Start a fresh conversation with the chat's agent")
async def reset_chat(channel: Name, body: ChatIn, web: Web) -> dict[str, Any]:
    agent = body.agent or web.settings.queue.default_agent
    if agent not in web.settings.agents:
        raise ApiError(404, f"no agent {agent!r}")
    n = await web.run(
        reset_conversation, web.runtime, agent, ChatAddress(channel, conversation=body.conversation)
    )
    return {"ok": True, "agent": agent, "sessionsReset": int(n)}


@router.post("/conversations/{channel}/retry", summary="Try again the chat's last message that failed")
async def retry_chat(channel: Name, body: ChatIn, web: Web) -> dict[str, Any]:
    try:
        retried = await web.run(
            web.queue.admin.retry_last_failed, ChatAddress(channel, conversation=body.conversation)
        )
    except NotFound:
        raise ApiError(404, "there is no failed message in this chat to try again") from None
    except RetryBudgetExhausted:
        raise ApiError(
            409,
            "that message was already tried again as often as allowed; send it again as a new message",
        ) from None
    return {"ok": True, "messageId": retried.message_id, "agent": retried.agent}


@router.get("/console", summary="What the dashboard shows besides the data: budgets and defaults")
async def console_info(web: Web) -> dict[str, Any]:
    settings = web.settings
    processor = settings.file.processor
    return {
        "defaultAgent": settings.queue.default_agent,
        "manualRetryBudget": settings.queue.manual_retry_budget,
        "maxRetries": settings.queue.max_retries,
        "busyPolicy": str(processor.get("busy_policy") or "collect"),
        "idleTimeoutSeconds": float(processor.get("idle_timeout_seconds") or 600.0),
    }


@router.get("/agents-overview", summary="Each agent's state, queue depth and last error")
async def agents_overview(web: Web) -> dict[str, dict[str, Any]]:
    return await web.run(conversations.agent_overview, web.db, sorted(web.settings.agents))


def channel_rows(db: Database) -> list[dict[str, Any]]:
    """Each channel adapter's reported state, as ``GET /api/channels/health`` answers it."""
    return [
        {
            "channel": h.channel,
            "state": "not running" if h.adapter_gone else h.state,
            "since": h.since,
            "updatedAt": h.updated_at,
            "error": h.error,
            "attempts": h.attempts,
            "description": h.describe(),
        }
        for h in health.read_all(db)
    ]


@router.get("/channels/health", summary="Each channel adapter's connection state and last error")
async def channels_health(web: Web) -> list[dict[str, Any]]:
    return await web.run(channel_rows, web.db)
