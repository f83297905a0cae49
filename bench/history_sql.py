"""The bulk-load statements of bench/history.py: a long history of finished chats, inserted with
INSERT ... SELECT over a generated series (a recursive CTE on SQLite, generate_series on PostgreSQL), one
statement per table and batch, so 200,000 messages with their replies, events, agent turns and costs load
in seconds rather than the hours one enqueue at a time would take.

Message ``n`` (0 ≤ n < messages) belongs to chat ``n % chats`` (so chats interleave as real ones do), to
agent ``agent-(chat % 8)``, and is ``:t0 + n * :step`` ms old; every message is completed, answered by one
acked reply, told by three events, and leaves two agent turns, one cost record and, every tenth, a
chat-room post. Parameters: ``:lo``, ``:hi`` (the series), ``:chats``, ``:t0``, ``:step``.
"""

from __future__ import annotations

CHANNEL = "telegram"
AGENTS = 8


def series(sqlite: bool) -> str:
    """The numbers ``:lo`` … ``:hi - 1``, as a subquery with one column ``n``."""
    if sqlite:
        return "WITH RECURSIVE s(n) AS (SELECT :lo UNION ALL SELECT n + 1 FROM s WHERE n + 1 < :hi) SELECT n FROM s"
    return "SELECT n FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint) - 1) AS g(n)"


def _text(sqlite: bool, what: str) -> str:
    # A ~100-character body that differs per row (a constant would compress away in PostgreSQL's TOAST).
    pad = "printf('%090d', n)" if sqlite else "lpad(CAST(n AS text), 90, '0')"
    return f"'{what} ' || {pad}"


def statements(sqlite: bool) -> dict[str, str]:
    """One INSERT ... SELECT per table, by table name."""
    s = series(sqlite)
    chat = "(n % :chats)"
    conv = f"'chat-' || {chat}"
    agent = f"'agent-' || ({chat} % {AGENTS})"
    at = "(:t0 + n * :step)"
    mid = "'hist_' || n"
    return {
        "messages": (
            "INSERT INTO messages (message_id, channel, sender, sender_id, message, agent, status, created_at, "
            "updated_at, conversation, metadata, available_at) "
            f"SELECT {mid}, '{CHANNEL}', 'person ' || {chat}, 'user-' || {chat}, {_text(sqlite, 'question')}, "
            f"{agent}, 'completed', {at}, {at} + 5000, {conv}, '{{}}', {at} FROM ({s}) AS t"
        ),
        "responses": (
            "INSERT INTO responses (message_id, channel, sender, sender_id, message, original_message, agent, "
            "status, created_at, updated_at, acked_at, conversation) "
            f"SELECT {mid}, '{CHANNEL}', 'person ' || {chat}, 'user-' || {chat}, {_text(sqlite, 'answer')}, "
            f"'', {agent}, 'acked', {at} + 5000, {at} + 6000, {at} + 6000, {conv} FROM ({s}) AS t"
        ),
        # Ids 1 … 3 * messages: below every id the event log hands out later on either engine.
        "events": (
            "INSERT INTO events (id, topic, type, message_id, payload, created_at) "
            "SELECT 3 * n + k.k + 1, 'queue', "
            "CASE k.k WHEN 0 THEN 'message_received' WHEN 1 THEN 'response_ready' ELSE 'response_acked' END, "
            f"{mid}, '{{\"message_id\": \"' || {mid} || '\"}}', {at} + 3000 * k.k "
            f"FROM ({s}) AS t CROSS JOIN (SELECT 0 AS k UNION ALL SELECT 1 UNION ALL SELECT 2) AS k"
        ),
        "agent_messages": (
            "INSERT INTO agent_messages (agent_id, role, channel, sender, message_id, content, created_at) "
            f"SELECT {agent}, r.role, '{CHANNEL}', 'person ' || {chat}, {mid}, {_text(sqlite, 'turn')}, {at} "
            f"FROM ({s}) AS t CROSS JOIN (SELECT 'user' AS role UNION ALL SELECT 'assistant') AS r"
        ),
        "run_usage": (
            "INSERT INTO run_usage (run_id, message_id, agent, channel, conversation, sender, sender_name, "
            "model, ok, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd, "
            "duration_ms, created_at) "
            f"SELECT 'run-' || n, {mid}, {agent}, '{CHANNEL}', {conv}, '{CHANNEL}:user-' || {chat}, "
            f"'person ' || {chat}, 'sonnet', 1, 1200, 300, 800, 0, 0.004, 4000, {at} + 5000 FROM ({s}) AS t"
        ),
        "chat_messages": (
            "INSERT INTO chat_messages (team_id, from_agent, message, created_at) "
            f"SELECT 'team-' || ({chat} % 4), {agent}, {_text(sqlite, 'post')}, {at} FROM ({s}) AS t "
            "WHERE n % 10 = 0"
        ),
    }
