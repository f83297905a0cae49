"""What agent runs cost: one ``run_usage`` row per run whose CLI reported tokens and cost (the claude CLI's
``result`` line), written in the transaction of the run's outcome, and the sums the CLI, the web API and
budgets read.

A row is attributed to its agent, the chat (channel and conversation) and the sender who started the chain:
a teammate's run in a handoff counts to the person whose message began it. Heartbeats and schedules have no
sender; they count to their agent only. Periods are UTC: a day starts at midnight, a month on its first.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from shared.clock import now_ms
from shared.storage.db import Database, Tx
from shared.storage.queries import usage as q

UsageBy = Literal["agent", "sender", "chat", "day"]
USAGE_BY: tuple[str, ...] = ("agent", "sender", "chat", "day")


@dataclass(frozen=True)
class UsageRecord:
    """One run's usage, with who it counts to."""

    agent: str
    run_id: str = ""
    message_id: str = ""
    channel: str = ""
    conversation: str = ""
    sender: str = ""  # ``<channel>:<sender id>`` of the chain's origin; "" for heartbeats and schedules
    sender_name: str = ""
    model: str = ""
    ok: bool = True
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    duration_ms: int = 0


@dataclass(frozen=True)
class UsageRow:
    """The sum over one group of runs (``key``: the agent, sender, chat or UTC day)."""

    key: str
    runs: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def record_usage_in(tx: Tx, record: UsageRecord, *, at: int | None = None) -> None:
    """Write one run's usage inside ``tx`` (the transaction of the run's outcome)."""
    tx.execute(
        q.RECORD,
        {**asdict(record), "ok": 1 if record.ok else 0, "created_at": now_ms() if at is None else at},
    )


def usage_rows(db: Database, by: str = "agent", since_ms: int | None = None) -> list[UsageRow]:
    """Sums per ``by`` (agent, sender, chat or day) of the runs since ``since_ms`` (all when None), the
    costliest first (by day: in date order)."""
    if by not in USAGE_BY:
        raise ValueError(f"unknown grouping {by!r} (use one of: {', '.join(USAGE_BY)})")
    statement = q.sums_by(by)
    try:
        rows = db.read(statement, {"since": since_ms or 0})
    except Exception as exc:
        # A database no processor has opened since this release: no run has been recorded yet.
        if "run_usage" not in str(exc):
            raise
        return []
    found: dict[str, list[float]] = {}
    for row in rows:
        name = day_of(int(row["k"])) if by == "day" else str(row["k"])
        sums = found.setdefault(name, [0, 0, 0, 0, 0, 0.0])
        for i, col in enumerate(("runs", "i", "o", "cr", "cw", "c")):
            sums[i] += row[col] or 0
    result = [
        UsageRow(name, int(s[0]), int(s[1]), int(s[2]), int(s[3]), int(s[4]), round(float(s[5]), 6))
        for name, s in found.items()
    ]
    if by == "day":
        return sorted(result, key=lambda r: r.key)
    return sorted(result, key=lambda r: (-r.cost_usd, -r.runs, r.key))


def spent_usd(db: Database, *, since_ms: int, sender: str | None = None, agent: str | None = None) -> float:
    """Dollars spent since ``since_ms`` by one sender (on every agent) or by one agent (every sender)."""
    if sender is not None:
        value = db.read_scalar(q.SPENT_BY_SENDER, {"s": sender, "t": since_ms})
    else:
        value = db.read_scalar(q.SPENT_BY_AGENT, {"a": agent or "", "t": since_ms})
    return float(value or 0)


def usd(amount: float) -> str:
    """Dollars for a person: cents from a dollar up, four places below (a short run costs about a cent)."""
    return f"${amount:.2f}" if amount >= 1 else f"${amount:.4f}"


def sender_usage_text(
    db: Database,
    sender: str,
    daily_limit: float | None,
    monthly_limit: float | None,
    now: int | None = None,
    *,
    exempt: bool = False,
) -> str:
    """The ``/usage`` answer: what ``sender`` (``channel:id``) spent today and this month, against limits
    (an ``exempt`` sender has none)."""
    now = now_ms() if now is None else now
    parts = []
    for label, since, limit, resets in (
        ("Today", day_start(now), daily_limit, "at midnight UTC"),
        ("This month", month_start(now), monthly_limit, "on the 1st, 00:00 UTC"),
    ):
        spent = spent_usd(db, since_ms=since, sender=sender)
        if exempt:
            bound = " (no limit: you are exempt)"
        elif limit:
            bound = f" of your {usd(limit)} limit (resets {resets})"
        else:
            bound = " (no limit)"
        parts.append(f"{label}: {usd(spent)}{bound}.")
    return "Your usage of the agents here — " + " ".join(parts)


# -- periods (UTC) ---------------------------------------------------------------------------------------
def day_of(ms: int) -> str:
    """The UTC date of an epoch-ms instant, ``YYYY-MM-DD``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


def day_start(ms: int) -> int:
    """Epoch ms of the UTC midnight that began the day of ``ms``."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return int(datetime(moment.year, moment.month, moment.day, tzinfo=UTC).timestamp() * 1000)


def next_day_start(ms: int) -> int:
    """Epoch ms of the next UTC midnight after ``ms`` (when a daily budget resets)."""
    start = datetime.fromtimestamp(day_start(ms) / 1000, UTC)
    return int((start + timedelta(days=1)).timestamp() * 1000)


def month_start(ms: int) -> int:
    """Epoch ms of the first of the UTC month of ``ms``, at midnight."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return int(datetime(moment.year, moment.month, 1, tzinfo=UTC).timestamp() * 1000)


def next_month_start(ms: int) -> int:
    """Epoch ms of the first of the next UTC month (when a monthly budget resets)."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    days = calendar.monthrange(moment.year, moment.month)[1]
    first = datetime(moment.year, moment.month, 1, tzinfo=UTC)
    return int((first + timedelta(days=days)).timestamp() * 1000)


_SINCE = re.compile(r"^\s*(\d+)\s*([mhdw])\s*$")
_UNIT_MS = {"m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000}


def parse_since(text: str, now: int | None = None) -> int:
    """``7d``, ``24h``, ``30m``, ``2w`` → epoch ms that long before ``now``; ``today`` → this UTC midnight;
    ``month`` → the first of this UTC month; ``all`` → 0 (every run recorded). Raises ``ValueError`` in
    plain words otherwise."""
    now = now_ms() if now is None else now
    word = text.strip().lower()
    if word == "all":
        return 0
    if word == "today":
        return day_start(now)
    if word == "month":
        return month_start(now)
    match = _SINCE.match(word)
    if match is None:
        raise ValueError(
            f"cannot read {text!r} as a time span; use e.g. 30m, 24h, 7d, 2w, today, month or all"
        )
    return now - int(match.group(1)) * _UNIT_MS[match.group(2)]
