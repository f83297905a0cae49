"""``sessions``: the provider's session id per agent and conversation (:mod:`shared.chat.sessions`)."""

from __future__ import annotations

SESSION_ID = "SELECT session_id FROM sessions WHERE agent = :a AND conversation = :c"


def record(unless_reset_since: bool) -> str:
    """Record the session id ``:s`` of agent ``:a`` in conversation ``:c`` at ``:now``; when
    ``unless_reset_since``, leave a row alone that changed after ``:started`` (a reset during the run wins)."""
    guard = " WHERE sessions.updated_at <= :started" if unless_reset_since else ""
    return (
        "INSERT INTO sessions (agent, conversation, session_id, updated_at) VALUES (:a, :c, :s, :now) "
        "ON CONFLICT (agent, conversation) DO UPDATE SET session_id = excluded.session_id, "
        f"updated_at = excluded.updated_at{guard}"
    )


#: Blank (not delete) every session of an agent, so a run still going cannot bring one back.
BLANK_OF_AGENT = (
    "UPDATE sessions SET session_id = '', updated_at = :now WHERE agent = :a AND session_id <> ''"
)
BLANK_ONE = (
    "UPDATE sessions SET session_id = '', updated_at = :now WHERE agent = :a AND conversation = :c "
    "AND session_id <> ''"
)
#: A blank row for the reset's key, written even where none was recorded yet.
ENSURE_BLANK = (
    "INSERT INTO sessions (agent, conversation, session_id, updated_at) VALUES (:a, :c, '', :now) "
    "ON CONFLICT (agent, conversation) DO UPDATE SET session_id = '', updated_at = excluded.updated_at"
)
ALL = "SELECT * FROM sessions ORDER BY agent, conversation"
OF_AGENT = "SELECT * FROM sessions WHERE agent = :a ORDER BY conversation"
