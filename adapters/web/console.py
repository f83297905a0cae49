"""Read views and chat actions the dashboard uses (any client may): whether a token is required, the chats
across channels, one chat's history page by page with its live state, stopping or resetting one chat, each
agent's state and the channels' health. Backed by :mod:`shared.conversations`,
:mod:`shared.conversation_status` and :mod:`shared.channel_health`; no SQL here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from adapters.chat_commands import reset_conversation
from shared import channel_health, conversations
from shared.queue import NotFound, RetryBudgetExhausted
from shared.runtime import Runtime

from .errors import ApiError

NAME = r"^[a-z0-9][a-z0-9_-]{0,31}$"
Run = Callable[..., Awaitable[Any]]


class ChatIn(BaseModel):
    """One chat: the conversation of a channel; ``agent`` for a reset (else the chat's agents)."""

    model_config = ConfigDict(extra="ignore")
    conversation: str = Field(min_length=1, max_length=500)
    agent: str | None = Field(default=None, pattern=NAME)


def console_router(runtime: Runtime, run: Run) -> APIRouter:
    """The routes above, over ``runtime`` (``run``: a blocking call off the event loop, as in ``create_app``)."""
    api = APIRouter()
    db = runtime.db

    @api.get("/conversations", summary="Chats across channels, most recently active first")
    async def list_chats(limit: Annotated[int, Query(ge=1, le=500)] = 50) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await run(conversations.list_conversations, db, limit=limit)
        return rows

    @api.get(
        "/conversations/{channel}/history",
        summary="One chat's messages and replies (oldest first), the newest before ?before=, and its state",
    )
    async def chat_history(
        channel: Annotated[str, PathParam(pattern=NAME)],
        conversation: Annotated[str, Query(min_length=1, max_length=500)],
        before: Annotated[
            int, Query(ge=0, le=2**62, description="The time (ms) of the first item shown.")
        ] = 0,
        beforeKind: Annotated[str, Query(pattern=r"^(message|reply)?$")] = "",
        beforeId: Annotated[int, Query(ge=0, le=2**62)] = 0,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
    ) -> dict[str, Any]:
        page: dict[str, Any] = await run(
            conversations.conversation_history,
            db,
            channel,
            conversation,
            before=before,
            before_kind=beforeKind,
            before_id=beforeId,
            limit=limit,
        )
        return page

    @api.post("/conversations/{channel}/stop", summary="Stop the runs working for one chat")
    async def stop_chat(channel: Annotated[str, PathParam(pattern=NAME)], body: ChatIn) -> dict[str, Any]:
        def stop() -> list[str]:
            page = conversations.conversation_history(db, channel, body.conversation, limit=1)
            status = page["status"]
            if not status["running"]:
                return []
            agent = str(status["agent"])
            runtime.queue.request_stop(agent, f"{channel}:{body.conversation}")
            return [agent]

        stopped: list[str] = await run(stop)
        return {"ok": True, "stopping": stopped}

    @api.post("/conversations/{channel}/reset", summary="Start a fresh conversation with the chat's agent")
    async def reset_chat(channel: Annotated[str, PathParam(pattern=NAME)], body: ChatIn) -> dict[str, Any]:
        agent = body.agent or runtime.settings.queue.default_agent
        if agent not in runtime.settings.agents:
            raise ApiError(404, f"no agent {agent!r}")
        n = await run(reset_conversation, runtime, agent, channel, body.conversation)
        return {"ok": True, "agent": agent, "sessionsReset": int(n)}

    @api.post("/conversations/{channel}/retry", summary="Try again the chat's last message that failed")
    async def retry_chat(channel: Annotated[str, PathParam(pattern=NAME)], body: ChatIn) -> dict[str, Any]:
        try:
            retried = await run(runtime.queue.retry_last_failed, channel, body.conversation)
        except NotFound:
            raise ApiError(404, "there is no failed message in this chat to try again") from None
        except RetryBudgetExhausted:
            raise ApiError(
                409,
                "that message was already tried again as often as allowed; send it again as a new message",
            ) from None
        return {"ok": True, "messageId": retried.message_id, "agent": retried.agent}

    @api.get("/console", summary="What the dashboard shows besides the data: budgets and defaults")
    async def console_info() -> dict[str, Any]:
        settings = runtime.settings
        processor = settings.file.processor
        return {
            "defaultAgent": settings.queue.default_agent,
            "manualRetryBudget": settings.queue.manual_retry_budget,
            "maxRetries": settings.queue.max_retries,
            "busyPolicy": str(processor.get("busy_policy") or "collect"),
            "idleTimeoutSeconds": float(processor.get("idle_timeout_seconds") or 600.0),
        }

    @api.get("/agents-overview", summary="Each agent's state, queue depth and last error")
    async def agents_overview() -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = await run(
            conversations.agent_overview, db, sorted(runtime.settings.agents)
        )
        return found

    @api.get("/channels/health", summary="Each channel adapter's connection state and last error")
    async def channels_health() -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
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
                for h in channel_health.read_all(db)
            ]

        rows: list[dict[str, Any]] = await run(read)
        return rows

    return api
