"""``run_usage``: one row per run whose CLI reported tokens and cost, and the sums read from it
(:mod:`shared.reads.usage`)."""

from __future__ import annotations

RECORD = (
    "INSERT INTO run_usage (run_id, message_id, agent, channel, conversation, sender, sender_name, model,"
    " ok, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd, duration_ms,"
    " created_at) VALUES (:run_id, :message_id, :agent, :channel, :conversation, :sender, :sender_name,"
    " :model, :ok, :input_tokens, :output_tokens, :cache_read_tokens, :cache_write_tokens, :cost_usd,"
    " :duration_ms, :created_at)"
)

#: What the runs are grouped by, for each grouping (by day: the time, summed into days by the caller).
_GROUP_KEYS: dict[str, str] = {
    "agent": "agent",
    "sender": "sender",
    "chat": "channel || ':' || conversation",
    "day": "created_at",
}


def sums_by(by: str) -> str:
    """Runs, tokens and cost since ``:since`` per ``by`` (``agent``, ``sender``, ``chat`` or ``day``), the
    group as ``k``. Raises ``KeyError`` for another grouping."""
    key = _GROUP_KEYS[by]
    # The period's rows are read first, by ix_run_usage_created: grouped straight from the table, SQLite
    # walks all of ix_run_usage_agent (every run ever recorded) to spare itself a sort, however short the
    # period. MATERIALIZED keeps the two steps apart (SQLite 3.35+, which RETURNING needs anyway; PostgreSQL 12+).
    return (
        f"WITH period AS MATERIALIZED (SELECT * FROM run_usage WHERE created_at >= :since) "
        f"SELECT {key} AS k, COUNT(*) AS runs, SUM(input_tokens) AS i, SUM(output_tokens) AS o,"
        " SUM(cache_read_tokens) AS cr, SUM(cache_write_tokens) AS cw, SUM(cost_usd) AS c"
        f" FROM period GROUP BY {key}"
    )


SPENT_BY_SENDER = "SELECT COALESCE(SUM(cost_usd), 0) FROM run_usage WHERE sender = :s AND created_at >= :t"
SPENT_BY_AGENT = "SELECT COALESCE(SUM(cost_usd), 0) FROM run_usage WHERE agent = :a AND created_at >= :t"
