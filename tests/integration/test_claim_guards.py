"""Tests that guard the claims themselves (issue 11): each is built so that a small hand-made mutant of the
queue code fails it every time, not sometimes.

- Recovery at one moment with one expired and one live claim returns only the expired one.
- A crash during a run charges only the group whose run had started.
- An ack is judged by the row it leaves, and a deliverer that lost its lease cannot ack.
- On PostgreSQL, claims raced from 4 connections released together never return one row twice. Every
  round also holds one claimable row locked from another connection (as a transaction touching that row
  would) while the claimers run: with ``SKIP LOCKED`` they pass it by at once; without it a claim waits
  for that lock, which the test sees as a claim that does not return while the lock is held — so removing
  ``SKIP LOCKED`` fails every round. Rows claimed in earlier rounds stay claimed, so a claim that ignores
  the status (re-taking rows already held) fails from the second round on, also every time.
- On PostgreSQL, an operation that reads a row and then changes it (a dead letter's retry, a response given
  back after a send error, a group failed, a pairing approved) acts on the row as another transaction left
  it: that transaction's change is held uncommitted until the operation waits for its row lock, then
  committed. Without the lock the operation acts on its stale read, and each test fails (checked).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import psycopg
import pytest

from adapters import pairing
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue.core import Directory, Queue
from shared.queue.records import LeaseLost, NotFound
from shared.settings.model import QueueSettings
from shared.storage.db import Database
from shared.storage.dialect import libpq_url
from shared.storage.schema import open_database

pytestmark = pytest.mark.integration

T = TypeVar("T")

AGENTS = ("alpha", "beta", "gamma", "delta")
CLAIMERS = 4
ROUNDS = 6
#: How long a claim may take while another connection holds one row locked (it should not wait at all).
CLAIM_DEADLINE = 8.0


@pytest.fixture
def queue(db: Database) -> Queue:
    directory = Directory(agents=frozenset(AGENTS), teams={}, default_agent="alpha")
    return Queue(
        db, QueueSettings(lease_seconds=30, backoff_base_seconds=1, backoff_max_seconds=60), directory
    )


def _row(queue: Queue, table: str, key: str, value: object) -> dict[str, Any]:
    rows = queue.db.read(f"SELECT * FROM {table} WHERE {key} = :v", {"v": value})
    assert len(rows) == 1, rows
    return dict(rows[0])


def _claimed_once(queue: Queue, owner: dict[int, str], rnd: int, worker: str, got: list[int]) -> None:
    """The message rows ``got``, claimed by ``worker`` in round ``rnd``: none was claimed before (``owner``
    records each row's claimer) and each is now processing, claimed by ``worker``."""
    for row_id in got:
        assert row_id not in owner, f"round {rnd}: row {row_id} claimed again ({owner[row_id]})"
        owner[row_id] = worker
        row = _row(queue, "messages", "id", row_id)
        assert (row["status"], row["claimed_by"]) == ("processing", worker)


def _message(queue: Queue, message_id: str) -> dict[str, Any]:
    return _row(queue, "messages", "message_id", message_id)


# -- recovery ---------------------------------------------------------------------------------------------
def test_recovery_at_one_moment_returns_the_expired_claim_and_keeps_the_live_one(queue: Queue) -> None:
    expired = queue.intake.enqueue_message(
        ChatAddress("api", "ann", conversation="c1"), "old job", agent="alpha"
    ).message_id
    live = queue.intake.enqueue_message(
        ChatAddress("api", "bob", conversation="c2"), "running job", agent="beta"
    ).message_id
    start = now_ms()
    assert queue.messages.claim_all_pending_messages("alpha", "w-expired", lease_ms=1_000)
    assert queue.messages.claim_all_pending_messages("beta", "w-live", lease_ms=600_000)
    live_before = _message(queue, live)
    moment = start + 5_000  # past the first lease, far inside the second
    assert int(_message(queue, expired)["lease_until"]) < moment < int(live_before["lease_until"])

    outcome = queue.failures.recover_stale_messages(now=moment)

    assert outcome.retried == [expired] and outcome.dead == []
    back = _message(queue, expired)
    assert back["status"] == "pending" and back["claimed_by"] is None
    assert int(back["available_at"]) <= moment
    kept = _message(queue, live)
    assert kept["status"] == "processing" and kept["claimed_by"] == "w-live"
    assert kept["lease_until"] == live_before["lease_until"] and kept["retry_count"] == 0
    assert kept["last_error"] is None
    assert queue.leases.agent_holder("beta") == "w-live"  # the live worker keeps its agent too
    assert queue.leases.agent_holder("alpha") is None
    # The live worker can still finish its message.
    queue.messages.complete_messages([live], "w-live", "done")
    assert _message(queue, live)["status"] == "completed"


def test_a_crash_during_one_run_charges_only_that_group(queue: Queue) -> None:
    groups = {
        chat: [
            queue.intake.enqueue_message(
                ChatAddress("telegram", chat, sender_id=chat, conversation=chat), f"{chat} message {n}"
            )
            for n in range(2)
        ]
        for chat in ("g1", "g2", "g3")
    }
    ids = {chat: [r.message_id for r in results] for chat, results in groups.items()}
    worker = "w-crashed"
    claimed: set[str] = set()
    for _ in range(3):  # one claim takes them all today; a claim per group would do too
        claimed |= {
            m.message_id for m in queue.messages.claim_all_pending_messages("alpha", worker, lease_ms=1_000)
        }
    assert claimed == {mid for group in ids.values() for mid in group}
    queue.messages.mark_run_started(ids["g2"], worker)
    moment = now_ms() + 5_000

    outcome = queue.failures.recover_stale_messages(now=moment)

    assert sorted(outcome.retried) == sorted(claimed) and outcome.dead == []
    for mid in ids["g2"]:
        row = _message(queue, mid)
        assert row["status"] == "pending" and row["claimed_by"] is None
        assert row["interruptions"] == 1 and row["retry_count"] == 0
        assert "interrupted" in (row["last_error"] or ""), row
    for chat in ("g1", "g3"):
        for mid in ids[chat]:
            row = _message(queue, mid)
            assert row["status"] == "pending" and row["claimed_by"] is None, row
            assert (row["retry_count"], row["interruptions"], row["last_error"]) == (0, 0, None), row
            assert row["run_started_at"] is None and int(row["available_at"]) <= moment, row


# -- acks -------------------------------------------------------------------------------------------------
def _wait_past(ms: int) -> None:
    deadline = time.monotonic() + 5
    while now_ms() <= ms:
        assert time.monotonic() < deadline, "the clock did not move"
        time.sleep(0.001)


def test_an_ack_is_what_the_row_says_and_a_deliverer_without_the_lease_cannot_ack(queue: Queue) -> None:
    first = queue.responses.enqueue_response(
        ChatAddress("telegram", "ann", sender_id="1", conversation="1"), "first reply"
    )

    # A plain delivery: claim, record the chunk, ack; the row says acked.
    [claimed] = queue.responses.claim_responses_for_channel("telegram", "d1")
    assert claimed.id == first.id
    assert queue.responses.mark_chunk_delivered(first.id, "d1", 0)
    before = now_ms()
    assert queue.responses.ack_response(first.id, "d1") is True
    row = _row(queue, "responses", "id", first.id)
    assert row["status"] == "acked" and row["acked_at"] is not None and int(row["acked_at"]) >= before
    assert row["claimed_by"] == "d1" and row["delivered"] == 1 and claimed.status == "delivering"

    # A deliverer whose lease lapsed and was taken over: its ack is refused and changes nothing.
    second = queue.responses.enqueue_response(
        ChatAddress("telegram", "bob", sender_id="2", conversation="2"), "second reply"
    )
    [lapsed] = queue.responses.claim_responses_for_channel("telegram", "d-slow", lease_ms=1)
    assert lapsed.id == second.id
    _wait_past(int(_row(queue, "responses", "id", second.id)["lease_until"]))
    [taken] = queue.responses.claim_responses_for_channel("telegram", "d-new")
    assert taken.id == second.id
    held = _row(queue, "responses", "id", second.id)
    assert not queue.responses.ack_response(second.id, "d-slow")
    assert _row(queue, "responses", "id", second.id) == held  # still delivering, still d-new's
    assert held["status"] == "delivering" and held["claimed_by"] == "d-new" and held["acked_at"] is None

    assert queue.responses.ack_response(second.id, "d-new") is True
    acked = _row(queue, "responses", "id", second.id)
    assert acked["status"] == "acked" and acked["claimed_by"] == "d-new" and acked["acked_at"] is not None
    assert not queue.responses.ack_response(second.id, "d-slow")
    assert _row(queue, "responses", "id", second.id) == acked


# -- PostgreSQL races -------------------------------------------------------------------------------------
class Race(Generic[T]):
    """``CLAIMERS`` threads, each on its own database connection, released together by a barrier."""

    def __init__(self, fn: Callable[[int], T]) -> None:
        self.results: dict[int, T] = {}
        self.errors: list[BaseException] = []
        self._barrier = threading.Barrier(CLAIMERS)
        self._fn = fn
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLAIMERS)]
        for thread in self.threads:
            thread.start()

    def _run(self, index: int) -> None:
        try:
            self._barrier.wait(timeout=20)
            self.results[index] = self._fn(index)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def finished_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self.threads)

    def join(self) -> dict[int, T]:
        for thread in self.threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in self.threads), "a claimer never returned"
        if self.errors:
            raise self.errors[0]
        return self.results


