"""One message's whole story, told from the event log: ``agentpost trace MESSAGE_ID``.

Events name their message ids (the ``message_id`` column, and ``message_ids`` in group payloads), so the
life of a message — received, routed, claimed, each run, handoffs, the response, each chunk, the ack — can be
read back in order, followed by a plain sentence saying why it stands where it stands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared.clock import now_ms
from shared.events.entries import EventEntry
from shared.events.log import entry_from_row, last_id_before
from shared.reads.budget_status import OVER_BUDGET_PREFIX
from shared.storage.db import Database
from shared.storage.queries import trace as q
from shared.storage.statuses import MessageStatus, ResponseStatus


@dataclass(frozen=True)
class Trace:
    """A message's events, its current row (if still kept) and the verdict."""

    message_id: str
    message: dict[str, Any] | None
    responses: list[dict[str, Any]]
    events: list[EventEntry]
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "message": self.message,
            "responses": self.responses,
            "events": [e.as_dict() for e in self.events],
            "verdict": self.verdict,
        }


#: How long before a message's ``created_at`` its trace starts reading the event log: events are in time
#: order only up to the clocks of the hosts that wrote them.
CLOCK_MARGIN_MS = 3_600_000


def _events_for(db: Database, message_id: str, created_at: int | None) -> list[EventEntry]:
    # Without its row (archived, pruned) the message's time is unknown: the whole log is read.
    after = None
    if created_at is not None:
        with db.transaction(write=False) as tx:
            after = last_id_before(tx, created_at - CLOCK_MARGIN_MS)
    rows = db.read(
        q.EVENTS_OF_MESSAGE, {"m": message_id, "pattern": f'%"{message_id}"%', "after": after or -(2**62)}
    )
    return [entry_from_row(r) for r in rows]


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(ms: int, now: int) -> str:
    seconds = max(0, (now - ms) // 1000)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _verdict(
    message: dict[str, Any] | None,
    responses: list[dict[str, Any]],
    events: list[EventEntry],
    now: int,
    db: Database,
) -> str:
    types = [e.type for e in events]
    if message is None:
        finals = [r for r in responses if r["metadata"].get("kind") not in _NOT_REPLIES]
        if finals and finals[-1]["status"] != ResponseStatus.ACKED:
            return _delivery_verdict(finals[-1], now)
        if not events:
            return "unknown: no message and no event has this id (wrong id, or pruned long ago)"
        if "message_deleted" in types:
            return "deleted by an operator as a dead letter"
        if "response_acked" in types:
            return "delivered; the message row was pruned after its retention period"
        return "the message row is gone (pruned or archived); see the events above"
    status = message["status"]
    if status == MessageStatus.PENDING:
        paused = db.read_scalar(q.AGENT_PAUSED_UNTIL, {"a": message["agent"]})
        if paused is not None and int(paused) > now:
            return (
                f"paused: agent {message['agent']} is rate-limited until {_when(int(paused))}; it runs then"
            )
        if int(message["available_at"]) > now:
            return (
                f"waiting to retry at {_when(int(message['available_at']))} after {message['retry_count']} failed "
                f"attempt(s); last error: {message['last_error']}"
            )
        return f"queued for agent {message['agent']}: waiting for a processor to pick it up"
    if status == MessageStatus.PROCESSING:
        lease = int(message["lease_until"] or 0)
        state = (
            "its lease is live"
            if lease >= now
            else "its lease EXPIRED: the worker died; it will be recovered"
        )
        running = (
            f"running on {message['claimed_by']} since {_ago(int(message['updated_at']), now)} ago; {state}"
        )
        return running + _waiting_approval(events)
    if status == MessageStatus.DEAD:
        told = [r for r in responses if r["metadata"].get("kind") == "dead_notice"]
        if not told:
            notice = "no notice was sent (no person waits on it)"
        elif told[0]["metadata"].get("teammate"):
            notice = (
                f"the chat its chain started from ({told[0]['channel']}:{told[0]['conversation']}) was told"
            )
        else:
            notice = "the sender was told"
        error = str(message["last_error"] or "")
        if error.startswith(OVER_BUDGET_PREFIX):
            # Never run: the figures are in the reason; a retry helps only once the limit allows it.
            return (
                f"not run because its {error.removeprefix(OVER_BUDGET_PREFIX)}; {notice}; once the limit "
                f"has reset or been raised, `agentpost dead retry {message['message_id']}` runs it"
            )
        return (
            f"dead letter after {message['retry_count']} attempt(s): {message['last_error']}; {notice}; "
            f"retry with `agentpost dead retry {message['message_id']}`"
        )
    if status == MessageStatus.COMPLETED:
        if not responses:
            return "completed without a reply to send (internal or handed off)"
        finals = [r for r in responses if r["metadata"].get("kind") not in _NOT_REPLIES]
        last = finals[-1] if finals else responses[-1]
        kind = last["metadata"].get("kind")
        how = {"stopped": "stopped by /stop; ", "dropped": "dropped by the waiting-message cap; "}.get(
            kind, ""
        )
        if last["status"] == ResponseStatus.ACKED:
            return f"{how}delivered on {last['channel']} at {_when(int(last['acked_at'] or 0))}"
        return how + _delivery_verdict(last, now)
    return f"status {status}"


