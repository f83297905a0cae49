"""The run budget of one user message: how many agent runs the handoffs and chat-room posts it sets off
may cost together (``queue.max_chain_runs``), so a team whose members keep handing work to each other
cannot turn one message into dozens of runs and replies.

The count lives in the ``kv`` table (scope ``chain_runs``, key = the user message's id) and is taken in the
transaction that queues the handoffs, with the row locked (:func:`shared.storage.kv.get_locked`), so two
teammates finishing at once cannot both spend the last run.
The user message's own run is the first of the budget.
The same record says whether the user was told that a handoff of the chain went past ``max_hops``.
"""

from __future__ import annotations

import json
from typing import Any

from shared.storage import kv
from shared.storage.db import Tx
from shared.storage.kv import Scope


def take_chain_run(tx: Tx, root: str, budget: int, now: int) -> tuple[bool, bool]:
    """Spend one run of ``root``'s budget. Returns ``(granted, first_refusal)``: whether the run may be
    queued, and whether this is the first refusal (the moment to tell the user, once)."""
    state = _locked_state(tx, root, now)
    granted = int(state["runs"]) < budget
    first_refusal = not granted and not state.get("told")
    if granted:
        state["runs"] = int(state["runs"]) + 1
    else:
        state["told"] = True
    kv.put(tx, Scope.CHAIN_RUNS, root, json.dumps(state), now)
    return granted, first_refusal


def first_hops_refusal(tx: Tx, root: str, now: int) -> bool:
    """Record that a handoff of ``root``'s chain went past ``max_hops``; True the first time (the moment to
    tell the user, once: every branch of a chain that fans out may reach the limit)."""
    state = _locked_state(tx, root, now)
    if state.get("hops_told"):
        return False
    state["hops_told"] = True
    kv.put(tx, Scope.CHAIN_RUNS, root, json.dumps(state), now)
    return True


def _locked_state(tx: Tx, root: str, now: int) -> dict[str, Any]:
    """The chain's record, locked until ``tx`` ends: teammates finishing at once on PostgreSQL take turns,
    so neither spends a run the other already took nor tells the user a second time."""
    return dict(json.loads(kv.get_locked(tx, Scope.CHAIN_RUNS, root, _FRESH, now)))


#: A chain's record before its first handoff: the user message's own run is the first of the budget.
_FRESH = json.dumps({"runs": 1, "told": False})


def prune_chain_budgets(tx: Tx, older_than: int) -> int:
    """Forget the budgets of chains untouched since ``older_than`` (epoch ms)."""
    return kv.delete_older(tx, Scope.CHAIN_RUNS, older_than)
