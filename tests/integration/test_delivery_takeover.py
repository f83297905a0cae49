"""A deliverer that died on this host leaves its responses under a running lease; its successor takes them
at once (the holder's pid is gone, or reused by another process), still one per chat and oldest first.
Holders that are alive, on another host, or not named ``host:pid:start`` keep their responses until the lease
runs out. On SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from shared.chat.address import ChatAddress
from shared.queue.core import Queue
from shared.worker_identity import new_worker_id

pytestmark = pytest.mark.integration

LONG_LEASE = 600_000


@pytest.fixture
def dead_worker() -> Iterator[str]:
    """The worker id of a process of this host that has exited (taken while it ran)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    worker = new_worker_id(proc.pid)
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=10)
    yield worker


def _queue_replies(queue: Queue, chat: str, n: int) -> list[int]:
    return [
        queue.responses.enqueue_response(
            ChatAddress("discord", "ann", conversation=chat), f"{chat} reply {i}"
        ).id
        for i in range(n)
    ]


def _holder(queue: Queue, response_id: int) -> object:
    return queue.db.read_scalar("SELECT claimed_by FROM responses WHERE id = :id", {"id": response_id})


def test_the_responses_of_a_dead_deliverer_are_taken_at_once_in_chat_order(
    queue: Queue, dead_worker: str
) -> None:
    a = _queue_replies(queue, "chat-a", 3)
    b = _queue_replies(queue, "chat-b", 2)
    claimed = queue.responses.claim_responses_for_channel(
        "discord", dead_worker, limit=10, lease_ms=LONG_LEASE
    )
    assert sorted(r.id for r in claimed) == [a[0], b[0]]
    assert queue.responses.mark_chunk_delivered(a[0], dead_worker, 0, lease_ms=LONG_LEASE)
    successor = new_worker_id()
    taken = queue.responses.claim_responses_for_channel("discord", successor, limit=10, lease_ms=LONG_LEASE)
    # Both heads at once although the lease has ten minutes to run; nothing after them.
    assert sorted(r.id for r in taken) == [a[0], b[0]]
    assert next(r for r in taken if r.id == a[0]).delivered == 1  # resumes after the part recorded
    assert _holder(queue, a[0]) == successor and _holder(queue, b[0]) == successor
    assert not queue.responses.mark_chunk_delivered(a[0], dead_worker, 1)  # the dead holder is fenced out
    assert queue.responses.claim_responses_for_channel("discord", successor, limit=10) == []
    assert queue.responses.ack_response(a[0], successor)
    assert [r.id for r in queue.responses.claim_responses_for_channel("discord", successor, limit=10)] == [
        a[1]
    ]


def test_alive_other_host_and_unparsed_holders_keep_their_responses_until_the_lease_runs_out(
    queue: Queue, dead_worker: str
) -> None:
    holders = {
        "alive": new_worker_id(),  # this very process
        "other host": "otherhost:" + dead_worker.split(":", 1)[1],  # same pid and start, another host
        "unparsed": "discord:" + dead_worker + ":abc",
    }
    ids: dict[str, int] = {}
    for name, holder in holders.items():
        (rid,) = _queue_replies(queue, name, 1)
        claimed = queue.responses.claim_responses_for_channel(
            "discord", holder, limit=10, lease_ms=LONG_LEASE
        )
        assert [r.id for r in claimed] == [rid]
        ids[name] = rid
    assert queue.responses.claim_responses_for_channel("discord", "successor:1:1", limit=10) == []
    for name, holder in holders.items():
        assert _holder(queue, ids[name]) == holder, name
    # Once the lease has run out, anyone may take them (the old rule, unchanged).
    with queue.db.transaction() as tx:
        tx.execute("UPDATE responses SET lease_until = 1")
    taken = queue.responses.claim_responses_for_channel("discord", "successor:1:1", limit=10)
    assert sorted(r.id for r in taken) == sorted(ids.values())


def test_a_reused_pid_does_not_keep_a_dead_deliverers_responses(queue: Queue) -> None:
    # This process's pid with another start time: the pid now belongs to someone else.
    host, pid, start = new_worker_id().split(":")
    impostor = f"{host}:{pid}:{int(start) + 1}"
    (rid,) = _queue_replies(queue, "chat", 1)
    queue.responses.claim_responses_for_channel("discord", impostor, limit=10, lease_ms=LONG_LEASE)
    taken = queue.responses.claim_responses_for_channel("discord", "successor:1:1", limit=10)
    assert [r.id for r in taken] == [rid]
    # Another channel's deliverer never takes this channel's responses.
    assert queue.responses.claim_responses_for_channel("telegram", "other:1:1", limit=10) == []
