"""What a run cost, and who it counts to (:mod:`shared.usage` stores it).

A run is attributed to the person whose message started its chain: a teammate's run in a handoff carries
the origin of that chain (:func:`workers.teams.origin_of`), so it counts to that person and their chat.
Heartbeats and schedules have no person behind them; they count to their agent only.
"""

from __future__ import annotations

from shared.db import Tx
from shared.queue import INTERNAL_CHANNELS, QueuedMessage, TxWork
from shared.usage import UsageRecord, record_usage_in
from workers.providers import RunResult
from workers.teams import origin_of


def usage_record(agent: str, run_id: str, primary: QueuedMessage, result: RunResult) -> UsageRecord | None:
    """The usage row of one run, or None when its CLI reported no usage (codex, command agents)."""
    usage = result.usage
    if usage is None:
        return None
    origin = origin_of(primary)
    if origin is None or origin["channel"] in INTERNAL_CHANNELS:
        channel, conversation, sender, name = primary.channel, primary.conversation, "", ""
    else:
        channel = str(origin.get("channel") or "")
        conversation = str(origin.get("conversation") or "")
        who = str(origin.get("sender_id") or origin.get("sender") or "")
        # Ids are per platform: ``telegram:42`` and ``discord:42`` are two people.
        sender = f"{channel}:{who}" if who else ""
        name = str(origin.get("sender") or "")
    return UsageRecord(
        agent=agent,
        run_id=run_id,
        message_id=primary.message_id,
        channel=channel,
        conversation=conversation,
        sender=sender,
        sender_name=name,
        model=usage.model,
        ok=result.ok,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        cost_usd=usage.cost_usd,
        duration_ms=result.duration_ms,
    )


def usage_work(agent: str, run_id: str, primary: QueuedMessage, result: RunResult) -> TxWork | None:
    """Work for the outcome's transaction that records the run's usage (None: nothing to record)."""
    record = usage_record(agent, run_id, primary, result)
    if record is None:
        return None

    def write(tx: Tx) -> None:
        record_usage_in(tx, record)

    return write
