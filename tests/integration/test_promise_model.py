"""A model-based test of the promise (issue 39): every accepted message is pending, running, or ended in
exactly one visible outcome told to the chat it came from — one final reply, or one notice that it died —
through random interleavings of what processors, users and operators do, on SQLite and on PostgreSQL.

A Hypothesis rule-based state machine drives the real queue (``shared.queue``) and the processor's real
outcome writer (:class:`workers.run_outcome.OutcomeWriter`, which writes what a run came to through the queue,
as the processor does) with no agent CLI: a rule says what the "CLI" answered. The rules:

- ``first_messages`` (each example's start) and ``enqueue``: a user sends a message, to the team's leader or
  to the teammate, from one of three chats;
- ``claim``: a worker claims every available message of an agent (its groups merged as the processor merges
  them), and may start the first at once; ``start``: it marks its next group's run started; ``steer``: it
  claims the running chat's new messages into the run (``claim_chat_into_run``, the ``steer`` busy policy);
- ``succeed`` (the reply may hand work to the teammate: an internal message one hop further, whose answer
  goes to the chain's origin chat), ``fail`` (transient: retried, dead at ``max_retries``; permanent: dead at
  once), ``stop`` (``/stop`` through ``queue.control``, for the running or a waiting group); ``work`` does
  claim, start and one of these outcomes in one step, so long chains happen in short examples;
- ``tick``: a worker renews its leases (one that lost some gives back what it holds, as the processor does)
  and puts back claims none of its groups holds (the processor's stranded-claim sweep);
- ``expire_leases``: the clock moves past every lease and the recovery sweep runs: the worker on "another
  host" (whose holder state the queue cannot see) loses its claims and still thinks it holds them; a live
  worker on this host keeps its claims until the stall ceiling;
- ``crash``: a worker dies (on this host its process is killed; its in-memory holdings are gone; a new one
  starts in its place), and ``recover`` — the recovery sweep — takes its claims back;
- ``retry_dead``: an operator retries a dead letter (``dead retry``), within the manual-retry budget.

After every step the invariant is checked against the database alone (the model only says which messages
were accepted): every accepted message exists, in one of ``pending``, ``processing`` (held by a worker that
exists or existed), ``completed`` or ``dead``; a completed one is named by exactly one ``response_ready``
event, whose response is addressed to the message's origin chat (its own chat; for a handoff, the chat its
chain started from); no other message is named by one (no duplicate final); every message that died in the
step is told in a notice to its origin chat, one notice per chat, and no notice goes to a chat none of whose
messages died; every steered message belongs to the running chat; every run whose outcome was written has
its usage recorded exactly once (a failed run's cost counts to budgets too), and one fenced off records none.
At the end of each example every worker's claims are taken back and a fresh worker answers everything: then
every accepted message has ended, each told once.

``make test`` runs a bounded number of examples per database; ``AGENTPOST_STATEFUL_EXAMPLES`` and
``AGENTPOST_STATEFUL_STEPS`` run it longer (``bench/promise_model.sh``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from shared.chat.address import ChatAddress
from shared.ids import new_id
from shared.queue.core import LeaseLost, QueuedMessage, RetryBudgetExhausted
from shared.runtime import Runtime
from shared.settings.sections import ProcessorSettings
from shared.storage.models import TABLE_NAMES
from shared.worker_identity import new_worker_id
from tests.homes import build_home, open_home
from workers.budgets import usage_work
from workers.busy import merge_arrivals
from workers.drive import Drive
from workers.liveness import RunInfo
from workers.pauses import RateLimitPauses
from workers.processor_config import ProcessorStats
from workers.providers.base import RunResult, RunUsage
from workers.run_outcome import OutcomeWriter
from workers.storage_steps import StorageSteps
from workers.teams import origin_of

#: How many examples (random runs) and steps per example: bounded for ``make test`` (about 10 s on SQLite and
#: 30 s on PostgreSQL on a 2-core machine), longer by environment variable.
EXAMPLES = int(os.environ.get("AGENTPOST_STATEFUL_EXAMPLES", "100"))
STEPS = int(os.environ.get("AGENTPOST_STATEFUL_STEPS", "40"))
# The timeout grows with a longer run asked for by environment variable.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(max(300, EXAMPLES * STEPS // 5))]

LEAD, MATE = "lead", "mate"
AGENTS = (LEAD, MATE)
CHATS = (
    ChatAddress("telegram", "ann", sender_id="1", conversation="c1"),
    ChatAddress("telegram", "bob", sender_id="2", conversation="c2"),
    ChatAddress("discord", "cy", sender_id="3", conversation="c1"),
)
#: Two workers on this host (each a real process, so a crash is a process gone) and one on "another host",
#: whose claims only an expired lease gives back.
LOCAL, REMOTE = ("w0", "w1"), "far"
WORKERS = (*LOCAL, REMOTE)
QUEUE = {
    "max_retries": 2,
    "max_interrupted_runs": 2,
    "manual_retry_budget": 1,
    "max_hops": 2,
    "max_chain_runs": 6,
    "lease_seconds": 30.0,
    "backoff_base_seconds": 0.0,  # a failed message is available again at once: the model has no clock
    "backoff_max_seconds": 0.0,
}
#: The kinds of response that end a message (a retry note or a budget notice is not an outcome).
FINAL_KINDS = {"final", "stopped", "dropped"}
TRANSIENT = RunResult(ok=False, error="the CLI exited with status 1", exit_code=1)
PERMANENT = RunResult(ok=False, error="cannot start the agent: no such file", cannot_start=True)


@dataclass
class Worker:
    """One processor: its id, its process (on this host), and what it holds per agent."""

    name: str
    wid: str
    proc: subprocess.Popen[bytes] | None
    drives: dict[str, Drive] = field(default_factory=dict)
    runs: dict[str, RunInfo] = field(default_factory=dict)

    def drive(self, agent: str) -> Drive:
        return self.drives.setdefault(agent, Drive(agent))

    def held(self) -> dict[str, list[str]]:
        return {agent: drive.held_ids() for agent, drive in self.drives.items()}


def _start_worker(name: str, generation: int) -> Worker:
    if name == REMOTE:
        # Not ``host:pid:start`` of this host: the queue cannot tell whether it lives (only its lease says).
        return Worker(name, f"elsewhere:{generation}:1", None)
    proc = subprocess.Popen(
        ["sleep", "3600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return Worker(name, new_worker_id(proc.pid), proc)


def _reset(rt: Runtime) -> None:
    """Empty every table (the schema stays): each example starts from an empty queue."""
    with rt.db.transaction() as tx:
        for table in TABLE_NAMES:
            if table != "schema_version":
                tx.execute(f"DELETE FROM {table}")


def _origin_key(row: dict[str, Any]) -> tuple[str, str]:
    """The key of the chat a message's outcome must reach: its own, or its chain's origin."""
    message = QueuedMessage.from_row(row)
    origin = origin_of(message)
    assert origin is not None, f"{message.message_id} has no chat to be told in"
    return ChatAddress.of(origin).key


def _payload(row: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(row["payload"]) if row["payload"] else {}
    return value


class PromiseMachine(RuleBasedStateMachine):
    """The state machine; :func:`_machine_for` binds it to one runtime (a database) per test."""

    rt: Runtime
    workspace: Path
    clock: Clock

    def __init__(self) -> None:
        super().__init__()
        _reset(self.rt)
        self.generation = 0
        self.workers: dict[str, Worker] = {}
        self.every_wid: set[str] = set()
        for name in WORKERS:
            self._new_worker(name)
        self.accepted: set[str] = set()
        self.counter = 0
        #: Runs whose outcome landed (their usage must be recorded once) and runs fenced off (none).
        self.landed_runs: set[str] = set()
        self.fenced_runs: set[str] = set()
        self.dead_now: list[str] = []
        self.pending = 0
        self.seen_event = 0
        self.seen_response = 0
        self.finals: Counter[str] = Counter()

    # -- helpers ---------------------------------------------------------------------------------------------
    def _new_worker(self, name: str) -> None:
        self.generation += 1
        worker = _start_worker(name, self.generation)
        self.workers[name] = worker
        self.every_wid.add(worker.wid)

    def _writer(self, worker: Worker, agent: str) -> OutcomeWriter:
        storage = StorageSteps(
            self.rt,
            worker.wid,
            config=ProcessorSettings,
            stopping=lambda: False,
            held=worker.held,
            on_outage_end=lambda: None,
        )
        return OutcomeWriter(
            self.rt,
            worker.drive(agent),
            worker=worker.wid,
            config=ProcessorSettings(),
            stats=ProcessorStats(),
            pauses=RateLimitPauses(),
            storage=storage,
        )

    def _release_if_idle(self, worker: Worker, agent: str) -> None:
        """As the processor does when a drive holds nothing more: give up the agent's lease."""
        drive = worker.drive(agent)
        if not drive.held():
            if not drive.released:
                self.rt.queue.leases.release_agent(agent, worker.wid)
            worker.drives.pop(agent, None)

    def _give_back(self, worker: Worker, agent: str) -> None:
        """A drive that lost its lease gives back every group it holds (``AgentDriver._release``): a
        group another worker holds now is not its to touch."""
        drive = worker.drive(agent)
        for group in drive.held():
            with contextlib.suppress(LeaseLost):
                self.rt.queue.failures.fail_messages(
                    group.ids, worker.wid, "released: lease lost", count_attempt=False, retry_after_ms=0
                )
            drive.forget(group)
        worker.runs.pop(agent, None)
        self.rt.queue.leases.release_agent(agent, worker.wid)
        worker.drives.pop(agent, None)

    def _end_run(self, worker: Worker, agent: str, landed: bool | None) -> None:
        """The run of ``agent`` ended: its outcome ``landed`` (its usage is recorded), was fenced off (none
        is), or (None) was a stop, whose killed CLI reports no usage."""
        run = worker.runs.pop(agent)
        if landed is not None:
            (self.landed_runs if landed else self.fenced_runs).add(run.run_id)
        self._release_if_idle(worker, agent)

    # -- rules: each draws among the workers and agents it can act on now ------------------------------------
    def _pairs(self, held: str) -> list[tuple[str, str]]:
        """(worker, agent) pairs whose drive holds ``held``: ``run`` (a run going on), ``start`` (a group
        waiting and none running), ``any`` (anything)."""
        pairs = []
        for name, worker in sorted(self.workers.items()):
            for agent, drive in sorted(worker.drives.items()):
                can = {
                    "run": agent in worker.runs,
                    "start": drive.running is None and bool(drive.groups),
                    "any": bool(drive.held()),
                }
                if can[held]:
                    pairs.append((name, agent))
        return pairs

    @initialize(
        sent=st.lists(st.tuples(st.sampled_from(CHATS), st.sampled_from(AGENTS)), min_size=1, max_size=4)
    )
    def first_messages(self, sent: list[tuple[ChatAddress, str]]) -> None:
        # Every example starts with a few messages, so its steps have something to work on.
        for chat, agent in sent:
            self.enqueue(chat, agent)

    @precondition(lambda self: self.pending > 0)
    @rule(name=st.sampled_from(WORKERS), agent=st.sampled_from(AGENTS), start=st.booleans())
    def claim(self, name: str, agent: str, start: bool) -> None:
        # A processor usually starts the first group it claims at once; between the two a crash costs the
        # messages nothing, so both are steps of their own too.
        self.do_claim(name, agent)
        if start:
            self.do_start(name, agent)

    @rule(
        name=st.sampled_from(WORKERS),
        agent=st.sampled_from(AGENTS),
        outcome=st.sampled_from(["answer", "hand on", "fail", "fail for good"]),
    )
    def work(self, name: str, agent: str, outcome: str) -> None:
        """A processor's whole turn for an agent: claim what is available, start the next group unless one
        runs, and write the run's outcome (the single steps below interleave with others' too)."""
        self.do_claim(name, agent)
        if agent not in self.workers[name].runs:
            self.do_start(name, agent)
        if agent not in self.workers[name].runs:
            return
        if outcome in ("answer", "hand on"):
            self.do_succeed(name, agent, outcome == "hand on")
        else:
            self.do_fail(name, agent, outcome == "fail for good")

    @precondition(lambda self: bool(self._pairs("start")))
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        self.do_start(*data.draw(st.sampled_from(self._pairs("start"))))

    @precondition(lambda self: bool(self._pairs("run")))
    @rule(data=st.data())
    def steer(self, data: st.DataObject) -> None:
        self.do_steer(*data.draw(st.sampled_from(self._pairs("run"))))

    @precondition(lambda self: bool(self._pairs("run")))
    @rule(data=st.data(), hand_on=st.booleans())
    def succeed(self, data: st.DataObject, hand_on: bool) -> None:
        self.do_succeed(*data.draw(st.sampled_from(self._pairs("run"))), hand_on)

    @precondition(lambda self: bool(self._pairs("run")))
    @rule(data=st.data(), permanent=st.booleans())
    def fail(self, data: st.DataObject, permanent: bool) -> None:
        self.do_fail(*data.draw(st.sampled_from(self._pairs("run"))), permanent)

    @precondition(lambda self: bool(self._pairs("any")))
    @rule(data=st.data(), waiting=st.booleans())
    def stop(self, data: st.DataObject, waiting: bool) -> None:
        self.do_stop(*data.draw(st.sampled_from(self._pairs("any"))), waiting)

    # -- actions ---------------------------------------------------------------------------------------------
    @rule(chat=st.sampled_from(CHATS), agent=st.sampled_from(AGENTS))
    def enqueue(self, chat: ChatAddress, agent: str) -> None:
        self.counter += 1
        sent = self.rt.queue.intake.enqueue_message(chat, f"message {self.counter}", agent=agent)
        assert not sent.duplicate
        self.accepted.add(sent.message_id)

    def do_claim(self, name: str, agent: str) -> None:
        worker = self.workers[name]
        claimed = self.rt.queue.messages.claim_all_pending_messages(agent, worker.wid)
        for message in claimed:
            assert message.agent == agent and message.claimed_by == worker.wid
        if claimed:
            drive = worker.drive(agent)
            drive.released = False
            merge_arrivals(drive.groups, claimed, lambda _key: "collect")

    def do_start(self, name: str, agent: str) -> None:
        worker = self.workers[name]
        drive = worker.drives.get(agent)
        if drive is None or drive.running is not None or not drive.groups:
            return
        group = drive.groups.pop(0)
        drive.running = group
        try:
            self.rt.queue.messages.mark_run_started(group.ids, worker.wid)
        except LeaseLost:  # as Run.go: the drive is lost, the group forgotten
            drive.forget(group)
            self._give_back(worker, agent)
            return
        worker.runs[agent] = RunInfo(agent, new_id("run"), group)

    def do_steer(self, name: str, agent: str) -> None:
        worker = self.workers[name]
        run = worker.runs.get(agent)
        if run is None:
            return
        group = run.group
        steered = self.rt.queue.messages.claim_chat_into_run(
            agent, worker.wid, group.messages[0].address, run.run_id
        )
        for message in steered:
            # The privacy property: only the running chat's own messages, for this agent.
            assert message.conversation_key == group.key, (message, group.key)
            assert message.agent == agent
        group.messages.extend(steered)  # as Run._steer: answered by the run's one final reply

    def do_succeed(self, name: str, agent: str, hand_on: bool) -> None:
        worker = self.workers[name]
        run = worker.runs.get(agent)
        if run is None:
            return
        other = MATE if agent == LEAD else LEAD
        text = f"done. [@{other}: please check part {self.counter}]" if hand_on else "done."
        result = RunResult(
            ok=True, text=text, usage=RunUsage(input_tokens=10, output_tokens=5, cost_usd=0.01)
        )
        spent = usage_work(agent, run.run_id, run.group.messages[0], result)
        assert spent is not None
        landed = anyio.run(
            self._writer(worker, agent).succeeded, run, result, self.workspace, run.group.chat, spent
        )
        self._end_run(worker, agent, landed)

    def do_fail(self, name: str, agent: str, permanent: bool) -> None:
        worker = self.workers[name]
        run = worker.runs.get(agent)
        if run is None:
            return
        base = PERMANENT if permanent else TRANSIENT
        result = RunResult(
            ok=False,
            error=base.error,
            exit_code=base.exit_code,
            cannot_start=base.cannot_start,
            usage=RunUsage(input_tokens=7, output_tokens=1, cost_usd=0.02),
        )
        spent = usage_work(agent, run.run_id, run.group.messages[0], result)
        writer = self._writer(worker, agent)
        anyio.run(writer.failed, run.group, result, False, spent)
        # The writer counts a failure written, or a lease lost (the write fenced off).
        self._end_run(worker, agent, writer.stats.lease_lost == 0)

    def do_stop(self, name: str, agent: str, waiting: bool) -> None:
        worker = self.workers[name]
        drive = worker.drives.get(agent)
        if drive is None:
            return
        run = worker.runs.get(agent)
        group = drive.groups[0] if waiting and drive.groups else run.group if run is not None else None
        if group is None:
            return
        self.rt.queue.control.request_stop(agent, group.chat)
        taken = self.rt.queue.control.take_stop_request(agent, worker.wid)
        if not taken:
            return  # this worker no longer holds the agent: the request waits for whoever does
        writer = self._writer(worker, agent)
        if run is not None and taken in ("*", run.group.chat):
            anyio.run(writer.stopped, run.group, run.edit_key)
            self._end_run(worker, agent, None)
            return
        stopped = next((g for g in drive.groups if taken in ("*", g.chat)), None)
        if stopped is not None:
            anyio.run(writer.stopped, stopped, None)
            self._release_if_idle(worker, agent)

    @rule(name=st.sampled_from(WORKERS))
    def tick(self, name: str) -> None:
        """What a processor does between runs' steps: renew its leases (a drive that lost some gives back
        what it holds: the run is stopped, nothing of it is sent), then put back claims none of its drives
        holds (its stranded-claim sweep)."""
        worker = self.workers[name]
        for agent, drive in list(worker.drives.items()):
            ids = drive.held_ids()
            held = self.rt.queue.leases.renew_leases(worker.wid, ids, agent=agent)
            if held < len(ids):
                run = worker.runs.get(agent)
                if run is not None:
                    self.fenced_runs.add(run.run_id)
                self._give_back(worker, agent)
        anyio.run(self._writer(worker, AGENTS[0]).storage.sweep_stranded)

    @rule()
    def expire_leases(self) -> None:
        # Time passes every lease held now, then the recovery sweep runs: holders the queue cannot see alive
        # (the remote worker) lose their claims; a live worker on this host keeps its own (a stall is not a
        # failure of the message) but not its agent lease, should another worker want the agent.
        self.clock.advance(self.rt.queue.config.lease_ms + 1)
        self.rt.queue.failures.recover_stale_messages()

    @rule(name=st.sampled_from(WORKERS))
    def crash(self, name: str) -> None:
        worker = self.workers[name]
        if worker.proc is not None:
            worker.proc.kill()
            worker.proc.wait()
        for run in worker.runs.values():
            self.fenced_runs.add(run.run_id)
        self._new_worker(name)

    @rule()
    def recover(self) -> None:
        self.rt.queue.failures.recover_stale_messages()

    @precondition(lambda self: bool(self.dead_now))
    @rule(data=st.data())
    def retry_dead(self, data: st.DataObject) -> None:
        # In the order the messages were queued: message ids are random, so sorting by them would make a
        # replayed example retry another message.
        message_id = data.draw(st.sampled_from(self.dead_now))
        with contextlib.suppress(RetryBudgetExhausted):
            self.rt.queue.admin.retry_dead(message_id)

    # -- the invariant ---------------------------------------------------------------------------------------
    @invariant()
    def promise_holds(self) -> None:
        check_promise(self)

    def teardown(self) -> None:
        try:
            if not getattr(self, "workers", None):
                return
            self._drain()
        finally:
            for worker in self.workers.values():
                if worker.proc is not None:
                    worker.proc.kill()
                    worker.proc.wait()

    def _drain(self) -> None:
        """Every worker's claims back (past any lease and stall ceiling), then a fresh worker answers
        everything: every accepted message ends, each told once."""
        for name in WORKERS:
            self.crash(name)
        config = self.rt.queue.config
        self.clock.advance(config.lease_ms + config.stall_ceiling_ms + 1)
        self.rt.queue.failures.recover_stale_messages()
        check_promise(self)
        for _ in range(60):
            busy = False
            for agent in AGENTS:
                self.do_claim(LOCAL[0], agent)
                while self.workers[LOCAL[0]].drives.get(agent) is not None:
                    busy = True
                    self.do_start(LOCAL[0], agent)
                    self.do_succeed(LOCAL[0], agent, hand_on=False)
                check_promise(self)
            if not busy:
                break
        statuses = Counter(str(r["status"]) for r in self.rt.db.read("SELECT status FROM messages"))
        assert set(statuses) <= {"completed", "dead"}, statuses


