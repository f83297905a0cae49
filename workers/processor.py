"""The queue processor: queued messages in, one agent run per chat, one reply out.

Loop (``agentpost run processor``):

1. Wake on the database's change signal (:class:`shared.events.wake.Waker`), on a finished run, or after the
   fallback poll (``queue.poll_interval_seconds``, 5 s), whichever comes first; sleep through backoffs.
2. Return messages of dead workers (expired leases) to ``pending`` every ``recover_interval_seconds``.
3. For each agent with available messages and no run here, under ``max_concurrency``: take the agent's
   lease and *drive* it: claim its pending messages into work groups, one chat each (by the chat's busy
   policy, :mod:`workers.busy`: ``collect`` merges a chat's waiting messages into one run, ``followup``
   runs each alone, in order; a cap drops the oldest past ``max_waiting`` with a notice), run the oldest
   group, claim again (what arrived meanwhile joins the waiting groups), and so on until nothing is left;
   then release the agent. One run at a time per agent (the agent lease holds across processors and
   hosts); agents in parallel.
4. While an agent is driven, a renewal task extends the leases of every message it holds (and the agent
   lease) every ``renew_interval_seconds``. If renewal finds a message gone (the lease lapsed and another
   worker took over), the run is stopped, its CLI killed and nothing of it is sent.
5. Beside each run a watch (:mod:`workers.liveness`) acts on ``/stop`` requests and interrupting messages,
   posts "still working" notes every ``progress_note_seconds`` and keeps the ``/status`` record. The
   provider kills a run silent for ``idle_timeout_seconds`` or past the agent's ``timeout_seconds``.
6. Success completes the group with its response (metadata ``kind: final`` and the run's ``edit_key``),
   handoffs, chat posts and history in one transaction; a heartbeat answered with the silent token is
   recorded with no response. Failure (non-zero exit, timeout, reported error) goes back with backoff, and
   dead at the limit with one notice to the sender (:meth:`shared.queue.failures.Failures.fail_messages`). A rate
   limit costs no attempt: the agent moves to its fallback model or is paused (:mod:`workers.ratelimit`).

Shutdown (SIGTERM or SIGINT), the decision: stop claiming at once; let runs in progress *finish* for up to
``shutdown_grace_seconds`` and complete normally; then cancel what is still running — its CLI process group
is killed and its messages are *released* with :meth:`~shared.queue.failures.Failures.fail_messages` using
``count_attempt=False`` and no delay, so another processor (or this one after a restart) runs them at once
and the interruption costs the message no attempt. Claimed groups that had not started are released the
same way. A ``kill -9`` gives no chance to release: a restarted processor on the same host sees that the
holder is gone (worker ids are ``host:pid:start``, :mod:`shared.worker_identity`) and takes the claims back at
once; on another host they return when their leases lapse. Only messages whose run had started are charged,
with an *interrupted run* (their own budget); the re-run's prompt says the previous attempt was
interrupted, and the CLI resumes the conversation from before it (a fork), so nothing of the cut-off run
remains. :mod:`workers.launch` makes the CLI and all its descendants die with the processor.

Storage trouble (a full disk, the database server restarting): a claim, a run's start, an outcome or a
release the database refuses is kept and written again until it lands, the messages still held; claims of
this processor that no drive holds (a claim committed while the connection dropped) are taken back within a
recovery round; a chat that waited long because of it is told once why (:mod:`workers.storage_steps`).

Who owns what: the :class:`Processor` is the loop — it claims, groups (:mod:`workers.busy`), keeps the
leases (:meth:`workers.drive.Drive.keep_leases`) and schedules; each group it runs is a
:class:`workers.run.Run` built with what it needs, ending through the drive's
:class:`workers.run_outcome.OutcomeWriter`; :class:`workers.storage_steps.StorageSteps` keeps the writes the
database refused.

Why claim every waiting message of the agent, and not only the group about to run: one transaction per
agent instead of one per chat, and the busy policy needs to see what is waiting to merge it. Holding them
costs nothing on a crash (they come back uncharged), and no other processor could run them anyway while
this one holds the agent.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio

from shared.aio import call
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue import presence
from shared.queue.core import LeaseLost, QueuedMessage
from shared.runtime import Runtime, open_runtime
from shared.settings.busy_policy import BusyPolicy
from shared.settings.model import Settings, SettingsError
from shared.storage.errors import transient_problem
from workers import limits as run_limits
from workers.busy import WorkGroup, apply_cap, build_prompt, merge_arrivals, resolve_policy
from workers.drive import Drive
from workers.egress import EgressProxy
from workers.egress_policy import EgressPolicy, policy_for
from workers.observe import record_event
from workers.pauses import RateLimitPauses
from workers.processor_config import ProcessorSettings, ProcessorStats, default_worker_id
from workers.providers.claude_warm import WarmPool
from workers.run import Run
from workers.run_outcome import OutcomeWriter
from workers.sandbox import SandboxChoice, SandboxError, SandboxPlan
from workers.storage_steps import StorageSteps

__all__ = ["Processor", "ProcessorSettings", "ProcessorStats", "build_prompt", "main", "run_processor"]

log = logging.getLogger("agentpost.processor")


class Processor:
    """One processor: runs agents for the messages in the shared queue.

    ``env`` is the base environment of the agent CLIs (default: this process's); ``config`` overrides the
    ``[processor]`` settings. Drive it with :meth:`serve` (until :meth:`stop`) or :meth:`run_until_idle`.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        config: ProcessorSettings | None = None,
        env: Mapping[str, str] | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.rt = runtime
        # Without an explicit ``config`` the [processor] section follows edits of the settings file.
        self._own_config = config is None
        self._config_generation = runtime.settings_generation
        self.config = config or runtime.settings.section("processor", ProcessorSettings)
        self.worker = worker_id or self.config.worker_id or default_worker_id()
        self.env = dict(os.environ if env is None else env)
        self.lease_ms = runtime.queue.config.lease_ms
        self.renew_interval = self.config.renew_interval_seconds or max(0.05, self.lease_ms / 3000)
        self.stats = ProcessorStats()
        self._active: set[str] = set()
        self._stopping = False
        self._stop_event: anyio.Event | None = None
        self._wakeup: anyio.Event | None = None
        self._last_recover = 0.0
        self._announced = 0.0  # when the presence row was last written (time.monotonic())
        self._announced_warm: dict[str, object] | None = None  # the warm pool as that row says it
        self._cooldown: dict[str, float] = {}
        self.pauses = RateLimitPauses()
        #: The agents driven now and what each holds: every claim of this worker that is not held here is
        #: stranded (see StorageSteps.sweep_stranded).
        self._drives: dict[str, Drive] = {}
        self.storage = StorageSteps(
            runtime,
            self.worker,
            config=lambda: self.config,
            stopping=lambda: self._stopping,
            held=lambda: {agent: drive.held_ids() for agent, drive in self._drives.items()},
            on_outage_end=self._outage_ended,
        )
        #: The sandbox agent CLIs run in, chosen once per [processor] sandbox value (workers/sandbox.py).
        self._sandbox = SandboxChoice()
        #: Claude processes kept between a chat's runs (session_idle_seconds > 0;
        #: workers/providers/claude_warm.py).
        self.warm = WarmPool(lambda: self.config)
        #: Sandboxed runs' only way out (workers/egress.py); serving while :meth:`serve` runs.
        self.egress = EgressProxy(self._egress_policy, self._egress_refused)

    # -- public -----------------------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        """The settings in force now: edits of settings.toml take effect without a restart."""
        return self.rt.settings

    @settings.setter
    def settings(self, value: Settings) -> None:
        self.rt.settings = value

    def _follow_config(self) -> None:
        """Take up an edited [processor] section (a broken one keeps the old; the runtime logs why)."""
        generation = self.rt.settings_generation
        if not self._own_config or generation == self._config_generation:
            return
        self._config_generation = generation
        try:
            self.config = self.rt.settings.section("processor", ProcessorSettings)
        except SettingsError as exc:
            log.warning("[processor] settings not taken up, the ones in force stay: %s", exc)

    def sandbox_plan(self) -> SandboxPlan:
        """How agent CLIs are confined: chosen the first time it is needed (and again only when
        ``[processor] sandbox`` changes), and logged with the reason when agents run unconfined. Raises
        :class:`SandboxError` when the settings ask for namespaces that cannot be had here."""
        return self._sandbox.plan(self.config.sandbox)

    @property
    def agents(self) -> list[str]:
        """The agents this processor runs."""
        configured = sorted(self.settings.agents)
        return [a for a in configured if a in self.config.agents] if self.config.agents else configured

    def stop(self) -> None:
        """Ask the loop to stop (see the module docstring for what happens to running work)."""
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()
        if self._wakeup is not None:
            self._wakeup.set()

    async def run_until_idle(self, *, include_delayed: bool = False, timeout: float = 60.0) -> ProcessorStats:
        """Process until nothing is available and nothing runs. With ``include_delayed`` also wait for
        messages in backoff (and agents paused by a rate limit). Raises ``TimeoutError`` after ``timeout``."""
        with anyio.fail_after(timeout):
            await self.serve(until_idle=True, include_delayed=include_delayed)
        return self.stats

    async def serve(self, *, until_idle: bool = False, include_delayed: bool = False) -> None:
        """The main loop; returns after :meth:`stop` (or when idle, with ``until_idle``)."""
        self._stop_event = anyio.Event()
        self._wakeup = anyio.Event()
        if self._stopping:
            self._stop_event.set()
        # Run cgroups a killed processor on this host left behind (workers/limits.py) go before any run starts.
        await anyio.to_thread.run_sync(run_limits.sweep)
        await record_event(
            self.rt.events,
            "processor",
            "processor_start",
            {
                "worker": self.worker,
                "pid": os.getpid(),
                "agents": self.agents,
                "max_concurrency": self.config.max_concurrency,
                "until_idle": until_idle,
            },
        )
        # The row `send --wait` finds this processor by, for as long as it runs (the start event expires).
        await self._announce()
        async with self.egress:
            await self._loop(until_idle, include_delayed)
        with contextlib.suppress(Exception):  # left behind, it is known gone by this pid
            await call(presence.withdraw, self.rt.db, self.worker)
        stopped = {"worker": self.worker, **self.stats.__dict__}
        await record_event(self.rt.events, "processor", "processor_stop", stopped)

    async def _loop(self, until_idle: bool, include_delayed: bool) -> None:
        try:
            async with anyio.create_task_group() as tg:
                while not self._stopping:
                    generation = self.rt.waker.generation
                    try:
                        started = await self._dispatch(tg)
                        if self._stopping:
                            break
                        if (
                            until_idle
                            and not self._active
                            and not started
                            and not await self._has_work(include_delayed)
                        ):
                            break
                        timeout = await self._sleep_for()
                    except Exception as exc:  # the database is unreachable for a moment: keep running, retry
                        log.warning("processor loop: %s; retrying in 1 s", exc)
                        timeout = 1.0
                    await self._wait(generation, timeout)
                if self._active:
                    with anyio.move_on_after(self.config.shutdown_grace_seconds):
                        while self._active:
                            await self._wait_slot()
                    # Past the grace period: cancelling kills the CLIs; the drives release their messages.
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.warm.close_all()  # the idle warm processes end with the loop
                await anyio.to_thread.run_sync(run_limits.leave)

    def _egress_policy(self, agent: str) -> EgressPolicy:
        """What ``agent``'s runs may reach, from the settings in force now (an agent removed: nothing)."""
        config = self.settings.agents.get(agent)
        if config is None:
            return EgressPolicy(agent)
        return policy_for(agent, config, self.env)

    async def _egress_refused(self, agent: str, run_id: str, target: str, why: str) -> None:
        """A connection the egress proxy refused: an event naming the agent's messages, for trace."""
        drive = self._drives.get(agent)
        ids = drive.running.ids if drive is not None and drive.running is not None else []
        payload = {"agent": agent, "run_id": run_id, "host": target, "reason": why, "message_ids": ids}
        await record_event(self.rt.events, "queue", "network_refused", payload, ids[0] if ids else None)

    async def _announce(self) -> None:
        """Write (or refresh) this processor's presence row; a database that refuses it now is tried again
        at the next refresh, and never holds up the loop."""
        self._announced = time.monotonic()
        warm = self.warm.snapshot()
        self._announced_warm = warm
        try:
            await call(presence.announce, self.rt.db, self.worker, os.getpid(), self.agents, warm)
        except Exception as exc:
            log.info("could not record that this processor runs: %s", exc)

    # -- loop parts -------------------------------------------------------------------------------------
    async def _dispatch(self, tg: anyio.abc.TaskGroup) -> int:
        self._follow_config()
        await self.warm.reap()
        # The row is written again when the warm pool changed too: /status reads what is kept from it.
        if (
            time.monotonic() - self._announced >= presence.REFRESH_MS / 1000
            or self.warm.snapshot() != self._announced_warm
        ):
            await self._announce()
        if time.monotonic() - self._last_recover >= self.config.recover_interval_seconds:
            self._last_recover = time.monotonic()
            outcome = await call(self.rt.queue.failures.recover_stale_messages)
            if outcome.retried or outcome.dead:
                log.warning(
                    "recovered %d expired message(s), %d now dead", len(outcome.retried), len(outcome.dead)
                )
            await self.storage.sweep_stranded()
        pending = await call(self.rt.queue.messages.agents_with_pending)
        if any(agent not in self.rt.settings.agents for agent in pending):
            # Work for an agent these settings do not know: it may have been added a moment ago (the
            # sender's process read the new file first). Look at the file now rather than within a second.
            await call(self.rt.refresh_settings)
            self._follow_config()
        mine = set(self.agents)
        started = 0
        now = time.monotonic()
        for agent in pending:
            if agent in self._active or max(self._cooldown.get(agent, 0.0), self.pauses.until(agent)) > now:
                continue
            if agent not in mine and (self.config.agents or agent in self.settings.agents):
                continue  # another processor's agent (or, unlisted, one we do not run)
            if len(self._active) >= self.config.max_concurrency:
                break
            holder = await call(self.rt.queue.leases.agent_holder, agent)
            if holder is not None and holder != self.worker:
                continue  # another processor runs it (and claims what is pending when its run ends)
            self._active.add(agent)
            tg.start_soon(self._drive, agent)
            started += 1
        return started

    async def _has_work(self, include_delayed: bool) -> bool:
        pending = await call(self.rt.queue.messages.agents_with_pending)
        now = time.monotonic()
        if any(
            (a in self.agents or not self.config.agents) and (include_delayed or self.pauses.until(a) <= now)
            for a in pending
        ):
            return True
        if include_delayed:
            return await call(self.rt.queue.messages.next_available_at) is not None
        return False

    async def _sleep_for(self) -> float:
        timeout = min(self.settings.queue.poll_interval_seconds, self.config.recover_interval_seconds)
        at = await call(self.rt.queue.messages.next_available_at)
        now = now_ms()
        # Only a future backoff shortens the sleep: work available now belongs to a running agent (whose
        # drive claims it next) or to another processor's agent, and must not make this loop spin.
        if at is not None and at > now:
            timeout = min(timeout, (at - now) / 1000 + 0.01)
        expiry = self.warm.next_expiry()
        if expiry is not None:
            timeout = min(timeout, expiry + 0.01)  # an idle warm process exits on time
        return max(0.01, timeout)

    async def _wait(self, generation: int, timeout: float) -> None:
        """Until the database changes, a run finishes, :meth:`stop` is called, or ``timeout`` passes."""
        assert self._wakeup is not None
        async with anyio.create_task_group() as tg:

            async def on_change() -> None:
                await self.rt.waker.wait_async(generation, timeout)
                tg.cancel_scope.cancel()

            async def on_slot() -> None:
                assert self._wakeup is not None
                await self._wakeup.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(on_change)
            tg.start_soon(on_slot)
        if self._wakeup.is_set() and not self._stopping:
            self._wakeup = anyio.Event()

    async def _wait_slot(self) -> None:
        assert self._wakeup is not None
        await self._wakeup.wait()
        self._wakeup = anyio.Event()

    def _slot_freed(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def _outage_ended(self) -> None:
        """A write ended a storage outage: look for claims it stranded at the loop's next round."""
        self._last_recover = 0.0
        self._slot_freed()

    # -- one agent ---------------------------------------------------------------------------------------
    async def _drive(self, agent: str) -> None:
        """Claim and run ``agent``'s messages until none is left, then release the agent."""
        drive = Drive(agent)
        self._drives[agent] = drive
        try:
            async with anyio.create_task_group() as tg:
                renew = functools.partial(self._renew, agent)
                tg.start_soon(drive.keep_leases, renew, self.renew_interval, tg.cancel_scope)
                first = True
                while not self._stopping and not drive.paused:
                    with self.storage.claiming():
                        claimed = await self.storage.persist(
                            f"agent {agent}: claim", functools.partial(self._claim, agent)
                        )
                        if claimed:
                            drive.released = False  # the claim took the agent's lease again
                            await self._take_in(drive, claimed)
                    if not claimed and first:
                        # Taken by another processor or paused between our look and our claim: do not
                        # retry it on every wake-up for a moment.
                        self._cooldown[agent] = time.monotonic() + 1.0
                    first = False
                    await self._apply_stops(drive)
                    if not drive.groups or self._stopping:
                        break
                    drive.running = drive.groups.pop(0)  # no await in between: always held somewhere
                    await self._run(drive, drive.running).go()
                tg.cancel_scope.cancel()
        except Exception as exc:
            problem = transient_problem(exc, self.rt.db.url)
            with anyio.CancelScope(shield=True):
                if problem is not None:
                    # The database, not the message: give back what is held, uncounted, to be claimed
                    # again in order once the database answers.
                    log.warning(
                        "agent %s: %s; releasing %s",
                        agent,
                        problem.describe(),
                        drive.held_ids(),
                        exc_info=True,
                    )
                    await self._release(drive, f"storage trouble: {problem.kind}")
                else:
                    # A bug while handling a run: fail what is still held, counting the attempt, so a
                    # message that keeps triggering it ends as a dead letter instead of looping.
                    log.exception("agent %s: error while running %s", agent, drive.held_ids())
                    await self._release(drive, f"processor error: {exc!r}"[:500], count_attempt=True)
        finally:
            with anyio.CancelScope(shield=True):
                if drive.lost:
                    self.stats.lease_lost += 1
                    log.warning("agent %s: lost the lease of its messages; run stopped, nothing sent", agent)
                    lost = {"agent": agent, "worker": self.worker, "during": "run"}
                    await record_event(self.rt.events, "queue", "lease_lost", lost)
                await self._release(drive, "lease lost" if drive.lost else "processor stopping")
                if not drive.released:
                    with contextlib.suppress(Exception):
                        await call(self.rt.queue.leases.release_agent, agent, self.worker)
            self._drives.pop(agent, None)
            self._active.discard(agent)
            self._slot_freed()

    def _claim(self, agent: str) -> list[QueuedMessage]:
        return self.rt.queue.messages.claim_all_pending_messages(agent, self.worker, lease_ms=self.lease_ms)

    def _outcomes(self, drive: Drive) -> OutcomeWriter:
        """The writer of ``drive``'s outcomes, with the [processor] settings in force now."""
        return OutcomeWriter(
            self.rt,
            drive,
            worker=self.worker,
            config=self.config,
            stats=self.stats,
            pauses=self.pauses,
            storage=self.storage,
        )

    def _run(self, drive: Drive, group: WorkGroup) -> Run:
        """The run of ``group``, the one ``drive`` holds as running."""
        return Run(
            self.rt,
            drive,
            group,
            outcomes=self._outcomes(drive),
            storage=self.storage,
            worker=self.worker,
            config=self.config,
            env=self.env,
            sandbox=self.sandbox_plan,
            egress=self.egress,
            stats=self.stats,
            warm=self.warm,
        )

    def _renew(self, agent: str, ids: list[str]) -> int:
        return self.rt.queue.leases.renew_leases(self.worker, ids, agent=agent, lease_ms=self.lease_ms)

    async def _take_in(self, drive: Drive, claimed: list[QueuedMessage]) -> None:
        """Merge newly claimed messages into the waiting groups; complete what the cap drops."""
        chats = {m.conversation_key: m.address for m in claimed}
        policies = await call(self._policies, chats)
        merge_arrivals(drive.groups, claimed, policies.__getitem__)
        for batch in apply_cap(drive.groups, self.config.max_waiting):
            await self._outcomes(drive).dropped(batch)

    def _policies(self, chats: dict[tuple[str, str], ChatAddress]) -> dict[tuple[str, str], BusyPolicy]:
        """The busy policy of each chat, by its key (read in a worker thread)."""
        default = self.config.busy_policy
        return {k: resolve_policy(self.rt.db, self.settings, default, chat) for k, chat in chats.items()}

    async def _apply_stops(self, drive: Drive) -> None:
        """Between runs: take a stop request and complete the waiting groups it names as stopped."""
        try:
            taken = await call(self.rt.queue.control.take_stop_request, drive.agent, self.worker)
        except Exception as exc:
            log.warning("agent %s: could not read stop requests: %s", drive.agent, exc)
            taken = ""
        if taken:
            drive.stops.add(taken)
        if not drive.stops:
            return
        stops, drive.stops = drive.stops, set()
        outcomes = self._outcomes(drive)
        for group in list(drive.groups):
            if "*" in stops or group.chat in stops:
                await outcomes.stopped(group, None)

    async def _release(self, drive: Drive, why: str, *, count_attempt: bool = False) -> None:
        """Give back groups still held (not started, or cancelled mid-run); by default without counting an
        attempt and without delay."""
        for group in drive.held():
            try:
                await self.storage.persist(
                    f"agent {drive.agent}: release of {', '.join(group.ids)}",
                    functools.partial(
                        self.rt.queue.failures.fail_messages,
                        group.ids,
                        self.worker,
                        f"released: {why}",
                        count_attempt=count_attempt,
                        retry_after_ms=None if count_attempt else 0,
                    ),
                )
                if count_attempt:
                    self.stats.failed += len(group.ids)
                else:
                    self.stats.released += len(group.ids)
            except LeaseLost:
                pass  # another worker has them now; they are not ours to touch
            except Exception as exc:
                log.warning("agent %s: could not release %s: %s", drive.agent, group.ids, exc)
            drive.forget(group)


# -- process entry point ----------------------------------------------------------------------------------
async def _serve_with_signals(processor: Processor) -> None:
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info(
                        "received %s: finishing current runs (grace %.0f s)",
                        signal.Signals(signum).name,
                        processor.config.shutdown_grace_seconds,
                    )
                    processor.stop()

        tg.start_soon(watch)
        await processor.serve()
        tg.cancel_scope.cancel()


def run_processor(
    home: Path | None = None,
    *,
    until_idle: bool = False,
    env: Mapping[str, str] | None = None,
    configure: Callable[[Processor], None] | None = None,
) -> ProcessorStats:
    """Open the runtime and run one processor in this thread (the foreground process, or a test)."""
    runtime = open_runtime(home)
    try:
        processor = Processor(runtime, env=env)
        if configure is not None:
            configure(processor)
        processor.sandbox_plan()  # refuse to start when the sandbox the settings ask for cannot be had
        if until_idle:
            anyio.run(processor.run_until_idle)
        else:
            anyio.run(_serve_with_signals, processor)
        return processor.stats
    finally:
        runtime.close()


def main(home: Path | None = None) -> None:
    """``agentpost run processor``: run until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=os.environ.get("AGENTPOST_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        stats = run_processor(home)
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    log.info("processor stopped: %s", stats)
