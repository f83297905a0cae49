"""Rate limits: when an agent may run again, the fallback model, and telling waiting chats once.

When a run reports a usage limit or an API 429 (``RunResult.rate_limited``), or the AI service's servers
overloaded, an API 529 (``RunResult.overloaded``: nobody's limit, and never told as one), the processor:

1. works out the reset time: :func:`parse_reset` reads it from the error text when the CLI reports one
   (``…limit reached|1760000000``, ``resets at 3pm (Europe/Berlin)``, ``resets at 2025-01-01T12:00Z``,
   ``retry after 30``, ``try again in 5 minutes``); otherwise an exponential backoff starting at
   ``[processor] rate_limit_pause_seconds`` that doubles with each consecutive limit of the agent, up to
   ``rate_limit_max_pause_seconds``;
2. if the agent has a ``fallback_model`` and the limited run did not already use it: records "use the
   fallback until the reset" (:mod:`shared.queue.model_fallback`, so every processor sees it and a restart
   keeps it) and gives the messages back at once without counting an attempt — the next runs use
   ``--model <fallback_model>`` until the reset time, then the primary model again. No pause, no notice.
3. otherwise (no fallback, or the fallback is limited too): pauses the *agent* until the reset with
   :meth:`shared.queue.control.Control.pause_agent`, gives back every message it held without counting an attempt,
   available at the reset, and enqueues one ``paused`` notice per waiting chat (kind ``paused``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from shared.backoff import Backoff
from shared.clock import now_ms
from shared.queue.core import Queue, group_by_conversation
from shared.reads.conversation_status import format_duration, format_time
from workers.errors import servers
from workers.liveness import note_target

#: A reset further away than this is not believed (a misread number); the backoff is used instead.
MAX_RESET_MS = 7 * 24 * 3600 * 1000

_EPOCH_RE = re.compile(r"\|\s*(\d{10,13})\b")
_AFTER_RE = re.compile(r"retry[-_ ]after[\"']?\s*[:=]?\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds)?\b", re.I)
_IN_RE = re.compile(
    r"(?:try again|retry|resets?|available)\s+in\s+(\d+(?:\.\d+)?)\s*"
    r"(seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h)\b",
    re.I,
)
_ISO_RE = re.compile(
    r"resets?\s+(?:at\s+)?(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)",
    re.I,
)
_CLOCK_RE = re.compile(
    r"resets?\s+(?:at\s+)?(\d{1,2})(?::(\d{2}))?\s*(am|pm)?(?:\s*\(([A-Za-z_]+(?:/[A-Za-z_+-]+)*)\))?", re.I
)
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000}


def parse_reset(text: str, now: int | None = None) -> int | None:
    """The reset time (epoch ms) a rate-limit message states, or ``None`` when it states none we trust."""
    now = now_ms() if now is None else now
    for candidate in _candidates(text, now):
        if candidate is not None and now < candidate <= now + MAX_RESET_MS:
            return candidate
    return None


def _candidates(text: str, now: int) -> list[int | None]:
    found: list[int | None] = []
    if m := _EPOCH_RE.search(text):
        value = int(m.group(1))
        found.append(value if value > 10**12 else value * 1000)
    if m := _AFTER_RE.search(text):
        unit = (m.group(2) or "s").lower()
        found.append(now + int(float(m.group(1)) * (1 if unit == "ms" else 1000)))
    if m := _IN_RE.search(text):
        found.append(now + int(float(m.group(1)) * _UNIT_MS[m.group(2)[0].lower()]))
    if m := _ISO_RE.search(text):
        raw = m.group(1).replace(" ", "T").replace("Z", "+00:00")
        try:
            moment = datetime.fromisoformat(raw)
        except ValueError:
            moment = None
        if moment is not None:
            moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
            found.append(int(moment.timestamp() * 1000))
    elif m := _CLOCK_RE.search(text):
        found.append(_next_clock(int(m.group(1)), int(m.group(2) or 0), m.group(3), m.group(4), now))
    return found


def _next_clock(hour: int, minute: int, half: str | None, zone: str | None, now: int) -> int | None:
    """The next time the wall clock in ``zone`` (UTC when unknown) shows ``hour:minute``."""
    if half:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if half.lower() == "pm" else 0)
    if hour > 23 or minute > 59:
        return None
    try:
        tz: Any = ZoneInfo(zone) if zone else UTC
    except (ZoneInfoNotFoundError, ValueError):
        tz = UTC
    current = datetime.fromtimestamp(now / 1000, tz)
    target = current.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if target <= current:
        target += timedelta(days=1)
    return int(target.timestamp() * 1000)


def backoff_ms(strikes: int, base_seconds: float, max_seconds: float) -> int:
    """The pause after the ``strikes``-th consecutive rate limit without a stated reset."""
    # No jitter: one agent's pause, shown to its users as a time; nothing retries in a herd.
    return Backoff(base_seconds, max_seconds, jitter=0).delay_ms(strikes)


# -- telling the waiting chats --------------------------------------------------------------------------
def paused_text(
    until: int, now: int, fallback_failed: bool = False, *, overloaded: bool = False, service: str = ""
) -> str:
    """The one notice a waiting chat gets when its agent is paused by a rate limit, or because ``service``'s
    servers are ``overloaded`` (the agent tries again then; it has hit no limit)."""
    if overloaded:
        also = " (for the fallback model too)" if fallback_failed else ""
        head = (
            f"{servers(service)[:1].upper()}{servers(service)[1:]} are overloaded{also}, so the agent is "
            "waiting before it tries again (this is not a usage limit)."
        )
        when = "tries again"
    else:
        why = "its usage limit (the fallback model too)" if fallback_failed else "a usage or rate limit"
        head, when = f"The agent has hit {why}.", "resumes"
    return (
        f"{head} Your message is kept and will be answered when it {when} at "
        f"{format_time(until)} (in about {format_duration(until - now)})."
    )


def notify_waiting_chats(queue: Queue, agent: str, until: int, text: str) -> list[str]:
    """Enqueue one ``paused`` notice to every chat with a message waiting for ``agent`` (pending or
    processing). Returns the chats told (``channel:conversation``)."""
    told: list[str] = []
    seen: set[tuple[str, str]] = set()
    for batch in group_by_conversation(queue.admin.waiting_messages(agent)):
        target = note_target(batch[0])
        if target is None:
            continue
        if target.key in seen:
            continue
        seen.add(target.key)
        queue.responses.enqueue_response(
            target,
            text,
            agent=agent,
            metadata={"kind": "paused", "until": until, "agent": agent},
            message_id=batch[0].message_id,
        )
        told.append(target.label)
    return told