@contextmanager
def row_locked(url: str, table: str, row_ids: Sequence[int]) -> Iterator[None]:
    """Hold ``FOR UPDATE`` locks on rows from another connection (an open transaction) for the block."""
    with psycopg.connect(libpq_url(url)) as conn:
        locked = conn.execute(
            f"SELECT id FROM {table} WHERE id = ANY(%s) FOR UPDATE", (list(row_ids),)
        ).fetchall()
        assert sorted(r[0] for r in locked) == sorted(row_ids)
        try:
            yield
        finally:
            conn.rollback()


def _race_while_locked(
    url: str, table: str, locked: Sequence[int], fn: Callable[[int], T]
) -> tuple[dict[int, T], bool]:
    with row_locked(url, table, locked):
        race = Race(fn)
        prompt = race.finished_within(CLAIM_DEADLINE)
    return race.join(), prompt


@pytest.mark.postgres
def test_postgres_message_claims_for_distinct_agents_never_share_or_wait(pg_url: str) -> None:
    db = open_database(pg_url)
    try:
        queue = Queue(db, QueueSettings(lease_seconds=30), Directory(frozenset(AGENTS), {}, "alpha"))
        owner: dict[int, str] = {}
        for rnd in range(ROUNDS):
            mine: dict[str, list[int]] = {
                agent: [
                    int(
                        queue.intake.enqueue_message(
                            ChatAddress("api", "u", conversation=f"{agent}-{rnd}"),
                            f"r{rnd} {agent} {n}",
                            agent=agent,
                        ).id
                        or 0
                    )
                    for n in range(4)
                ]
                for agent in AGENTS
            }
            locked = [rows[1] for rows in mine.values()]  # one claimable row of each agent, held elsewhere
            workers = [f"w{rnd}-{i}" for i in range(CLAIMERS)]
            results, prompt = _race_while_locked(
                pg_url,
                "messages",
                locked,
                lambda i, w=workers: queue.messages.claim_all_pending_messages(AGENTS[i], w[i]),  # type: ignore[misc]
            )
            assert prompt, f"round {rnd}: a claim waited for a row another transaction held (no SKIP LOCKED?)"
            for i, claimed in results.items():
                got = [m.id for m in claimed]
                assert all(m.agent == AGENTS[i] for m in claimed), (rnd, i, claimed)
                assert sorted(got) == sorted(set(mine[AGENTS[i]]) - set(locked)), (rnd, AGENTS[i], got)
                _claimed_once(queue, owner, rnd, workers[i], got)
            for i, agent in enumerate(AGENTS):
                assert _row(queue, "messages", "id", locked[i])["status"] == "pending"
                # The lock gone, the row passed over is claimed next, by the agent's holder.
                again = queue.messages.claim_all_pending_messages(agent, workers[i])
                assert [m.id for m in again] == [locked[i]], (rnd, agent, again)
                owner[locked[i]] = workers[i]
                queue.leases.release_agent(agent, workers[i])
    finally:
        db.close()


