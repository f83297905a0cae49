"""What a backup or a restore reads: the counts it reports (of the live database, of a copy, of what a
restore would replace), the copy's integrity and its schema version, and SQLite's page-level copy."""

from __future__ import annotations

from shared.storage.queries.common import CHAT_KEY

MESSAGES_BY_STATUS = "SELECT status, COUNT(*) AS n FROM messages GROUP BY status"
RESPONSES_BY_STATUS = "SELECT status, COUNT(*) AS n FROM responses GROUP BY status"
EVENTS = "SELECT COUNT(*) AS n FROM events"
#: Agents and chats that have messages in the queue (completed ones are pruned after a day).
AGENTS = "SELECT COUNT(DISTINCT agent) AS n FROM messages"
CHATS = f"SELECT COUNT(DISTINCT channel || ':' || {CHAT_KEY}) AS n FROM messages"
#: The whole conversation history kept apart from the queue.
HISTORY = "SELECT (SELECT COUNT(*) FROM chat_messages) + (SELECT COUNT(*) FROM agent_messages) AS n"
SCHEMA_VERSION = "SELECT MAX(version) AS v FROM schema_version"
#: When the database was made: the time its first schema version was recorded.
CREATED_AT = "SELECT MIN(applied_at) AS t FROM schema_version"

# SQLite only: reading a copy, and making a copy one self-contained file.
INTEGRITY_CHECK = "PRAGMA integrity_check"
SINGLE_FILE = "PRAGMA journal_mode = DELETE"
BACK_TO_WAL = "PRAGMA journal_mode = WAL"

# PostgreSQL only: one snapshot the counts read and pg_dump then dumps (``pg_dump --snapshot``). The
# exporting transaction waits, idle, while pg_dump runs: the session's 5 s idle limit must not end it.
NO_IDLE_LIMIT = "SET LOCAL idle_in_transaction_session_timeout = 0"
EXPORT_SNAPSHOT = "SELECT pg_export_snapshot()"


def empty_table(table: str) -> str:
    """Remove every row of an agentpost table (a table a restored copy predates: it had no rows then)."""
    return f'DELETE FROM "{table}"'
