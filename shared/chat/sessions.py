"""Provider session ids per agent and conversation (the ``sessions`` table).

The processor records the CLI's session id after each successful run, so the next run of the same agent
(``session_scope = "agent"``, key ``""``) or the same chat (``session_scope = "conversation"``, key
``"channel:conversation"``) continues that conversation. With no id recorded, the next run starts a fresh
conversation (a reset blanks the id). Channel adapters' ``/reset`` and ``agentpost agent reset`` both call
:func:`clear_sessions`, so a reset is durable and reaches the processor through the database alone.
"""

from __future__ import annotations

from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.storage.db import Database, Tx
from shared.storage.queries import sessions as q

#: The conversation key used when one conversation spans all of an agent's chats.
AGENT_SCOPE_KEY = ""


def get_session(db: Database, agent: str, conversation: str = AGENT_SCOPE_KEY) -> str | None:
    """The recorded session id of ``agent`` in ``conversation``, or ``None`` when it starts fresh."""
    value = db.read_scalar(q.SESSION_ID, {"a": agent, "c": conversation})
    return str(value) if value else None


def set_session(
    db: Database, agent: str, conversation: str, session_id: str, *, started_at: int | None = None
) -> bool:
    """Record the session id the provider reported for ``agent`` in ``conversation``.

    With ``started_at`` (when the run began, epoch ms) a reset made during the run wins: the row is left
    alone when it changed after the run started. Returns whether the id was stored.
    """
    with db.transaction() as tx:
        return set_session_in(tx, agent, conversation, session_id, started_at=started_at)


def set_session_in(
    tx: Tx, agent: str, conversation: str, session_id: str, *, started_at: int | None = None
) -> bool:
    """:func:`set_session` inside the caller's transaction (the processor writes it with the completion,
    so the conversation moves forward exactly when the run's answer is stored)."""
    n = tx.execute(
        q.record(unless_reset_since=started_at is not None),
        {"a": agent, "c": conversation, "s": session_id, "now": now_ms(), "started": started_at},
    ).rowcount
    return bool(n)


def clear_sessions(
    db: Database, agent: str, conversation: str | None = None, *, reason: str = "reset"
) -> int:
    """Forget ``agent``'s sessions (all of them, or one conversation's): its next runs start fresh.

    The rows are blanked, not deleted, so a run still going when the reset happens cannot bring its
    session back (see ``started_at`` in :func:`set_session`). Appends an ``agent_reset`` event in the same
    transaction. Returns how many sessions were forgotten.
    """
    now = now_ms()
    keys = {AGENT_SCOPE_KEY} if conversation is None else {conversation}
    with db.transaction() as tx:
        if conversation is None:
            n = tx.execute(q.BLANK_OF_AGENT, {"a": agent, "now": now}).rowcount
        else:
            n = tx.execute(q.BLANK_ONE, {"a": agent, "c": conversation, "now": now}).rowcount
        for key in keys:
            tx.execute(q.ENSURE_BLANK, {"a": agent, "c": key, "now": now})
        append_events(
            tx,
            [
                PendingEvent(
                    "agent_reset",
                    {"agent": agent, "conversation": conversation, "reason": reason, "sessions_cleared": n},
                    None,
                    topic="agents",
                )
            ],
            now,
        )
    return int(n)


def list_sessions(db: Database, agent: str | None = None) -> list[dict[str, object]]:
    """Recorded sessions (for ``agentpost agent list`` and the dashboard)."""
    rows = db.read(q.ALL) if agent is None else db.read(q.OF_AGENT, {"a": agent})
    return [dict(r) for r in rows]