@pytest.mark.postgres
def test_postgres_message_claims_for_one_agent_give_each_row_to_one_worker(pg_url: str) -> None:
    db = open_database(pg_url)
    try:
        queue = Queue(db, QueueSettings(lease_seconds=30), Directory(frozenset(AGENTS), {}, "alpha"))
        owner: dict[int, str] = {}
        for rnd in range(ROUNDS):
            ids = [
                int(
                    queue.intake.enqueue_message(
                        ChatAddress("api", "u", conversation=f"chat-{rnd}"), f"r{rnd} {n}", agent="alpha"
                    ).id
                    or 0
                )
                for n in range(8)
            ]
            locked = [ids[3]]
            workers = [f"w{rnd}-{i}" for i in range(CLAIMERS)]
            results, prompt = _race_while_locked(
                pg_url,
                "messages",
                locked,
                lambda i, w=workers: queue.messages.claim_all_pending_messages("alpha", w[i]),  # type: ignore[misc]
            )
            assert prompt, f"round {rnd}: a claim waited for a row another transaction held (no SKIP LOCKED?)"
            winners = [i for i, claimed in results.items() if claimed]
            assert len(winners) == 1, f"round {rnd}: {len(winners)} workers got messages of one agent"
            (winner,) = winners
            got = [m.id for m in results[winner]]
            assert sorted(got) == sorted(set(ids) - set(locked)), (rnd, got)
            _claimed_once(queue, owner, rnd, workers[winner], got)
            assert queue.leases.agent_holder("alpha") == workers[winner]
            assert _row(queue, "messages", "id", locked[0])["status"] == "pending"
            again = queue.messages.claim_all_pending_messages("alpha", workers[winner])
            assert [m.id for m in again] == locked, (rnd, again)
            owner[locked[0]] = workers[winner]
            queue.leases.release_agent("alpha", workers[winner])
    finally:
        db.close()