#: Responses that are not the message's reply: notes, and an agent's questions and their answers.
_NOT_REPLIES = frozenset({"progress", "paused", "approval", "approval_closed"})


def _waiting_approval(events: list[EventEntry]) -> str:
    """``; waiting for an answer to apr_…`` when the run asked a person something nobody answered yet."""
    asked = {e.payload.get("approval_id"): e for e in events if e.type == "approval_requested"}
    for e in events:
        if e.type == "approval_answered":
            asked.pop(e.payload.get("approval_id"), None)
    if not asked:
        return ""
    approval_id, entry = next(reversed(asked.items()))
    return (
        f"; waiting for an answer to {approval_id} ({entry.payload.get('tool')}: "
        f"{_clip(str(entry.payload.get('summary') or ''), _DETAIL_CHARS)}): "
        f"`agentpost approvals allow {approval_id}` or `deny {approval_id}`, or answer in the chat"
    )


def _delivery_verdict(last: dict[str, Any], now: int) -> str:
    """Where an unacknowledged reply stands: failed for good, waiting to be re-sent, being sent, waiting."""
    channel = last["channel"]
    if last["status"] == ResponseStatus.FAILED:
        return (
            f"the reply could not be delivered on {channel}: {last['last_error']}; "
            "the user is told the next time they write in that chat"
        )
    if channel == "cli" and last["status"] == ResponseStatus.PENDING:
        return "reply waiting to be read: `agentpost replies` shows it"
    if last["status"] == ResponseStatus.DELIVERING:
        return f"reply being delivered on {channel} ({last['delivered']} chunk(s) sent so far)"
    due = int(last.get("lease_until") or 0)
    if last["status"] == ResponseStatus.PENDING and due > now:
        return (
            f"reply waiting to be sent again on {channel} at {_when(due)} "
            f"({last['delivered']} chunk(s) sent so far); last error: {last['last_error']}"
        )
    return (
        f"reply waiting for delivery on channel {channel!r} since "
        f"{_ago(int(last['created_at']), now)} ago: is its adapter running?"
    )


def trace_message(db: Database, message_id: str) -> Trace:
    """Collect the events, rows and verdict of ``message_id``."""
    rows = db.read(q.MESSAGE, {"m": message_id})
    message = rows[0] if rows else None
    if message is not None:
        message = dict(message)
        message["metadata"] = json.loads(message["metadata"] or "{}")
    responses = [
        dict(r) | {"metadata": json.loads(r["metadata"] or "{}"), "files": json.loads(r["files"] or "[]")}
        for r in db.read(q.RESPONSES_OF_MESSAGE, {"m": message_id})
    ]
    events = _events_for(db, message_id, None if message is None else int(message["created_at"]))
    now = now_ms()
    return Trace(message_id, message, responses, events, _verdict(message, responses, events, now, db))


_DETAIL_KEYS = (
    "agent", "worker", "channel", "attempts", "error", "exit_code", "duration_ms", "to", "hops",
    "response_id", "chunk", "retry_at", "host", "reason", "model", "text",
    "approval_id", "tool", "summary", "status", "decided_by", "via",
)  # fmt: skip


#: Never shortened: an error or a reason is the answer a person runs trace for.
_WHOLE_KEYS = frozenset({"error", "reason"})
#: Other values (a reply's text, say) are shortened to this many characters, with "…".
_DETAIL_CHARS = 80


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(entry: EventEntry) -> str:
    """A one-line description of an event's payload for the timeline (errors and reasons whole)."""
    parts = []
    for key in _DETAIL_KEYS:
        if key in entry.payload and entry.payload[key] not in (None, ""):
            value = entry.payload[key]
            if key == "retry_at":
                value = _when(int(value))
            text = " ".join(str(value).split())
            parts.append(f"{key}={text if key in _WHOLE_KEYS else _clip(text, _DETAIL_CHARS)}")
    ids = entry.payload.get("message_ids")
    if isinstance(ids, list) and len(ids) > 1:
        parts.append(f"group of {len(ids)}")
    return " ".join(parts)


def timeline_lines(trace: Trace) -> list[str]:
    """The trace as plain text lines (time, event, details), ending with the verdict."""
    lines = []
    if trace.message is not None:
        m = trace.message
        lines.append(
            f"{m['message_id']}: {m['channel']} from {m['sender'] or '?'} to agent {m['agent']} — "
            f"{_clip(m['message'], _DETAIL_CHARS)!r}"
        )
    start = trace.events[0].created_at if trace.events else 0
    for e in trace.events:
        offset = (e.created_at - start) / 1000
        lines.append(f"  {_when(e.created_at)} (+{offset:7.1f}s)  {e.type:<24} {describe(e)}")
    lines.append(f"=> {trace.verdict}")
    return lines
