"""Who is over a ``[budgets]`` limit: the one check the processor makes before a run
(:class:`workers.budgets.BudgetGate`), and the list of everyone over a limit now that ``agentpost doctor``,
``GET /api/usage/budgets`` (the dashboard) and ``/usage`` in the operator's chat show.

Spending is read from ``run_usage`` through :mod:`shared.reads.usage`; periods are UTC days and months. A sender's
limits can differ per agent (``[budgets.agents.<name>]`` overrides ``sender_*`` too), so a sender can be
held for one agent and not another; the list says for which agents when that is so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared.reads.conversation_status import format_duration
from shared.reads.usage import (
    day_start,
    month_start,
    next_day_start,
    next_month_start,
    spent_usd,
    usage_rows,
    usd,
)
from shared.settings.sections import BudgetLimits, BudgetSettings
from shared.storage.db import Database

#: How the reason of a message not run for a budget begins (its ``last_error``; ``trace`` looks for it).
OVER_BUDGET_PREFIX = "over budget: "

PERIODS: tuple[str, ...] = ("daily", "monthly")


@dataclass(frozen=True)
class OverBudget:
    """A sender or agent at or past one limit: who, what was spent, the limit, and when it resets."""

    whose: str  # "sender" or "agent"
    who: str  # the sender (``channel:id``) or the agent
    agent: str  # the agent the check was made for ("" in a list, where ``agents`` says)
    period: str  # "daily" or "monthly"
    spent: float
    limit: float
    resets_at: int
    #: In a list: the agents a sender's limit holds for, when it is not every agent (overrides differ).
    agents: tuple[str, ...] = ()
    #: The agent whose ``[budgets.agents.<name>]`` set this limit ("": the ``[budgets]`` section).
    override: str = ""

    @property
    def setting(self) -> str:
        """The settings key of the limit, e.g. ``budgets.sender_daily_usd``."""
        key = f"{self.whose}_{self.period}_usd"
        return f"budgets.agents.{self.override}.{key}" if self.override else f"budgets.{key}"

    def error(self) -> str:
        """For the operator (the message's last error, ``trace``, ``dead list``)."""
        return (
            f"{OVER_BUDGET_PREFIX}{self.whose} {self.who} spent ${self.spent:.4f} of the {self.period} limit "
            f"${self.limit:.4f} ({self.setting}); resets {when(self.resets_at)}"
        )

    def summary(self) -> str:
        """One line for a list (``doctor``, the operator's ``/usage``)."""
        scope = f" (for {', '.join('@' + a for a in self.agents)})" if self.agents else ""
        return (
            f"{self.whose} {self.who}{scope}: {usd(self.spent)} of the {self.period} limit "
            f"{usd(self.limit)}, resets {when(self.resets_at)}"
        )

    def explanation(self) -> str:
        """For the sender, in plain words."""
        period = "today" if self.period == "daily" else "this month"
        if self.whose == "sender":
            return (
                f"you have used {usd(self.spent)} {period}, and your {self.period} limit is {usd(self.limit)}"
            )
        return f"it has used {usd(self.spent)} {period}, and its {self.period} limit is {usd(self.limit)}"

    def advice(self, now: int) -> str:
        """What the sender can do, and when."""
        return (
            f"The limit resets {when(self.resets_at)} (in {format_duration(self.resets_at - now)}); send "
            "your message again after that, or ask the operator to raise the limit."
        )

    def as_dict(self) -> dict[str, Any]:
        """For the web API (``GET /api/usage/budgets``)."""
        return {
            "whose": self.whose,
            "who": self.who,
            "period": self.period,
            "spent_usd": round(self.spent, 6),
            "limit_usd": self.limit,
            "resets_at": self.resets_at,
            "agents": list(self.agents),
            "setting": self.setting,
        }


def when(ms: int) -> str:
    """When a limit resets, for a person: a UTC midnight, or the 1st of a month."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    if moment.day == 1 and moment.hour == 0 and moment.minute == 0:
        return f"on {moment:%B} 1 at 00:00 UTC"
    return f"at midnight UTC ({moment:%Y-%m-%d} 00:00)"


def _window(period: str, now: int) -> tuple[int, int]:
    """Where ``period`` began and when it resets."""
    if period == "daily":
        return day_start(now), next_day_start(now)
    return month_start(now), next_month_start(now)


def _limit(limits: BudgetLimits, whose: str, period: str) -> float:
    value: float | None = getattr(limits, f"{whose}_{period}_usd")
    return value or 0.0


def _override(budgets: BudgetSettings, agent: str, whose: str, period: str) -> str:
    """``agent`` when its own ``[budgets.agents.<agent>]`` sets this limit, else ""."""
    own = budgets.agents.get(agent)
    return agent if own is not None and f"{whose}_{period}_usd" in own.model_fields_set else ""


def check_over(
    db: Database, whose: str, who: str, agent: str, budgets: BudgetSettings, now: int
) -> OverBudget | None:
    """The first limit (daily, then monthly) ``who`` has reached — a sender on every agent, or an agent for
    every sender — or None. ``agent`` is the agent the message is for (its overrides apply)."""
    limits = budgets.for_agent(agent)
    for period in PERIODS:
        limit = _limit(limits, whose, period)
        if not limit:
            continue
        since, resets = _window(period, now)
        if whose == "sender":
            spent = spent_usd(db, since_ms=since, sender=who)
        else:
            spent = spent_usd(db, since_ms=since, agent=who)
        if spent >= limit:
            source = _override(budgets, agent, whose, period)
            return OverBudget(whose, who, agent, period, spent, limit, resets, override=source)
    return None


def any_limit(budgets: BudgetSettings) -> bool:
    """Whether any limit is set at all (in the section or an agent's override)."""
    sets = [budgets, *budgets.agents.values()]
    return any(_limit(s, w, p) for s in sets for w in ("sender", "agent") for p in PERIODS)


def over_budget_now(
    db: Database, budgets: BudgetSettings, agents: Iterable[str], now: int
) -> list[OverBudget]:
    """Everyone over a limit at ``now``: agents first, then senders (not the exempt ones), by name."""
    configured = sorted(set(agents))
    found: list[OverBudget] = []
    for period in PERIODS:
        since, resets = _window(period, now)
        by_agent = {r.key: r.cost_usd for r in usage_rows(db, "agent", since)}
        for agent in sorted(set(configured) | set(by_agent)):
            limit = _limit(budgets.for_agent(agent), "agent", period)
            spent = by_agent.get(agent, 0.0)
            if limit and spent >= limit:
                source = _override(budgets, agent, "agent", period)
                found.append(OverBudget("agent", agent, agent, period, spent, limit, resets, override=source))
        # A sender's limit for each agent; senders spend on every agent, so one sum holds for all of them.
        holds: dict[float, list[str]] = {}
        for agent in configured or [""]:
            holds.setdefault(_limit(budgets.for_agent(agent), "sender", period), []).append(agent)
        for row in usage_rows(db, "sender", since):
            if not row.key or row.key in budgets.exempt_senders:
                continue
            for limit, held in sorted(holds.items()):
                if limit and row.cost_usd >= limit:
                    scope = tuple(held) if len(held) < len(configured) else ()
                    # One agent's own override set it: name that key (several share a value: the section's).
                    source = _override(budgets, held[0], "sender", period) if len(held) == 1 else ""
                    over = OverBudget(
                        "sender", row.key, "", period, row.cost_usd, limit, resets, scope, source
                    )
                    found.append(over)
    return sorted(found, key=lambda o: (o.whose != "agent", o.who, PERIODS.index(o.period), o.limit))


def agents_usage_text(db: Database, budgets: BudgetSettings, agents: Iterable[str], now: int) -> str:
    """For the operator's chat (``/usage`` there): each agent's spend today and this month against its
    limits, and who is over a limit now."""
    today = {r.key: r for r in usage_rows(db, "agent", day_start(now))}
    month = {r.key: r for r in usage_rows(db, "agent", month_start(now))}
    lines = ["Agents (UTC days and months):"]
    for agent in sorted(set(agents) | set(month)):
        limits = budgets.for_agent(agent)
        spent = []
        for label, rows, period in (("today", today, "daily"), ("this month", month, "monthly")):
            row = rows.get(agent)
            limit = _limit(limits, "agent", period)
            bound = f" of {usd(limit)}" if limit else ""
            spent.append(f"{usd(row.cost_usd if row else 0.0)}{bound} {label}")
        runs = month[agent].runs if agent in month else 0
        lines.append(f"@{agent}: {', '.join(spent)} ({runs} run{'' if runs == 1 else 's'} this month)")
    over = over_budget_now(db, budgets, agents, now)
    if over:
        lines.append("Over budget now (their messages are not run):")
        lines += [f"- {o.summary()}" for o in over]
    else:
        lines.append("No one is over budget.")
    return "\n".join(lines)