def check_promise(machine: PromiseMachine) -> None:
    """The invariant (see the module docstring), from the database."""
    rt = machine.rt
    rows = {str(r["message_id"]): dict(r) for r in rt.db.read("SELECT * FROM messages ORDER BY id")}
    events = [dict(e) for e in rt.db.read("SELECT id, type, message_id, payload FROM events ORDER BY id")]
    responses = {int(r["id"]): dict(r) for r in rt.db.read("SELECT * FROM responses ORDER BY id")}
    handoffs = {str(_payload(e)["message_id"]) for e in events if e["type"] == "chain_handoff"}
    # No message lost, none made up: the rows are what was accepted and what completions handed on.
    missing = machine.accepted - rows.keys()
    assert not missing, f"accepted messages lost: {missing}"
    assert rows.keys() == machine.accepted | handoffs, rows.keys() ^ (machine.accepted | handoffs)
    for row in rows.values():
        assert row["status"] in ("pending", "processing", "completed", "dead"), row
        if row["status"] == "processing":
            assert row["claimed_by"] in machine.every_wid and row["lease_until"] is not None, row
    # Finals: each completed message is named by exactly one response_ready event; no other message is.
    finals: Counter[str] = Counter()
    for event in events:
        if event["type"] != "response_ready":
            continue
        payload = _payload(event)
        if "message_ids" not in payload:
            continue  # a note (Responses.note_in), not an outcome
        response = responses[int(payload["response_id"])]
        assert json.loads(response["metadata"]).get("kind") in FINAL_KINDS, response
        for mid in payload["message_ids"]:
            finals[mid] += 1
            told = (response["channel"], ChatAddress.of(response).chat)
            assert told == _origin_key(rows[mid]), (mid, told, response)
    assert not [e for e in events if e["type"] == "message_completed"], "a completion told nobody"
    for mid, row in rows.items():
        want = 1 if row["status"] == "completed" else 0
        assert finals[mid] == want, (mid, row["status"], finals[mid])
    # Deaths since the last check: one notice per origin chat of the messages that died, none elsewhere.
    new_events = [e for e in events if e["id"] > machine.seen_event]
    died = {str(e["message_id"]) for e in new_events if e["type"] == "message_dead"}
    for mid in died:
        assert rows[mid]["status"] == "dead", rows[mid]
    notices = [
        r
        for rid, r in responses.items()
        if rid > machine.seen_response and json.loads(r["metadata"]).get("kind") == "dead_notice"
    ]
    told_chats = Counter((r["channel"], ChatAddress.of(r).chat) for r in notices)
    want_chats = {_origin_key(rows[mid]) for mid in died}
    assert told_chats == Counter(want_chats), (told_chats, want_chats, died)
    # Usage: once per run whose outcome landed, never for one fenced off.
    usage = Counter(str(r["run_id"]) for r in rt.db.read("SELECT run_id FROM run_usage"))
    assert all(n == 1 for n in usage.values()), usage
    for run_id in machine.landed_runs:
        assert usage[run_id] == 1, run_id
    for run_id in machine.fenced_runs - machine.landed_runs:
        assert usage[run_id] == 0, run_id
    machine.seen_event = max((e["id"] for e in events), default=0)
    machine.seen_response = max(responses, default=0)
    machine.dead_now = [mid for mid, row in rows.items() if row["status"] == "dead"]
    machine.pending = sum(1 for row in rows.values() if row["status"] == "pending")


