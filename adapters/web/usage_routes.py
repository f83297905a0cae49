"""``/api/usage``: tokens and cost of agent runs per agent, sender, chat or UTC day (the same sums as
``agentpost usage --json``)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from shared.usage import parse_since, usage_rows

from .errors import ApiError
from .state import Web

router = APIRouter()


class UsageOut(BaseModel):
    """One group of runs: ``key`` is the agent, the sender (``channel:id``), the chat or the day."""

    key: str
    runs: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float


@router.get("/usage", summary="Tokens and cost of agent runs, grouped by agent, sender, chat or day")
async def usage(
    web: Web,
    by: Annotated[Literal["agent", "sender", "chat", "day"], Query()] = "agent",
    since: Annotated[str, Query(max_length=20, description="30m, 24h, 7d, 2w, today or month")] = "7d",
) -> list[UsageOut]:
    try:
        since_ms = parse_since(since)
    except ValueError as exc:
        raise ApiError(422, str(exc)) from None
    rows = await web.run(usage_rows, web.db, by, since_ms)
    return [UsageOut(**r.as_dict()) for r in rows]
