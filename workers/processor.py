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

Who owns what: the :class:`Processor` is the process — it follows the settings, dispatches agents to slots,
waits for work, keeps its presence row and the egress proxy. Each agent it dispatches is driven by the
:class:`workers.agent_driver.AgentDriver` (steps 3, 4 and 6): it claims, groups (:mod:`workers.busy`), keeps
the leases (:meth:`workers.drive.Drive.keep_leases`), applies stops and releases; each group it runs is a
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
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio

from shared.aio import call
from shared.clock import now_ms
from shared.queue import presence
from shared.runtime import Runtime, open_runtime
from shared.settings.model import Settings, SettingsError
from workers import limits as run_limits
from workers.agent_driver import AgentDriver, RunFacilities
from workers.busy import build_prompt
from workers.egress import EgressProxy
from workers.egress_policy import EgressPolicy, policy_for
from workers.observe import record_event
from workers.pauses import RateLimitPauses
from workers.processor_config import ProcessorSettings, ProcessorStats, default_worker_id
from workers.providers.claude_warm import WarmPool
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
        self.stats = ProcessorStats()
        self._active: set[str] = set()
        self._stopping = False
        self._stop_event: anyio.Event | None = None
        self._wakeup: anyio.Event | None = None
        self._last_recover = 0.0
        self._announced = 0.0  # when the presence row was last written (time.monotonic())
        self._announced_warm: dict[str, object] | None = None  # the warm pool as that row says it
        self.pauses = RateLimitPauses()
        self.storage = StorageSteps(
            runtime,
            self.worker,
            config=lambda: self.config,
            stopping=lambda: self._stopping,
            held=lambda: self.driver.held(),
            on_outage_end=self._outage_ended,
        )
        #: The sandbox agent CLIs run in, chosen once per [processor] sandbox value (workers/sandbox.py).
        self._sandbox = SandboxChoice()
        #: Claude processes kept between a chat's runs (session_idle_seconds > 0;
        #: workers/providers/claude_warm.py).
        self.warm = WarmPool(lambda: self.config)
        #: Sandboxed runs' only way out (workers/egress.py); serving while :meth:`serve` runs.
        self.egress = EgressProxy(self._egress_policy, self._egress_refused)
        #: Each agent's run loop: claim, run, apply stops, release (workers/agent_driver.py).
        self.driver = AgentDriver(
            runtime,
            self.worker,
            config=lambda: self.config,
            stopping=lambda: self._stopping,
            stats=self.stats,
            pauses=self.pauses,
            storage=self.storage,
            facilities=RunFacilities(self.env, self.sandbox_plan, self.egress, self.warm),
            on_end=self._drive_ended,
        )

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
                    running = {a: self.driver.running_ids(a) for a in sorted(self._active)}
                    log.info(
                        "waiting up to %.0f s for the runs going on: %s",
                        self.config.shutdown_grace_seconds,
                        "; ".join(f"{a} ({', '.join(ids) or 'starting'})" for a, ids in running.items()),
                    )
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
        ids = self.driver.running_ids(agent)
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
            rest = self.driver.rest_until.get(agent, 0.0)
            if agent in self._active or max(rest, self.pauses.until(agent)) > now:
                continue
            if agent not in mine and (self.config.agents or agent in self.settings.agents):
                continue  # another processor's agent (or, unlisted, one we do not run)
            if len(self._active) >= self.config.max_concurrency:
                break
            holder = await call(self.rt.queue.leases.agent_holder, agent)
            if holder is not None and holder != self.worker:
                continue  # another processor runs it (and claims what is pending when its run ends)
            self._active.add(agent)
            tg.start_soon(self.driver.drive, agent)
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

    def _drive_ended(self, agent: str) -> None:
        """``agent``'s drive has ended: its slot is free, and the loop looks for work at once."""
        self._active.discard(agent)
        if self._wakeup is not None:
            self._wakeup.set()

    def _outage_ended(self) -> None:
        """A write ended a storage outage: look for claims it stranded at the loop's next round."""
        self._last_recover = 0.0
        if self._wakeup is not None:
            self._wakeup.set()


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