@pytest.mark.postgres
def test_postgres_response_claims_never_give_one_response_to_two_deliverers(pg_url: str) -> None:
    db = open_database(pg_url)
    try:
        queue = Queue(db, QueueSettings(lease_seconds=30), Directory(frozenset(AGENTS), {}, "alpha"))
        owner: dict[int, str] = {}
        for rnd in range(ROUNDS):
            ids = [
                queue.responses.enqueue_response(
                    ChatAddress("telegram", "u", conversation=f"{rnd}-{n}"), f"r{rnd} reply {n}"
                ).id
                for n in range(12)
            ]
            locked = [ids[5]]
            workers = [f"d{rnd}-{i}" for i in range(CLAIMERS)]
            results, prompt = _race_while_locked(
                pg_url,
                "responses",
                locked,
                lambda i, w=workers: queue.responses.claim_responses_for_channel("telegram", w[i], limit=100),  # type: ignore[misc]
            )
            assert prompt, f"round {rnd}: a claim waited for a row another transaction held (no SKIP LOCKED?)"
            got: list[int] = []
            for i, claimed in results.items():
                for response in claimed:
                    assert response.id not in owner, (
                        f"round {rnd}: response {response.id} claimed by {workers[i]} and {owner[response.id]}"
                    )
                    owner[response.id] = workers[i]
                    got.append(response.id)
                    row = _row(queue, "responses", "id", response.id)
                    assert (row["status"], row["claimed_by"]) == ("delivering", workers[i])
            assert sorted(got) == sorted(set(ids) - set(locked)), (rnd, got)
            assert _row(queue, "responses", "id", locked[0])["status"] == "pending"
            again = queue.responses.claim_responses_for_channel("telegram", f"d{rnd}-late", limit=100)
            assert [r.id for r in again] == locked, (rnd, again)
            owner[locked[0]] = f"d{rnd}-late"
    finally:
        db.close()


def _waiting_for_a_lock(pg_url: str, pid: int, deadline: float) -> bool:
    """True once server process ``pid`` waits for a row lock (before ``deadline``, time.monotonic)."""
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            if row is not None and row[0] == "Lock":
                return True
            time.sleep(0.01)
    return False


