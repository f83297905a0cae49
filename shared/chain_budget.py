"""The run budget of one user message: how many agent runs the handoffs and chat-room posts it sets off
may cost together (``queue.max_chain_runs``), so a team whose members keep handing work to each other
cannot turn one message into dozens of runs and replies.

The count lives in the ``kv`` table (scope ``chain_runs``, key = the user message's id) and is taken in the
transaction that queues the handoffs, so two teammates finishing at once cannot both spend the last run.
The user message's own run is the first of the budget.
"""

from __future__ import annotations

import json

from shared.storage import kv
from shared.storage.db import Tx
from shared.storage.kv import Scope


def take_chain_run(tx: Tx, root: str, budget: int, now: int) -> tuple[bool, bool]:
    """Spend one run of ``root``'s budget. Returns ``(granted, first_refusal)``: whether the run may be
    queued, and whether this is the first refusal (the moment to tell the user, once)."""
    raw = kv.get(tx, Scope.CHAIN_RUNS, root)
    state = json.loads(raw) if raw else {"runs": 1, "told": False}
    granted = int(state["runs"]) < budget
    first_refusal = not granted and not state.get("told")
    if granted:
        state["runs"] = int(state["runs"]) + 1
    else:
        state["told"] = True
    kv.put(tx, Scope.CHAIN_RUNS, root, json.dumps(state), now)
    return granted, first_refusal


def prune_chain_budgets(tx: Tx, older_than: int) -> int:
    """Forget the budgets of chains untouched since ``older_than`` (epoch ms)."""
    return kv.delete_older(tx, Scope.CHAIN_RUNS, older_than)
