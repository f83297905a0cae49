"""One agent's run loop: claim its messages into work groups, run the oldest, apply stops, claim again, and
release the agent when nothing is left (step 3 of :mod:`workers.processor`'s loop; steps 4 and 6 happen
inside it).

:class:`AgentDriver` is one part of :class:`workers.processor.Processor`, built with what it needs: the
runtime (queue, database, events, settings), the worker id, the ``[processor]`` settings in force, whether
the processor is stopping, its counters, rate-limit pauses and storage steps, what runs share of the process
(:class:`RunFacilities`), and what to call when a drive ends. The Processor decides *which* agent is driven
and when; the driver does the driving, one :class:`workers.drive.Drive` per agent.

Why a module of its own rather than :mod:`workers.drive`: :mod:`workers.run` and :mod:`workers.run_outcome`
import the ``Drive`` state from there, and the driver builds runs and outcome writers; one module would be an
import cycle.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio

from shared.aio import call
from shared.chat.address import ChatAddress
from shared.queue.core import LeaseLost, QueuedMessage
from shared.runtime import Runtime
from shared.settings.busy_policy import BusyPolicy
from shared.storage.errors import transient_problem
from workers.busy import WorkGroup, apply_cap, merge_arrivals, resolve_policy
from workers.drive import Drive
from workers.egress import EgressProxy
from workers.observe import record_event
from workers.pauses import RateLimitPauses
from workers.processor_config import ProcessorSettings, ProcessorStats
from workers.providers.claude_warm import WarmPool
from workers.run import Run
from workers.run_outcome import OutcomeWriter
from workers.sandbox import SandboxPlan
from workers.storage_steps import StorageSteps

__all__ = ["AgentDriver", "RunFacilities"]

log = logging.getLogger("agentpost.processor")


@dataclass(frozen=True)
class RunFacilities:
    """What every run shares of the process: the base environment of the agent CLIs, the sandbox plan (a
    call, chosen when first needed), the egress proxy and the pool of kept claude processes."""

    env: Mapping[str, str]
    sandbox: Callable[[], SandboxPlan]
    egress: EgressProxy
    warm: WarmPool


class AgentDriver:
    """Drives the agents the processor hands it, each in its own task: :meth:`drive` is one agent's loop.

    ``config`` gives the ``[processor]`` settings in force and ``stopping`` whether the processor is stopping
    (both read at every step, so edits and :meth:`workers.processor.Processor.stop` take effect mid-drive);
    ``on_end(agent)`` is called when a drive has ended and released what it held."""

    def __init__(
        self,
        rt: Runtime,
        worker: str,
        *,
        config: Callable[[], ProcessorSettings],
        stopping: Callable[[], bool],
        stats: ProcessorStats,
        pauses: RateLimitPauses,
        storage: StorageSteps,
        facilities: RunFacilities,
        on_end: Callable[[str], None],
    ) -> None:
        self.rt = rt
        self.worker = worker
        self._config = config
        self._stopping = stopping
        self.stats = stats
        self.pauses = pauses
        self.storage = storage
        self.facilities = facilities
        self._on_end = on_end
        self.lease_ms = rt.queue.config.lease_ms
        # Fixed at start, like the lease length it is a fraction of.
        self.renew_interval = config().renew_interval_seconds or max(0.05, self.lease_ms / 3000)
        #: The agents driven now and what each holds: every claim of this worker that is not held here is
        #: stranded (see StorageSteps.sweep_stranded).
        self._drives: dict[str, Drive] = {}
        #: Agents whose first claim found nothing (another processor took it, or it was paused in between),
        #: and until when (time.monotonic()) the processor should leave them be.
        self.rest_until: dict[str, float] = {}

    def held(self) -> dict[str, list[str]]:
        """The agents driven now and the ids of the messages each drive holds."""
        return {agent: drive.held_ids() for agent, drive in self._drives.items()}

    def running_ids(self, agent: str) -> list[str]:
        """The ids of the messages in ``agent``'s run going on now (none when it is not running)."""
        drive = self._drives.get(agent)
        return drive.running.ids if drive is not None and drive.running is not None else []

    async def drive(self, agent: str) -> None:
        """Claim and run ``agent``'s messages until none is left, then release the agent."""
        drive = Drive(agent)
        self._drives[agent] = drive
        try:
            async with anyio.create_task_group() as tg:
                renew = functools.partial(self._renew, agent)
                tg.start_soon(drive.keep_leases, renew, self.renew_interval, tg.cancel_scope)
                first = True
                while not self._stopping() and not drive.paused:
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
                        self.rest_until[agent] = time.monotonic() + 1.0
                    first = False
                    await self._apply_stops(drive)
                    if not drive.groups or self._stopping():
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
            self._on_end(agent)

    def _claim(self, agent: str) -> list[QueuedMessage]:
        return self.rt.queue.messages.claim_all_pending_messages(agent, self.worker, lease_ms=self.lease_ms)

    def _outcomes(self, drive: Drive) -> OutcomeWriter:
        """The writer of ``drive``'s outcomes, with the [processor] settings in force now."""
        return OutcomeWriter(
            self.rt,
            drive,
            worker=self.worker,
            config=self._config(),
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
            config=self._config(),
            env=self.facilities.env,
            sandbox=self.facilities.sandbox,
            egress=self.facilities.egress,
            stats=self.stats,
            warm=self.facilities.warm,
        )

    def _renew(self, agent: str, ids: list[str]) -> int:
        return self.rt.queue.leases.renew_leases(self.worker, ids, agent=agent, lease_ms=self.lease_ms)

    async def _take_in(self, drive: Drive, claimed: list[QueuedMessage]) -> None:
        """Merge newly claimed messages into the waiting groups; complete what the cap drops."""
        chats = {m.conversation_key: m.address for m in claimed}
        policies = await call(self._policies, chats)
        merge_arrivals(drive.groups, claimed, policies.__getitem__)
        for batch in apply_cap(drive.groups, self._config().max_waiting):
            await self._outcomes(drive).dropped(batch)

    def _policies(self, chats: dict[tuple[str, str], ChatAddress]) -> dict[tuple[str, str], BusyPolicy]:
        """The busy policy of each chat, by its key (read in a worker thread)."""
        default = self._config().busy_policy
        return {k: resolve_policy(self.rt.db, self.rt.settings, default, chat) for k, chat in chats.items()}

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
