"""`agentpost migrate`: a populated SQLite database (every table, every status) moved to PostgreSQL."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest

from scheduler.migrate import MigrationError, migrate
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.log import SqlEventLog
from shared.queue.core import AgentTurn, ChatPost, ResponseDraft
from shared.reads.usage import UsageRecord, record_usage_in
from shared.runtime import open_runtime
from shared.settings.model import load_settings
from shared.storage.copy_db import table_counts
from shared.storage.models import TABLE_NAMES
from tests.approval_support import ask_for_bash
from tests.scheduler_support import fresh_pg_database, make_dead, write_home

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

AGENTS = '[agents.assistant]\nname = "A"\n\n[agents.coder]\nname = "C"\n\n[teams.dev]\nagents = ["assistant", "coder"]\nleader = "assistant"\n'


def populate(home: Path) -> None:
    """Every status of messages and responses, and rows in every other table."""
    with open_runtime(home, env={}) as rt:
        q = rt.queue
        make_dead(q, 2)
        done = [
            q.intake.enqueue_message(
                ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), f"done {i}"
            ).message_id
            for i in range(3)
        ]
        claimed = q.messages.claim_all_pending_messages("assistant", "w1")
        q.messages.complete_messages(
            [m.message_id for m in claimed],
            "w1",
            ResponseDraft(message="all done"),
            chat_posts=[ChatPost("dev", "assistant", "note to the team")],
            history=[
                AgentTurn("assistant", "user", "done 0"),
                AgentTurn("assistant", "assistant", "all done"),
            ],
        )
        q.leases.release_agent("assistant", "w1")
        assert {m.message_id for m in claimed} == set(done)
        # responses: one acked, one being delivered (lease expired: its adapter died), one pending
        # (each in a chat of its own: a chat's later reply is not claimed while an earlier one is unfinished)
        for chat, text in (("c2", "second"), ("c3", "third")):
            q.responses.enqueue_response(ChatAddress("telegram", "ann", conversation=chat), text)
        taken = q.responses.claim_responses_for_channel("telegram", "tg-1", limit=2, lease_ms=1)
        q.responses.ack_response(taken[0].id, "tg-1")
        # messages: processing (its worker died: the lease is in the past), pending
        q.intake.enqueue_message(ChatAddress("cli", "bob"), "in flight", agent="coder")
        q.messages.claim_all_pending_messages("coder", "w2", lease_ms=1)
        q.intake.enqueue_message(ChatAddress("cli", "bob"), "waiting", agent="coder")
        SqlEventLog(rt.db).ack("dashboard", "queue", SqlEventLog(rt.db).last_cursor())
        # approvals: a question an agent asked before a tool ran, still waiting for its answer
        chat = ChatAddress("telegram", "ann", "42", "c1")
        ask_for_bash(rt, chat, done[0], command="make deploy", agent="assistant", run_id="run_1")
        now = now_ms()
        with rt.db.transaction() as tx:
            record_usage_in(
                tx,
                UsageRecord(
                    agent="assistant", message_id=done[0], channel="telegram", conversation="c1",
                    sender="telegram:42", model="claude-test", input_tokens=10, output_tokens=7,
                    cost_usd=0.00018, duration_ms=1200,
                ),
            )  # fmt: skip
            tx.execute(
                "INSERT INTO pairings (channel, sender_id, sender, code, status, created_at) VALUES "
                "('telegram', '42', 'ann', 'ABC123', 'approved', :n), "
                "('discord', '7', 'eve', 'XYZ789', 'pending', :n)",
                {"n": now},
            )
            tx.execute(
                "INSERT INTO sessions (agent, conversation, session_id, updated_at) VALUES "
                "('assistant', 'telegram:c1', 'sess-1', :n)",
                {"n": now},
            )
            tx.execute(
                "INSERT INTO kv (scope, key, value, updated_at) VALUES ('sticky', 'telegram:42', 'coder', :n)",
                {"n": now},
            )
            # make the leases of the "dead" workers expire now, so the migration sees no live process
            tx.execute("UPDATE messages SET lease_until = :n - 1000 WHERE status = 'processing'", {"n": now})
            tx.execute("UPDATE agent_leases SET lease_until = :n - 1000", {"n": now})
            tx.execute("UPDATE responses SET lease_until = :n - 1000 WHERE status = 'delivering'", {"n": now})


def test_migrate_sqlite_with_every_status_to_postgresql(tmp_path: Path) -> None:
    sqlite_file = tmp_path / "agentpost.db"
    home = write_home(tmp_path / "home", f"sqlite:///{sqlite_file}", "# keep this comment\n", agents=AGENTS)
    populate(home)
    with open_runtime(home, env={}) as rt:
        source_counts = table_counts(rt.db.read)
    assert all(source_counts[0][t] > 0 for t in TABLE_NAMES), source_counts[0]
    assert set(source_counts[1]["messages"]) == {"pending", "processing", "completed", "dead"}
    assert set(source_counts[1]["responses"]) == {"pending", "delivering", "acked"}
    digest = hashlib.sha256(sqlite_file.read_bytes()).hexdigest()

    with fresh_pg_database() as pg:
        report = migrate(load_settings(home, env={}), pg)
        assert report.switched and (report.tables, report.statuses) == source_counts
        assert hashlib.sha256(sqlite_file.read_bytes()).hexdigest() == digest  # the source is untouched
        text = (home / "settings.toml").read_text()
        assert tomllib.loads(text)["database"]["url"] == pg and "# keep this comment" in text
        # The system runs on the new URL: same rows, and new rows get fresh ids after the copied ones.
        with open_runtime(home, env={}) as rt:
            assert rt.db.dialect.name == "postgresql"
            assert table_counts(rt.db.read) == source_counts
            max_id = rt.db.read_scalar("SELECT MAX(id) FROM messages")
            new = rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), "after the move")
            assert new.id is not None and new.id > max_id
            recovered = rt.queue.failures.recover_stale_messages()
            assert len(recovered.retried) + len(recovered.dead) == 1
            claimed = rt.queue.messages.claim_all_pending_messages("coder", "pg-worker")
            assert {m.message for m in claimed} >= {"waiting"}
            event = rt.events.append("queue", "probe", {})
            assert int(event) > int(source_counts[0]["events"])
            assert rt.queue.responses.claim_responses_for_channel(
                "telegram", "tg-2"
            )  # the pending and the stale one

        # A second migration onto the now non-empty target is refused, and nothing changes.
        sqlite_home = write_home(tmp_path / "other", f"sqlite:///{sqlite_file}", agents=AGENTS)
        before = (sqlite_home / "settings.toml").read_text()
        with pytest.raises(MigrationError, match="not empty"):
            migrate(load_settings(sqlite_home, env={}), pg)
        assert (sqlite_home / "settings.toml").read_text() == before


def test_migrate_refuses_while_a_worker_holds_a_live_lease(tmp_path: Path) -> None:
    home = write_home(tmp_path / "home", f"sqlite:///{tmp_path / 'a.db'}")
    with open_runtime(home, env={}) as rt:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), "busy")
        rt.queue.messages.claim_all_pending_messages("assistant", "live-worker", lease_ms=600_000)
    with fresh_pg_database() as pg:
        with pytest.raises(MigrationError, match="live-worker"):
            migrate(load_settings(home, env={}), pg)
        assert "postgresql" not in (home / "settings.toml").read_text()
