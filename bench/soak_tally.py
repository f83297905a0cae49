"""The soak's count, made from what the people in the chats saw (the platform fakes' records), not from
agentpost's own tables: which messages got a final reply, which got two, which chunks arrived twice, which
replies came out of order, and how long agentpost itself took (enqueue → final minus the model's own time).

A final reply is a platform message carrying the fake API's ``(r<serial>)`` mark: the serial names the API
call whose answer it is, so the same reply delivered twice (a *repeated chunk*: the adapter sent it again
after a kill) and two runs answering one message (a *duplicate final*) are told apart. A message without a
final counts as *told* when its chat was sent the "could not answer your message" notice and the queue holds
it as dead; anything else is *lost*.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from soak_chaos import ApiCall

from tests.crash_support import labels_in

SERIAL_RE = re.compile(r"\(r(\d+)\)")
GAVE_UP = "could not answer your message"


@dataclass(frozen=True)
class Sent:
    """One message a user sent: its label, chat, and when it was pushed into the platform."""

    label: str
    chat: int
    at: float


@dataclass(frozen=True)
class Seen:
    """One text the bot put in a chat, or an edit of one: ``key`` names the platform message."""

    chat: int
    key: str
    text: str
    at: float
    edit: bool


@dataclass
class Tally:
    """The counts the soak reports (see the module docstring)."""

    sent: int = 0
    answered: int = 0
    finals_received: int = 0
    told: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    duplicate_finals: list[str] = field(default_factory=list)
    repeated_chunks: list[dict[str, Any]] = field(default_factory=list)
    out_of_order_chats: int = 0
    out_of_order_pairs: int = 0
    overhead_ms: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)


def _serial(text: str) -> int | None:
    found = SERIAL_RE.search(text)
    return int(found.group(1)) if found else None


def count(
    sent: Sequence[Sent],
    seen: Iterable[Seen],
    calls: Sequence[ApiCall],
    dead_labels: set[str],
) -> Tally:
    """The tally of a soak: ``sent`` by the driver, ``seen`` on the platforms, ``calls`` the fake API
    answered, ``dead_labels`` the messages the queue holds as dead (failed for good)."""
    tally = Tally(sent=len(sent))
    by_chat: dict[int, list[Seen]] = defaultdict(list)
    for item in seen:
        by_chat[item.chat].append(item)
    # The first time each (chat, serial) final was shown, and every platform message that carried it.
    first_final: dict[tuple[int, str], float] = {}
    serials_of: dict[tuple[int, str], set[int]] = defaultdict(set)
    copies: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    # What a chat shows in the end is each platform message's last version: a live preview edited into the
    # answer is one message, and a preview a killed run left behind (edited to say it was interrupted) is no
    # reply at all. A message counts from the first time one of its versions showed the text it ends with.
    versions: dict[tuple[int, str], list[Seen]] = defaultdict(list)
    for item in sorted(seen, key=lambda s: s.at):
        versions[(item.chat, item.key)].append(item)
    for (chat, key), items in versions.items():
        serial = _serial(items[-1].text)
        if serial is None:
            continue
        shown = next(v.at for v in items if _serial(v.text) == serial)
        copies[(chat, serial)][key] = shown
        for lbl in labels_in(items[-1].text):
            serials_of[(chat, lbl)].add(serial)
            first_final[(chat, lbl)] = min(shown, first_final.get((chat, lbl), shown))
    tally.finals_received = len(copies)
    for (chat, serial), keys in copies.items():
        if len(keys) > 1:
            times = sorted(keys.values())
            tally.repeated_chunks.append(
                {"chat": chat, "serial": serial, "copies": len(keys), "at": times[1]}
            )
    told_chats = {chat: [s.at for s in items if GAVE_UP in s.text] for chat, items in by_chat.items()}
    model_of: dict[str, list[ApiCall]] = defaultdict(list)
    for call in calls:
        for lbl in call.labels:
            model_of[lbl].append(call)
    per_chat: dict[int, list[Sent]] = defaultdict(list)
    for message in sent:
        per_chat[message.chat].append(message)
        key = (message.chat, message.label)
        if key in first_final:
            tally.answered += 1
            if len(serials_of[key]) > 1:
                tally.duplicate_finals.append(message.label)
            final_at = first_final[key]
            model = sum(c.model_seconds for c in model_of[message.label] if c.at < final_at)
            tally.latency_ms.append((final_at - message.at) * 1000)
            tally.overhead_ms.append((final_at - message.at - model) * 1000)
        elif message.label in dead_labels and any(t > message.at for t in told_chats.get(message.chat, [])):
            tally.told.append(message.label)
        else:
            tally.lost.append(message.label)
    for chat, messages in per_chat.items():
        answered = [(m.at, first_final[(chat, m.label)]) for m in messages if (chat, m.label) in first_final]
        answered.sort()
        pairs = sum(1 for i, (_, a) in enumerate(answered) for _, b in answered[i + 1 :] if b < a)
        if pairs:
            tally.out_of_order_chats += 1
            tally.out_of_order_pairs += pairs
    return tally


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank rule; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def repeats_per_kill(
    repeats: Sequence[Mapping[str, Any]], kills: Mapping[str, list[float]], chat_platform: Any
) -> dict[str, Any]:
    """Repeated chunks attributed to the adapter kill that came last before the second copy."""
    out: dict[str, Any] = {}
    for kind in ("telegram", "discord"):
        times = sorted(kills.get(kind, []))
        mine = [r for r in repeats if chat_platform(r["chat"]) == kind]
        per_kill: dict[int, int] = defaultdict(int)
        unattributed = 0
        for repeat in mine:
            before = [i for i, t in enumerate(times) if t <= repeat["at"]]
            if before:
                per_kill[before[-1]] += repeat["copies"] - 1
            else:
                unattributed += repeat["copies"] - 1
        out[kind] = {
            "kills": len(times),
            "repeated_chunks": sum(r["copies"] - 1 for r in mine),
            "per_kill": [per_kill.get(i, 0) for i in range(len(times))],
            "without_a_kill_before": unattributed,
        }
    return out


def summary(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p99, mean and max of ``values`` (milliseconds), rounded."""

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 1)

    return {
        "n": len(values),
        "p50": r(percentile(values, 0.5)),
        "p99": r(percentile(values, 0.99)),
        "mean": r(statistics.fmean(values)) if values else None,
        "max": r(max(values)) if values else None,
    }
