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
