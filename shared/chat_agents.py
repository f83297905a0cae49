"""Which agents have answered a chat lately, kept in the ``kv`` table (scope ``chat_agents``).

The processor records every agent that answers a user chat (its own replies and a teammate's answers that go
to the chat a chain started from); when more than one agent has answered a chat within :data:`RECENT_MS`,
replies there carry the agent's name (:func:`workers.teams.plan_reply`). One row per chat and agent, so
processors answering the same chat at once never overwrite each other's record.
"""

from __future__ import annotations

from shared.chat_prefs import chat_key
from shared.clock import now_ms
from shared.db import Database

SCOPE = "chat_agents"
#: Agents that answered a chat longer ago than this no longer count (a week).
RECENT_MS = 7 * 24 * 3600 * 1000
#: A record younger than this is not rewritten (most replies then cost one read, no write).
_REFRESH_MS = 24 * 3600 * 1000
_SEP = "|"


def record_answer(db: Database, channel: str, conversation: str, agent: str) -> list[str]:
    """Note that ``agent`` answers this chat now; return the agents that answered it recently (sorted,
    ``agent`` included). A record refreshed within the last day is left as it is (a read, no write);
    records of this chat older than :data:`RECENT_MS` are removed when one is written."""
    prefix = chat_key(channel, conversation) + _SEP
    now = now_ms()
    bounds = {"s": SCOPE, "lo": prefix, "hi": prefix + "\uffff"}
    rows = db.read("SELECT value, updated_at FROM kv WHERE scope = :s AND key >= :lo AND key < :hi", bounds)
    recent = {str(r["value"]): int(r["updated_at"]) for r in rows if int(r["updated_at"]) >= now - RECENT_MS}
    if recent.get(agent, 0) >= now - _REFRESH_MS:
        return sorted(recent)
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO kv (scope, key, value, updated_at) VALUES (:s, :k, :v, :now) "
            "ON CONFLICT (scope, key) DO UPDATE SET updated_at = excluded.updated_at",
            {"s": SCOPE, "k": prefix + agent, "v": agent, "now": now},
        )
        tx.execute(
            "DELETE FROM kv WHERE scope = :s AND key >= :lo AND key < :hi AND updated_at < :cut",
            {**bounds, "cut": now - RECENT_MS},
        )
    return sorted({*recent, agent})


def answered_by(db: Database, channel: str, conversation: str) -> list[str]:
    """The agents that answered this chat within :data:`RECENT_MS`, sorted."""
    prefix = chat_key(channel, conversation) + _SEP
    rows = db.read(
        "SELECT value FROM kv WHERE scope = :s AND key >= :lo AND key < :hi AND updated_at >= :cut",
        {"s": SCOPE, "lo": prefix, "hi": prefix + "\uffff", "cut": now_ms() - RECENT_MS},
    )
    return sorted({str(r["value"]) for r in rows})
