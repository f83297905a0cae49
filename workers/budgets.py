"""What a run cost, and who it counts to (:mod:`shared.reads.usage` stores it).

A run is attributed to the person whose message started its chain: a teammate's run in a handoff carries
the origin of that chain (:func:`workers.teams.origin_of`), so it counts to that person and their chat.
Heartbeats and schedules have no person behind them; they count to their agent only.

Budgets (``[budgets]`` in settings.toml, :class:`BudgetGate`): before a run, the processor asks whether the
sender or the agent has spent its daily or monthly limit (UTC days and months). If so the message is not
run; it dies with one plain-words notice to the sender (spent, limit, when it resets), and the operator sees
why in ``trace`` and ``dead list``. A run that crosses a limit finishes: the limit holds from the next one.
"""

from __future__ import annotations

import logging
from pathlib import Path

from shared.clock import now_ms
from shared.queue.core import INTERNAL_CHANNELS, QueuedMessage, TxWork
from shared.reads.budget_status import OverBudget, check_over
from shared.reads.usage import UsageRecord, record_usage_in
from shared.settings.model import Settings, SettingsError, load_settings
from shared.settings.sections import BudgetSettings
from shared.storage.db import Database, Tx
from workers.providers.base import RunResult
from workers.teams import origin_of

log = logging.getLogger("agentpost.processor")


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


# -- budgets -----------------------------------------------------------------------------------------------
def _budget_sender(primary: QueuedMessage) -> str:
    origin = origin_of(primary)
    if origin is None or origin["channel"] in INTERNAL_CHANNELS:
        return ""
    who = str(origin.get("sender_id") or origin.get("sender") or "")
    return f"{origin['channel']}:{who}" if who else ""


class BudgetGate:
    """The ``[budgets]`` in force, read again whenever settings.toml changes (no restart needed); a file
    that no longer validates leaves the last good budgets in force."""

    def __init__(self, settings: Settings) -> None:
        self._home, self._env = settings.home, dict(settings.env)
        self._path = settings.path
        self._stamp = self._stat()
        self._budgets = settings.budgets

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def budgets(self) -> BudgetSettings:
        stamp = self._stat()
        if stamp != self._stamp:
            try:
                self._budgets = load_settings(self._home, self._env).budgets
                self._stamp = stamp
            except SettingsError as exc:
                log.warning("budgets: keeping the last valid ones: %s", exc)
        return self._budgets

    def over(self, db: Database, agent: str, primary: QueuedMessage) -> OverBudget | None:
        """The first limit ``primary``'s sender or ``agent`` is over now (None: it may run). A run already
        going on is never stopped: the limit holds from the next message on."""
        budgets = self.budgets()
        now = now_ms()
        sender = _budget_sender(primary)
        if sender and sender not in budgets.exempt_senders:
            held = check_over(db, "sender", sender, agent, budgets, now)
            if held is not None:
                return held
        return check_over(db, "agent", agent, agent, budgets, now)


_GATES: dict[Path, BudgetGate] = {}


def budget_gate(settings: Settings) -> BudgetGate:
    """The processor's gate for the settings file of ``settings`` (one per file, kept for its life)."""
    gate = _GATES.get(settings.path)
    if gate is None:
        gate = _GATES[settings.path] = BudgetGate(settings)
    return gate
