"""Which agents run on their fallback model, and until when, kept in the ``kv`` table (scope
``model_fallback``, key = the agent, value = the epoch ms the fallback lasts until).

When a run hits a rate limit and its agent has a ``fallback_model``, the processor records "use the fallback
until the reset" here (:func:`use_fallback_until`), so every processor sees it and a restart keeps it; each
run asks :func:`fallback_until` which model to start (:mod:`workers.ratelimit`, :mod:`workers.run`). A record
whose time has passed means the primary model again; it is overwritten by the agent's next limit.
"""

from __future__ import annotations

from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope


def fallback_until(db: Database, agent: str) -> int:
    """Until when ``agent`` runs on its fallback model (epoch ms; 0 or past: the primary model)."""
    value = kv.get(db, Scope.MODEL_FALLBACK, agent)
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0  # not a time (written by hand or by another release): the primary model


def use_fallback_until(db: Database, agent: str, until: int) -> None:
    """Make ``agent`` run on its fallback model until ``until`` (epoch ms)."""
    with db.transaction() as tx:
        kv.put(tx, Scope.MODEL_FALLBACK, agent, str(until))
