"""AICP's dead-letter settings (seed 004: ``enabled``, ``max_entries``, ``max_retries``, ``retry_delay``) as
``[scheduler.dlq]``, driven through the real scheduler jobs over a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.service import SchedulerService
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.runtime import Runtime
from tests.web_support import kill_until_dead, make_home, runtime_for

pytestmark = pytest.mark.integration


def service(tmp_path: Path, db_url: str, dlq: str) -> tuple[Runtime, SchedulerService]:
    home = make_home(tmp_path, db_url=db_url, extra=f"\n[scheduler.dlq]\n{dlq}\n")
    rt = runtime_for(home)
    return rt, SchedulerService(rt)


def dead(rt: Runtime, n: int) -> list[str]:
    for i in range(n):
        rt.queue.intake.enqueue_message(ChatAddress("web", "ann", conversation=f"c{i}"), f"doomed {i}")
    return kill_until_dead(rt.queue, "alpha")


def archived_ids(rt: Runtime) -> list[str]:
    found = []
    for path in sorted((rt.settings.home / "dlq").glob("*.jsonl")):
        found += [json.loads(line)["message"]["message_id"] for line in path.read_text().splitlines()]
    return found


def test_max_entries_archives_the_oldest_beyond_it_and_drops_nothing(tmp_path: Path, db_url: str) -> None:
    rt, svc = service(tmp_path, db_url, "max_entries = 2")
    try:
        ids = dead(rt, 5)
        with rt.db.transaction() as tx:  # distinct death times, oldest first, all younger than the age limit
            for n, mid in enumerate(ids):
                tx.execute(
                    "UPDATE messages SET updated_at = :t WHERE message_id = :m",
                    {"t": now_ms() - 5000 + n, "m": mid},
                )
        assert svc.archive().archived == 3
        assert rt.queue.admin.dead_count() == 2
        assert sorted(archived_ids(rt)) == sorted(ids[:3])
        assert {m.message_id for m in rt.queue.admin.list_dead()} == set(ids[3:])
    finally:
        rt.close()


def test_disabled_keeps_dead_letters_in_the_database(tmp_path: Path, db_url: str) -> None:
    rt, svc = service(tmp_path, db_url, "enabled = false\nmax_entries = 1")
    try:
        dead(rt, 3)
        assert svc.archive().archived == 0
        assert rt.queue.admin.dead_count() == 3 and archived_ids(rt) == []
    finally:
        rt.close()


def test_auto_retry_after_the_delay_within_its_budget(tmp_path: Path, db_url: str) -> None:
    rt, svc = service(tmp_path, db_url, "auto_retry = true\nretry_delay_seconds = 60\nmax_retries = 1")
    try:
        [mid] = dead(rt, 1)
        assert svc.retry_dead() == []  # died just now: not before its delay
        with rt.db.transaction() as tx:
            tx.execute(
                "UPDATE messages SET updated_at = :t WHERE message_id = :m",
                {"t": now_ms() - 61_000, "m": mid},
            )
        assert svc.retry_dead() == [mid]
        got = rt.queue.admin.get_message(mid)
        assert got is not None and got.status == "pending" and got.retry_count == 0
        # It fails again: dead once more, and its automatic budget (1) is spent.
        kill_until_dead(rt.queue, "alpha")
        with rt.db.transaction() as tx:
            tx.execute(
                "UPDATE messages SET updated_at = :t WHERE message_id = :m",
                {"t": now_ms() - 61_000, "m": mid},
            )
        assert svc.retry_dead() == []
        assert rt.queue.admin.dead_count() == 1
        # The manual budget is separate: an operator can still retry it.
        assert rt.queue.admin.retry_dead(mid).status == "pending"
    finally:
        rt.close()


def test_auto_retry_is_off_by_default(tmp_path: Path, db_url: str) -> None:
    rt, svc = service(tmp_path, db_url, "")
    try:
        [mid] = dead(rt, 1)
        with rt.db.transaction() as tx:
            tx.execute("UPDATE messages SET updated_at = 0 WHERE message_id = :m", {"m": mid})
        assert svc.retry_dead() == []
    finally:
        rt.close()
