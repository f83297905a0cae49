"""Named queries hold placeholders where the engines differ; the dialect fills them in one place."""

from __future__ import annotations

import pytest

from shared.storage.dialect import POSTGRESQL, SQLITE
from shared.storage.queries import agent_leases

pytestmark = pytest.mark.unit


def test_a_locking_read_locks_on_postgresql_and_is_plain_on_sqlite() -> None:
    text = agent_leases.STOP_REQUEST_OF_HOLDER_LOCKED
    assert "{lock_rows}" in text
    assert SQLITE.sql(text).endswith("stop_requested <> ''")
    assert POSTGRESQL.sql(text).endswith("stop_requested <> '' FOR UPDATE")
    assert "%(agent)s" in POSTGRESQL.sql(text)


def test_visible_event_clauses_bound_reads_on_postgresql_only() -> None:
    text = "SELECT MAX(id) FROM events{where_visible_events}"
    assert SQLITE.sql(text) == "SELECT MAX(id) FROM events"
    assert POSTGRESQL.sql(text).startswith("SELECT MAX(id) FROM events WHERE id < (SELECT")
    anded = "SELECT id FROM events WHERE id > :after{and_visible_events}"
    assert " AND id < " in POSTGRESQL.sql(anded) and SQLITE.sql(anded).endswith(":after")


def test_braces_in_a_literal_stay_and_a_misspelt_placeholder_is_refused() -> None:
    assert SQLITE.sql("UPDATE messages SET metadata = '{}' WHERE id = :id").count("{}") == 1
    with pytest.raises(ValueError, match="lock_row"):
        SQLITE.sql("SELECT 1 FROM agent_leases{lock_row}")


def test_claims_skip_locked_rows_on_postgresql_only() -> None:
    from shared.storage.queries import messages

    for text in (messages.CLAIM_PENDING, messages.CLAIM_CHAT_INTO_RUN, messages.CLAIM_CTES):
        assert "{skip_locked}" in text
        assert "ORDER BY id FOR UPDATE SKIP LOCKED)" in POSTGRESQL.sql(text)
        assert "ORDER BY id)" in SQLITE.sql(text) and "FOR UPDATE" not in SQLITE.sql(text)
    # The claim CTEs take the lease as the transaction path does, skipping a lease row being changed.
    assert "lease_until < :now) AND EXISTS (" in SQLITE.sql(messages.CLAIM_CTES)
    assert agent_leases.TAKE_LEASE.endswith("lease_until < :now){skip_locked})")


def test_a_group_is_named_by_its_message_ids_and_locked_when_read() -> None:
    from shared.queue.records import sql_in
    from shared.storage.queries import messages

    clause, _ = sql_in("m", ["a", "b", "c"])
    assert f"message_id IN {clause} " in messages.held_group(3)
    assert SQLITE.sql(messages.held_group(3)).endswith("ORDER BY id")
    assert POSTGRESQL.sql(messages.held_group(3)).endswith("ORDER BY id FOR UPDATE")
    updated = messages.held_group(3, messages.START_RUN, messages.START_RUN_RETURNS)
    assert updated.startswith("UPDATE messages SET run_started_at = :now WHERE") and "{" not in updated
    assert f"message_id IN {clause}" in messages.renew_held(3)
    assert f"message_id IN {clause} AND" in messages.complete_ctes(3)
