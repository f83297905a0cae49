"""Which agents have answered a chat lately, kept in the ``kv`` table (scope ``chat_agents``).

The processor records every agent that answers a user chat (its own replies and a teammate's answers that go
to the chat a chain started from); when more than one agent has answered a chat within :data:`RECENT_MS`,
replies there carry the agent's name (:func:`workers.teams.plan_reply`). One row per chat and agent, so
processors answering the same chat at once never overwrite each other's record.
"""

from __future__ import annotations

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope

#: Agents that answered a chat longer ago than this no longer count (a week).
RECENT_MS = 7 * 24 * 3600 * 1000
#: A record younger than this is not rewritten (most replies then cost one read, no write).
_REFRESH_MS = 24 * 3600 * 1000
_SEP = "|"


def record_answer(db: Database, chat: ChatAddress, agent: str) -> list[str]:
    """Note that ``agent`` answers this chat now; return the agents that answered it recently (sorted,
    ``agent`` included). A record refreshed within the last day is left as it is (a read, no write);
    records of this chat older than :data:`RECENT_MS` are removed when one is written."""
    prefix = chat.row_key + _SEP
    now = now_ms()
    rows = _entries(db, chat)
    recent = {e.value: e.updated_at for e in rows if e.updated_at >= now - RECENT_MS}
    if recent.get(agent, 0) >= now - _REFRESH_MS:
        return sorted(recent)
    with db.transaction() as tx:
        # The value is the agent, as in the key: rewriting it only moves the time.
        kv.put(tx, Scope.CHAT_AGENTS, prefix + agent, agent, now)
        kv.delete_older(tx, Scope.CHAT_AGENTS, now - RECENT_MS, prefix=prefix)
    return sorted({*recent, agent})


def answered_by(db: Database, chat: ChatAddress) -> list[str]:
    """The agents that answered this chat within :data:`RECENT_MS`, sorted."""
    rows = _entries(db, chat, since=now_ms() - RECENT_MS)
    return sorted({e.value for e in rows})


def _entries(db: Database, chat: ChatAddress, since: int | None = None) -> list[kv.Entry]:
    """The chat's records, with those an earlier release wrote under its conversation alone
    (:attr:`ChatAddress.earlier_row_key`; they age out within :data:`RECENT_MS`)."""
    rows = kv.entries(db, Scope.CHAT_AGENTS, prefix=chat.row_key + _SEP, since=since)
    if chat.earlier_row_key is not None:
        rows += kv.entries(db, Scope.CHAT_AGENTS, prefix=chat.earlier_row_key + _SEP, since=since)
    return rows