@pytest.mark.postgres
def test_postgres_recovery_keeps_a_claim_renewed_while_it_was_deciding(pg_url: str) -> None:
    # A worker that stalled past its lease renews it while another process's recovery has already read the
    # claim as expired. Recovery must act on the row as it is when it takes it back (renewed: keep it), not
    # as it read it a moment before; otherwise the live worker's message is handed out a second time while
    # it runs (seen as "delivered twice to processes never killed" in the benchmark's kill test).
    db = open_database(pg_url)
    try:
        queue = Queue(db, QueueSettings(lease_seconds=30), Directory(frozenset(AGENTS), {}, "alpha"))
        mid = queue.intake.enqueue_message(
            ChatAddress("api", "ann", conversation="c"), "long job", agent="alpha"
        ).message_id
        assert queue.messages.claim_all_pending_messages("alpha", "w-stalled", lease_ms=1)
        _wait_past(int(_message(queue, mid)["lease_until"]))
        with psycopg.connect(libpq_url(pg_url)) as renewer:
            # The renewal, as the stalled worker sends it, in a transaction not yet committed.
            renewer.execute(
                "UPDATE messages SET lease_until = %s WHERE status = 'processing' AND claimed_by = %s "
                "AND message_id = %s",
                (now_ms() + 600_000, "w-stalled", mid),
            )
            recovery_pid: list[int] = []
            outcome: list[Any] = []

            def recover() -> None:
                recovery_pid.append(queue.db.connection().info.backend_pid)
                outcome.append(queue.failures.recover_stale_messages())

            worker = threading.Thread(target=recover)
            worker.start()
            deadline = time.monotonic() + 10
            while not recovery_pid and time.monotonic() < deadline:
                time.sleep(0.005)
            # Recovery read the claim as expired and now waits for the renewal's row lock.
            assert recovery_pid and _waiting_for_a_lock(pg_url, recovery_pid[0], deadline)
            renewer.commit()
            worker.join(timeout=10)
            assert not worker.is_alive()
        kept = _message(queue, mid)
        assert (kept["status"], kept["claimed_by"]) == ("processing", "w-stalled"), kept
        assert outcome and outcome[0].retried == []
        queue.messages.complete_messages([mid], "w-stalled", "done")
        assert _message(queue, mid)["status"] == "completed"
    finally:
        db.close()


def _act_behind_an_uncommitted_change(
    db: Database, pg_url: str, change: str, params: Sequence[Any], act: Callable[[], Any]
) -> Any:
    """Run ``change`` in a transaction of another connection, left open; run ``act`` (an operation on
    ``db``) in a thread until its connection waits for that transaction's row lock (``pg_stat_activity``);
    commit the change; return what ``act`` returned or raised. The operation has by then read the row as
    it was before the change, as a real race would have it."""
    with psycopg.connect(libpq_url(pg_url)) as other:
        other.execute(change, params)
        pid: list[int] = []
        outcome: list[Any] = []

        def run() -> None:
            pid.append(db.connection().info.backend_pid)
            try:
                outcome.append(act())
            except Exception as exc:  # the caller checks what happened
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 10
        while not pid and time.monotonic() < deadline:
            time.sleep(0.005)
        assert pid and _waiting_for_a_lock(pg_url, pid[0], deadline), "the operation never met the lock"
        other.commit()
        thread.join(timeout=10)
        assert not thread.is_alive() and outcome
    return outcome[0]


@pytest.mark.postgres
def test_postgres_retry_of_a_dead_letter_retried_meanwhile_changes_nothing(pg_url: str) -> None:
    # Two retries of one dead letter at once (a double click on the dashboard, /retry in the chat beside
    # it): the first puts it back and a worker claims it before the second acts. The second must see the
    # row as it is then (no longer dead) and leave it alone; acting on what it read a moment earlier would
    # hand the running message back to the queue, and it would run twice.
    db = open_database(pg_url)
    try:
        queue = Queue(db, QueueSettings(manual_retry_budget=5), Directory(frozenset(AGENTS), {}, "alpha"))
        mid = queue.intake.enqueue_message(
            ChatAddress("api", "ann", conversation="c"), "doomed", agent="alpha"
        ).message_id
        assert queue.messages.claim_all_pending_messages("alpha", "w1")
        queue.failures.fail_messages([mid], "w1", "broken", permanent=True)
        queue.leases.release_agent("alpha", "w1")
        assert _message(queue, mid)["status"] == "dead"
        outcome = _act_behind_an_uncommitted_change(
            db,
            pg_url,
            # The first retry, and the claim that follows it.
            "UPDATE messages SET status = 'processing', claimed_by = 'w2', manual_retries = 1, "
            "lease_until = %s WHERE message_id = %s",
            (now_ms() + 600_000, mid),
            lambda: queue.admin.retry_dead(mid),
        )
        kept = _message(queue, mid)
        assert (kept["status"], kept["claimed_by"], kept["manual_retries"]) == ("processing", "w2", 1), kept
        assert isinstance(outcome, NotFound), outcome
    finally:
        db.close()


