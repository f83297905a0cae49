"""The run budget of one user message: how many agent runs the handoffs and chat-room posts it sets off
may cost together (``queue.max_chain_runs``), so a team whose members keep handing work to each other
cannot turn one message into dozens of runs and replies.

The count lives in the ``kv`` table (scope ``chain_runs``, key = the user message's id) and is taken in the
transaction that queues the handoffs, so two teammates finishing at once cannot both spend the last run.
The user message's own run is the first of the budget.
"""

from __future__ import annotations

import json

from shared.db import Tx

SCOPE = "chain_runs"


def take_chain_run(tx: Tx, root: str, budget: int, now: int) -> tuple[bool, bool]:
    """Spend one run of ``root``'s budget. Returns ``(granted, first_refusal)``: whether the run may be
    queued, and whether this is the first refusal (the moment to tell the user, once)."""
    raw = tx.scalar("SELECT value FROM kv WHERE scope = :s AND key = :k", {"s": SCOPE, "k": root})
    state = json.loads(str(raw)) if raw else {"runs": 1, "told": False}
    granted = int(state["runs"]) < budget
    first_refusal = not granted and not state.get("told")
    if granted:
        state["runs"] = int(state["runs"]) + 1
    else:
        state["told"] = True
    tx.execute(
        "INSERT INTO kv (scope, key, value, updated_at) VALUES (:s, :k, :v, :now) ON CONFLICT (scope, key) "
        "DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
        {"s": SCOPE, "k": root, "v": json.dumps(state), "now": now},
    )
    return granted, first_refusal


def prune_chain_budgets(tx: Tx, older_than: int) -> int:
    """Forget the budgets of chains untouched since ``older_than`` (epoch ms)."""
    return tx.execute(
        "DELETE FROM kv WHERE scope = :s AND updated_at < :cut", {"s": SCOPE, "cut": older_than}
    ).rowcount