def _machine_for(rt: Runtime, workspace: Path, clock: Clock) -> type[PromiseMachine]:
    return type("Promise", (PromiseMachine,), {"rt": rt, "workspace": workspace, "clock": clock})


class Clock:
    """The wall clock the queue reads (``shared.clock.now_ms``, through ``time.time_ns``), moved forward at
    will: a lease lapses when the model says so, not after a real wait."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset_ns = 0
        real = time.time_ns
        monkeypatch.setattr(time, "time_ns", lambda: real() + self.offset_ns)

    def advance(self, ms: int) -> None:
        self.offset_ns += ms * 1_000_000


@pytest.fixture
def promise_rt(tmp_path: Path, db_url: str) -> Iterator[Runtime]:
    """A home with a team (lead and mate) on the test's database; the agents never run (no CLI)."""
    agent = {"provider": "command", "command": ["false"]}
    home = build_home(
        tmp_path,
        db_url,
        {LEAD: agent, MATE: agent},
        teams={"dev": {"agents": [LEAD, MATE], "leader": LEAD}},
        queue=QUEUE,
    )
    with open_home(home) as rt:
        yield rt


def test_the_promise_holds_through_random_interleavings(
    promise_rt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    run_state_machine_as_test(
        _machine_for(promise_rt, workspace, Clock(monkeypatch)),
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_a_teammates_dead_letter_is_told_in_the_chat_its_chain_started_from(
    promise_rt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the state machine found first (issue 39, item 3), kept as its regression example: the leader
    hands part of the work to its teammate, whose run fails until the message is a dead letter; the user,
    who saw the leader's answer, must be told."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    machine = _machine_for(promise_rt, workspace, Clock(monkeypatch))()
    w0 = LOCAL[0]
    try:
        machine.first_messages([(CHATS[0], LEAD)])
        machine.promise_holds()
        machine.work(w0, LEAD, "hand on")
        machine.promise_holds()
        machine.work(w0, MATE, "fail")
        machine.promise_holds()
        machine.work(w0, MATE, "fail")
        machine.promise_holds()
        assert machine.dead_now, "the teammate's message should be a dead letter by now"
    finally:
        machine.teardown()
