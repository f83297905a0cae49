"""``/api/usage``: tokens and cost of agent runs per agent, sender, chat or UTC day (the same sums as
``agentpost usage --json``); ``/api/usage/budgets``: who is over a ``[budgets]`` limit now. The dashboard's
cost view reads both."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from shared.clock import now_ms
from shared.reads.budget_status import any_limit, over_budget_now
from shared.reads.usage import parse_since, usage_rows

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
    since: Annotated[str, Query(max_length=20, description="30m, 24h, 7d, 2w, today, month or all")] = "7d",
) -> list[UsageOut]:
    try:
        since_ms = parse_since(since)
    except ValueError as exc:
        raise ApiError(422, str(exc)) from None
    rows = await web.run(usage_rows, web.db, by, since_ms)
    return [UsageOut(**r.as_dict()) for r in rows]


class OverBudgetOut(BaseModel):
    """A sender or agent at or past a limit now: messages from (or for) them are not run until it resets."""

    whose: Literal["sender", "agent"]
    who: str
    period: Literal["daily", "monthly"]
    spent_usd: float
    limit_usd: float
    resets_at: int
    #: The agents a sender's limit holds for, when overrides make it differ per agent (empty: every agent).
    agents: list[str]
    setting: str


class BudgetsOut(BaseModel):
    """Whether any ``[budgets]`` limit is set, and who is over one now."""

    limits_set: bool
    over: list[OverBudgetOut]


@router.get(
    "/usage/budgets", summary="Who is over a [budgets] limit now, with what was spent and when it resets"
)
async def usage_budgets(web: Web) -> BudgetsOut:
    settings = web.settings
    found = await web.run(over_budget_now, web.db, settings.budgets, list(settings.agents), now_ms())
    return BudgetsOut(
        limits_set=any_limit(settings.budgets), over=[OverBudgetOut(**o.as_dict()) for o in found]
    )
