"""The dead-letter archive (scheduler.dlq): written before rows are deleted and never twice; restore puts entries back once."""

from __future__ import annotations

import pytest

from scheduler import dlq
from scheduler.service import SchedulerService
from shared.clock import now_ms
from shared.runtime import Runtime
from shared.storage import kv
from shared.storage.kv import Scope
from tests.scheduler_support import (
    count,
    events_of,
    make_dead,
    wait_until,
)

pytestmark = pytest.mark.integration


def test_archive_writes_the_file_before_deleting_and_never_twice(scheduler_rt: Runtime) -> None:
    q = scheduler_rt.queue
    ids = make_dead(q, 3)
    directory = dlq.dlq_dir(scheduler_rt.settings)
    # A crash after the fsync and before the delete: the transaction that selected the rows rolls back.
    with pytest.raises(RuntimeError), scheduler_rt.db.transaction() as tx:
        dlq._archive_batch(tx, directory, now_ms() + 1, 500, now_ms(), dlq.ArchiveResult())
        raise RuntimeError("killed here")
    files = dlq.archive_files(directory)
    assert len(files) == 1 and len(dlq.read_archive(files[0])[0]) == 3
    assert count(q, "dead") == 3  # still in the database too: nothing lost
    result = SchedulerService(scheduler_rt).archive()
    assert (result.archived, result.already_in_file) == (0, 3)
    assert count(q, "dead") == 0
    entries, corrupt = dlq.read_archive(files[0])
    assert corrupt == [] and sorted(e.message_id for e in entries) == sorted(ids)
    assert entries[0].data["error"] == "provider exploded" and entries[0].data["attempts"] >= 1
    assert {e["message_id"] for e in events_of(scheduler_rt, "dead_archived")} == set(ids)
    assert SchedulerService(scheduler_rt).archive().archived == 0


def test_restore_puts_entries_back_once_and_skips_corrupt_lines(scheduler_rt: Runtime) -> None:
    q = scheduler_rt.queue
    ids = make_dead(q, 3)
    SchedulerService(scheduler_rt).archive()
    path = dlq.archive_files(dlq.dlq_dir(scheduler_rt.settings))[0]
    with open(path, "ab") as f:
        f.write(b'{"v":1,"key":"broken\n')  # a torn line, as a crash mid-write would leave
    result = dlq.restore(scheduler_rt.db, scheduler_rt.settings, path, only=ids[1])
    assert result.restored == [ids[1]] and len(result.corrupt) == 1
    assert q.admin.get_message(ids[1]).status == "pending"  # type: ignore[union-attr]
    result = dlq.restore(scheduler_rt.db, scheduler_rt.settings, path)
    assert sorted(result.restored) == sorted([ids[0], ids[2]]) and result.already_restored == [ids[1]]
    # Even once the restored messages finished and were pruned, a second restore does nothing.
    with scheduler_rt.db.transaction() as tx:
        tx.execute("DELETE FROM messages")
    again = dlq.restore(scheduler_rt.db, scheduler_rt.settings, path)
    assert again.restored == [] and sorted(again.already_restored) == sorted(ids)
    with pytest.raises(LookupError):
        dlq.restore(scheduler_rt.db, scheduler_rt.settings, path, only="cli_zzzzzzzz")
    # A restored message that dies again is archived again: a new death, a new line.
    with scheduler_rt.db.transaction() as tx:
        kv.delete_scope(tx, Scope.DLQ_RESTORED)
    dlq.restore(scheduler_rt.db, scheduler_rt.settings, path, only=ids[0])
    worker = "w2"
    claimed = q.messages.claim_all_pending_messages("assistant", worker)
    q.failures.fail_messages([m.message_id for m in claimed], worker, "again")
    q.leases.release_agent("assistant", worker)
    died = now_ms()
    wait_until(lambda: now_ms() > died + 1, what="the clock to move past the death")
    assert SchedulerService(scheduler_rt).archive().archived == 1
    entries = [
        e for p in dlq.archive_files(dlq.dlq_dir(scheduler_rt.settings)) for e in dlq.read_archive(p)[0]
    ]
    assert sorted(e.message_id for e in entries).count(ids[0]) == 2
    info = dlq.status(scheduler_rt.db, dlq.dlq_dir(scheduler_rt.settings), 0)
    assert info["dead_in_database"] == 0 and info["archived_entries"] == 4
    assert sum(f["corrupt"] for f in info["files"]) == 1