@pytest.mark.postgres
def test_postgres_send_retry_of_a_response_taken_over_meanwhile_changes_nothing(pg_url: str) -> None:
    # A deliverer gives a response back after a send error while another deliverer has just taken it over
    # (its lease had lapsed) and sent it. Giving it back on the strength of the look before the takeover
    # would make it pending again: the chat would get the reply twice.
    db = open_database(pg_url)
    try:
        queue = Queue(db, QueueSettings(), Directory(frozenset(AGENTS), {}, "alpha"))
        reply = queue.responses.enqueue_response(
            ChatAddress("telegram", "ann", sender_id="1", conversation="1"), "the reply"
        )
        [claimed] = queue.responses.claim_responses_for_channel("telegram", "d-slow")
        assert claimed.id == reply.id
        outcome = _act_behind_an_uncommitted_change(
            db,
            pg_url,
            "UPDATE responses SET claimed_by = 'd-new', delivered = 1 WHERE id = %s",
            (reply.id,),
            lambda: queue.responses.retry_response_later(
                reply.id, "d-slow", "timed out", base_ms=1000, max_ms=60_000
            ),
        )
        kept = _row(queue, "responses", "id", reply.id)
        assert (kept["status"], kept["claimed_by"], kept["delivered"]) == ("delivering", "d-new", 1), kept
        assert outcome is None, outcome
    finally:
        db.close()


@pytest.mark.postgres
def test_postgres_failure_of_a_message_taken_back_meanwhile_changes_nothing(pg_url: str) -> None:
    # A worker that stalled past its lease reports its run failed while recovery has just taken the
    # message back and another worker claimed it. The report must find the message no longer held and
    # change nothing; putting it back to pending would run it a second time beside the new worker's run.
    db = open_database(pg_url)
    try:
        queue = Queue(db, QueueSettings(), Directory(frozenset(AGENTS), {}, "alpha"))
        mid = queue.intake.enqueue_message(
            ChatAddress("api", "ann", conversation="c"), "job", agent="alpha"
        ).message_id
        assert queue.messages.claim_all_pending_messages("alpha", "w-stalled")
        outcome = _act_behind_an_uncommitted_change(
            db,
            pg_url,
            "UPDATE messages SET claimed_by = 'w-new', lease_until = %s WHERE message_id = %s",
            (now_ms() + 600_000, mid),
            lambda: queue.failures.fail_messages([mid], "w-stalled", "the CLI exited with status 1"),
        )
        kept = _message(queue, mid)
        assert (kept["status"], kept["claimed_by"], kept["retry_count"]) == ("processing", "w-new", 0), kept
        assert isinstance(outcome, LeaseLost), outcome
    finally:
        db.close()


@pytest.mark.postgres
def test_postgres_approval_of_a_pairing_revoked_meanwhile_changes_nothing(pg_url: str) -> None:
    # The operator approves a code while the sender's pairing is being revoked: the approval must see the
    # revocation and refuse, not approve on the strength of the pending row it read a moment earlier.
    db = open_database(pg_url)
    try:
        check = pairing.check_sender(db, "telegram", "42", "Ann")
        assert check.decision == "new_code"
        outcome = _act_behind_an_uncommitted_change(
            db,
            pg_url,
            "UPDATE pairings SET status = 'revoked' WHERE channel = %s AND sender_id = %s",
            ("telegram", "42"),
            lambda: pairing.approve(db, check.code),
        )
        assert isinstance(outcome, pairing.PairingError), outcome
        assert not pairing.is_approved(db, "telegram", "42")
    finally:
        db.close()
