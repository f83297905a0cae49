"""Schema creation: every table, idempotent, versioned, and refused when written by a newer release."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.queue.core import Queue
from shared.storage import schema
from shared.storage.models import SCHEMA_VERSION, TABLE_NAMES
from shared.storage.schema import open_database

pytestmark = pytest.mark.integration


def test_schema_is_complete_idempotent_and_versioned(db_url: str) -> None:
    db = open_database(db_url)
    assert set(TABLE_NAMES) <= set(schema.table_names(db))
    assert schema.create_schema(db) == SCHEMA_VERSION
    open_database(db_url).close()
    assert db.read_scalar("SELECT COUNT(*) FROM schema_version") == 1
    assert db.read_scalar("SELECT MAX(version) FROM schema_version") == SCHEMA_VERSION
    db.close()


def test_a_newer_schema_is_refused(db_url: str) -> None:
    db = open_database(db_url)
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (:v, 0)", {"v": SCHEMA_VERSION + 1}
        )
    try:
        with pytest.raises(RuntimeError, match="newer than this agentpost"):
            schema.create_schema(db)
    finally:
        # The PostgreSQL database is shared by the test session: leave it as the other tests expect it.
        with db.transaction() as tx:
            tx.execute("DELETE FROM schema_version WHERE version > :v", {"v": SCHEMA_VERSION})
        db.close()


def test_the_retired_topic_index_is_dropped_when_the_schema_is_brought_up_to_date(db_url: str) -> None:
    # Databases made before the busy "queue" topic lost its index still carry the full topic index, which
    # costs a page write per event: bringing the schema up to date drops it, and keeps the quiet topics'.
    from sqlalchemy import inspect

    db = open_database(db_url)
    with db.transaction() as tx:
        tx.execute("CREATE INDEX IF NOT EXISTS ix_events_topic ON events (topic, id)")

    def index_names() -> set[str]:
        return {str(ix["name"]) for ix in inspect(db.engine).get_indexes("events")}

    assert "ix_events_topic" in index_names()
    assert schema.create_schema(db) == SCHEMA_VERSION
    assert "ix_events_topic" not in index_names() and "ix_events_quiet_topics" in index_names()
    db.close()


def test_indexes_a_newer_schema_added_reach_an_older_database(db_url: str) -> None:
    # create_all makes indexes only with new tables: an older database gets the chat indexes (the chat list,
    # a chat's history, a message's replies) when the schema is brought up to date.
    db = open_database(db_url)
    added = ("ix_messages_chat", "ix_responses_chat", "ix_responses_message")
    with db.transaction() as tx:
        for name in added:
            tx.execute(f"DROP INDEX {name}")

    def index_names() -> set[str]:
        return {str(r["name"]) for r in db.read(db.dialect.index_names)}

    assert not set(added) & index_names()
    assert schema.create_schema(db) == SCHEMA_VERSION
    assert set(added) <= index_names()
    db.close()


def test_event_reads_by_topic_use_the_quiet_topics_index_or_the_ids(sqlite_url: str) -> None:
    from shared.storage.queries.events import topic_filter

    db = open_database(sqlite_url)
    for topic, expected in (("agents", "ix_events_quiet_topics"), ("queue", "PRIMARY KEY")):
        for sql in (
            f"SELECT * FROM events WHERE {topic_filter(topic)} AND id > :after ORDER BY id LIMIT 10",
            f"DELETE FROM events WHERE {topic_filter(topic)} AND id <= :after",
        ):
            plan = " ".join(
                str(r["detail"]) for r in db.read("EXPLAIN QUERY PLAN " + sql, {"topic": topic, "after": 1})
            )
            assert expected in plan and "SCAN" not in plan, (topic, plan)
    db.close()


def test_sqlite_runs_in_wal_with_normal_sync(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    assert db.read_scalar("PRAGMA journal_mode") == "wal"
    assert db.read_scalar("PRAGMA synchronous") == 1  # NORMAL
    assert int(db.read_scalar("PRAGMA busy_timeout")) >= 1000
    db.close()


def test_claims_use_the_partial_pending_index(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    queue = Queue(db)
    params = {"worker": "w", "lease": 10, "now": 5, "agent": "a"}
    plan = " ".join(
        str(r["detail"]) for r in db.read("EXPLAIN QUERY PLAN " + queue.messages.claim_sql, params)
    )
    assert "ix_messages_pending" in plan, plan
    assert "SCAN messages" not in plan, plan
    db.close()


def test_columns_added_by_a_newer_schema_are_added_to_an_older_database(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO messages (message_id, channel, message, agent, created_at, updated_at) "
            "VALUES ('cli_aaaaaaaa', 'cli', 'kept', 'assistant', 1, 1)"
        )
        tx.execute("ALTER TABLE messages DROP COLUMN interruptions")
        tx.execute("ALTER TABLE responses DROP COLUMN last_error")
    db.close()
    db = open_database(sqlite_url)
    row = db.read("SELECT message, interruptions FROM messages")[0]
    assert row == {"message": "kept", "interruptions": 0}
    assert db.read_scalar("SELECT COUNT(last_error) FROM responses") == 0
    db.close()


def test_processes_starting_together_all_create_or_find_the_schema(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'race.db'}"
    code = "import sys; from shared.storage.schema import open_database; open_database(sys.argv[1]).close()"
    for _ in range(3):  # several rounds on fresh files: the race is at the very first start
        url = f"sqlite:///{tmp_path / f'race-{_}.db'}"
        procs = [
            subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE) for _ in range(6)
        ]
        results = [(p.wait(timeout=60), (p.stderr.read() if p.stderr else b"")) for p in procs]
        for p in procs:
            if p.stderr:
                p.stderr.close()
        assert all(rc == 0 for rc, _ in results), [err.decode()[-300:] for rc, err in results if rc]
