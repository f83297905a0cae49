"""Where each agent's workspace was made, kept in the ``kv`` table (scope ``workspace``, key = the agent,
value = the JSON of the workspace's marker: its random ``id``, the ``host`` it was made on, its ``path``).

A processor records the workspace when it first makes it (:func:`record_workspace`), and every processor
checks the record before it runs the agent (:mod:`workers.workspace`): across hosts a workspace lives on the
host that made it. The record is overwritten when the workspace is made again and kept when the agent is
removed, as its folder is.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope


def workspace_record(db: Database, agent: str) -> dict[str, Any] | None:
    """Where ``agent``'s workspace was made (``id``, ``host``, ``path``), as recorded in the database."""
    text = kv.get(db, Scope.WORKSPACE, agent)
    # A record that is not a marker with an id (written by hand, or half of one) reads as none: the
    # workspace is then recorded again from the marker in its folder.
    with contextlib.suppress(ValueError):
        data = json.loads(text) if text else None
        if isinstance(data, dict) and isinstance(data.get("id"), str):
            return data
    return None


def record_workspace(db: Database, agent: str, marker: dict[str, Any]) -> None:
    """Record ``marker`` as ``agent``'s workspace (replacing an earlier record)."""
    with db.transaction() as tx:
        kv.put(tx, Scope.WORKSPACE, agent, json.dumps(marker))
