"""The queue processor: queued messages in, one agent run per chat, one reply out.

Loop (``agentpost run processor``):

1. Wake on the database's change signal (:class:`shared.wake.Waker`), on a finished run, or after the
   fallback poll (``queue.poll_interval_seconds``, 5 s), whichever comes first; sleep through backoffs.
2. Return messages of dead workers (expired leases) to ``pending`` every ``recover_interval_seconds``.
3. For each agent with available messages and no run here, under ``max_concurrency``: take the agent's
   lease and claim all its pending messages, group them by chat (oldest first; the first message is the
   primary one, the rest earlier context), and run one CLI invocation per group, one after another. Then
   claim again (what arrived meanwhile becomes the next run) until nothing is left, and release the agent.
   One run at a time per agent (the agent lease holds across processors and hosts); agents in parallel.
4. While an agent runs, a renewal task extends the leases of every message it holds (and the agent
   lease) every ``renew_interval_seconds``. If renewal finds a message gone (the lease lapsed and another
   worker took over), the run is stopped, its CLI killed and nothing of it is sent.
5. Success completes the group with its response, handoffs, chat posts and history in one transaction;
   failure (non-zero exit, timeout, reported error) goes back with backoff, and dead at the limit with one
   notice to the sender (:meth:`shared.queue.Queue.fail_messages`). A rate limit (HTTP 429) does not count
   as an attempt: the messages wait ``rate_limit_pause_seconds``.

Shutdown (SIGTERM or SIGINT), the decision: stop claiming at once; let runs in progress *finish* for up to
``shutdown_grace_seconds`` and complete normally; then cancel what is still running — its CLI process group
is killed and its messages are *released* with :meth:`~shared.queue.Queue.fail_messages` using
``count_attempt=False`` and no delay, so another processor (or this one after a restart) runs them at once
and the interruption costs the message no attempt. Claimed groups that had not started are released the
same way. A ``kill -9`` gives no chance to release: the messages then return when their leases lapse (and
that counts as an attempt); :mod:`workers.launch` makes the CLI die with the processor.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field

from shared.clock import now_ms
from shared.queue import LeaseLost, QueuedMessage, group_by_conversation
from shared.runtime import Runtime, open_runtime
from shared.sessions import AGENT_SCOPE_KEY, get_session, set_session
from shared.settings import AgentSettings
from workers.files import describe_inbound, outbound_files
from workers.providers import ProviderError, RunRequest, RunResult, child_env, provider_for
from workers.teams import plan_reply
from workers.workspace import ensure_workspace, files_dir, team_instructions

log = logging.getLogger("agentpost.processor")


class ProcessorSettings(BaseModel):
    """The ``[processor]`` section of settings.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrency: int = Field(default=4, ge=1, le=256, description="agents running at the same time")
    agents: list[str] = Field(default_factory=list, description="run only these agents (empty: all)")
    renew_interval_seconds: float | None = Field(default=None, gt=0, description="default: lease / 3")
    recover_interval_seconds: float = Field(default=5.0, gt=0)
    shutdown_grace_seconds: float = Field(default=20.0, ge=0)
    rate_limit_pause_seconds: float = Field(default=60.0, ge=0)
    progress_events: bool = True
    orphan_guard: bool = Field(default=True, description="make agent CLIs die with the processor")
    worker_id: str = ""


@dataclass
class ProcessorStats:
    """Counters of one processor's life (handy for tests and the stop log line)."""

    invocations: int = 0
    completed: int = 0
    failed: int = 0
    released: int = 0
    lease_lost: int = 0


def default_worker_id() -> str:
    """``host:pid:random``, unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def build_prompt(group: Sequence[QueuedMessage]) -> str:
    """The text an agent is given for one group: the message itself, or all of them, numbered."""
    notes = [n for n in (describe_inbound(m.message) for m in group) if n]
    if len(group) == 1:
        text = group[0].message
    else:
        lines = [
            f"{len(group)} messages arrived in this chat while you were busy (oldest first); answer them together:"
        ]
        for number, m in enumerate(group, 1):
            who = f" from {m.sender}" if m.sender else ""
            lines.append(f"\n[{number}]{who}:\n{m.message}")
        text = "\n".join(lines)
    return text + ("\n\n" + "\n".join(notes) if notes else "")


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
        self.settings = runtime.settings
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
        self._cooldown: dict[str, float] = {}

    # -- public -----------------------------------------------------------------------------------------
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
        messages in backoff. Raises ``TimeoutError`` after ``timeout`` seconds."""
        with anyio.fail_after(timeout):
            await self.serve(until_idle=True, include_delayed=include_delayed)
        return self.stats

    async def serve(self, *, until_idle: bool = False, include_delayed: bool = False) -> None:
        """The main loop; returns after :meth:`stop` (or when idle, with ``until_idle``)."""
        self._stop_event = anyio.Event()
        self._wakeup = anyio.Event()
        if self._stopping:
            self._stop_event.set()
        await self._event(
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
        await self._event("processor", "processor_stop", {"worker": self.worker, **self.stats.__dict__})

    # -- loop parts -------------------------------------------------------------------------------------
    async def _dispatch(self, tg: anyio.abc.TaskGroup) -> int:
        if time.monotonic() - self._last_recover >= self.config.recover_interval_seconds:
            self._last_recover = time.monotonic()
            outcome = await anyio.to_thread.run_sync(self.rt.queue.recover_stale_messages)
            if outcome.retried or outcome.dead:
                log.warning(
                    "recovered %d expired message(s), %d now dead", len(outcome.retried), len(outcome.dead)
                )
        pending = await anyio.to_thread.run_sync(self.rt.queue.agents_with_pending)
        mine = set(self.agents)
        started = 0
        for agent in pending:
            if agent in self._active or self._cooldown.get(agent, 0.0) > time.monotonic():
                continue
            if agent not in mine and (self.config.agents or agent in self.settings.agents):
                continue  # another processor's agent (or, unlisted, one we do not run)
            if len(self._active) >= self.config.max_concurrency:
                break
            holder = await anyio.to_thread.run_sync(self.rt.queue.agent_holder, agent)
            if holder is not None and holder != self.worker:
                continue  # another processor runs it (and claims what is pending when its run ends)
            self._active.add(agent)
            tg.start_soon(self._drive, agent)
            started += 1
        return started

    async def _has_work(self, include_delayed: bool) -> bool:
        pending = await anyio.to_thread.run_sync(self.rt.queue.agents_with_pending)
        if any(a in self.agents or not self.config.agents for a in pending):
            return True
        if include_delayed:
            return await anyio.to_thread.run_sync(self.rt.queue.next_available_at) is not None
        return False

    async def _sleep_for(self) -> float:
        timeout = min(self.settings.queue.poll_interval_seconds, self.config.recover_interval_seconds)
        at = await anyio.to_thread.run_sync(self.rt.queue.next_available_at)
        now = now_ms()
        # Only a future backoff shortens the sleep: work available now belongs to a running agent (whose
        # drive claims it next) or to another processor's agent, and must not make this loop spin.
        if at is not None and at > now:
            timeout = min(timeout, (at - now) / 1000 + 0.01)
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

    # -- one agent ---------------------------------------------------------------------------------------
    async def _drive(self, agent: str) -> None:
        """Claim and run ``agent``'s messages until none is left, then release the agent."""
        first = True
        try:
            while not self._stopping:
                claimed = await anyio.to_thread.run_sync(self._claim, agent)
                if not claimed:
                    if first:
                        # Taken by another processor or paused between our look and our claim: do not
                        # retry it on every wake-up for a moment.
                        self._cooldown[agent] = time.monotonic() + 1.0
                    break
                first = False
                await self._run_claimed(agent, claimed)
        except Exception:
            log.exception("agent %s: unexpected error; its messages return when their leases lapse", agent)
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await anyio.to_thread.run_sync(self.rt.queue.release_agent, agent, self.worker)
            self._active.discard(agent)
            self._slot_freed()

    def _claim(self, agent: str) -> list[QueuedMessage]:
        return self.rt.queue.claim_all_pending_messages(agent, self.worker, lease_ms=self.lease_ms)

    async def _run_claimed(self, agent: str, claimed: list[QueuedMessage]) -> None:
        groups = group_by_conversation(claimed)
        held: dict[str, list[str]] = {g[0].message_id: [m.message_id for m in g] for g in groups}
        lock = anyio.Lock()  # renewal and completion must not interleave (a completed id is not "lost")
        lost = False
        try:
            async with anyio.create_task_group() as tg:

                async def renew() -> None:
                    nonlocal lost
                    while True:
                        await anyio.sleep(self.renew_interval)
                        async with lock:
                            ids = [i for ids in held.values() for i in ids]
                            try:
                                count = await anyio.to_thread.run_sync(self._renew, agent, ids)
                            except Exception as exc:  # a database hiccup: try again next round
                                log.warning("agent %s: lease renewal failed: %s", agent, exc)
                                continue
                            if count < len(ids):
                                lost = True
                                tg.cancel_scope.cancel()
                                return

                tg.start_soon(renew)
                for group in groups:
                    if self._stopping:
                        break
                    await self._run_group(agent, group, held, lock)
                tg.cancel_scope.cancel()
        except Exception as exc:
            # A bug or a database failure while handling a run: fail what is still held, counting the
            # attempt, so a message that keeps triggering it ends as a dead letter instead of looping.
            log.exception(
                "agent %s: error while running %s", agent, [i for ids in held.values() for i in ids]
            )
            with anyio.CancelScope(shield=True):
                await self._release(agent, held, f"processor error: {exc!r}"[:500], count_attempt=True)
        finally:
            with anyio.CancelScope(shield=True):
                if lost:
                    self.stats.lease_lost += 1
                    log.warning("agent %s: lost the lease of its messages; run stopped, nothing sent", agent)
                    await self._event(
                        "queue", "lease_lost", {"agent": agent, "worker": self.worker, "during": "run"}
                    )
                await self._release(agent, held, "lease lost" if lost else "processor stopping")

    def _renew(self, agent: str, ids: list[str]) -> int:
        return self.rt.queue.renew_leases(self.worker, ids, agent=agent, lease_ms=self.lease_ms)

    async def _release(
        self, agent: str, held: dict[str, list[str]], why: str, *, count_attempt: bool = False
    ) -> None:
        """Give back groups still held (not started, or cancelled mid-run); by default without counting an
        attempt and without delay."""
        for key, ids in list(held.items()):
            try:
                await anyio.to_thread.run_sync(
                    functools.partial(
                        self.rt.queue.fail_messages,
                        ids,
                        self.worker,
                        f"released: {why}",
                        count_attempt=count_attempt,
                        retry_after_ms=None if count_attempt else 0,
                    )
                )
                if count_attempt:
                    self.stats.failed += len(ids)
                else:
                    self.stats.released += len(ids)
            except LeaseLost:
                pass  # another worker has them now; they are not ours to touch
            except Exception as exc:
                log.warning("agent %s: could not release %s: %s", agent, ids, exc)
            held.pop(key, None)

    async def _run_group(
        self, agent: str, group: list[QueuedMessage], held: dict[str, list[str]], lock: anyio.Lock
    ) -> None:
        primary = group[0]
        ids = [m.message_id for m in group]
        config = self.settings.agents.get(agent)
        if config is None:
            await self._finish_failed(
                agent, group, held, lock, RunResult(ok=False, error=f"agent {agent!r} is not configured")
            )
            return
        workspace = await anyio.to_thread.run_sync(ensure_workspace, self.settings, agent)
        session_key = (
            AGENT_SCOPE_KEY if config.session_scope == "agent" else "{}:{}".format(*primary.conversation_key)
        )
        session = await anyio.to_thread.run_sync(get_session, self.rt.db, agent, session_key)
        started_at = now_ms()
        request = RunRequest(
            agent=agent,
            settings=config,
            workspace=workspace,
            prompt=self._prompt(config, agent, group),
            system_prompt=self._system_prompt(config, agent) if config.provider == "claude" else "",
            session_id=session,
            env=child_env(
                self.env, config, [("AGENTPOST_AGENT", agent), ("AGENTPOST_MESSAGE_ID", primary.message_id)]
            ),
            timeout=config.timeout_seconds,
            orphan_guard=self.config.orphan_guard,
        )
        await self._event(
            "queue",
            "chain_step_start",
            {
                "agent": agent,
                "provider": config.provider,
                "message_ids": ids,
                "attempt": primary.retry_count + 1,
                "worker": self.worker,
                "session": "continue" if session else "new",
            },
            primary.message_id,
        )
        self.stats.invocations += 1
        try:
            provider = provider_for(config.provider)
        except ProviderError as exc:
            result = RunResult(ok=False, error=str(exc))
        else:

            async def progress(text: str) -> None:
                if self.config.progress_events:
                    await self._event(
                        "progress",
                        "agent_progress",
                        {"agent": agent, "text": text[:4000], "message_ids": ids},
                        primary.message_id,
                    )

            result = await provider.run(request, progress)
        await self._event(
            "queue",
            "chain_step_done",
            {
                "agent": agent,
                "ok": result.ok,
                "exit_code": result.exit_code,
                "duration_ms": result.duration_ms,
                "timed_out": result.timed_out,
                "pid": result.pid,
                "message_ids": ids,
                **({"error": result.error[:500]} if not result.ok else {}),
            },
            primary.message_id,
        )
        if not result.ok:
            await self._finish_failed(agent, group, held, lock, result)
            return
        if result.session_id:
            await anyio.to_thread.run_sync(
                lambda: set_session(
                    self.rt.db, agent, session_key, result.session_id or "", started_at=started_at
                )
            )
        out = outbound_files(result.text, workspace, files_dir(self.settings))
        for path, reason in out.refused:
            log.warning("agent %s: refused to send %s: %s", agent, path, reason)
            await self._event(
                "queue",
                "send_file_refused",
                {"agent": agent, "path": path, "reason": reason},
                primary.message_id,
            )
        plan = plan_reply(self.settings, agent, group, out.text, out.files)
        for item in plan.ignored:
            await self._event("queue", "chain_handoff_ignored", {"agent": agent, **item}, primary.message_id)
        async with lock:
            try:
                await anyio.to_thread.run_sync(
                    lambda: self.rt.queue.complete_messages(
                        ids,
                        self.worker,
                        plan.response,
                        followups=plan.followups,
                        chat_posts=plan.chat_posts,
                        history=plan.history,
                    )
                )
                self.stats.completed += len(ids)
            except LeaseLost as exc:
                self.stats.lease_lost += 1
                await self._event(
                    "queue",
                    "lease_lost",
                    {"agent": agent, "worker": self.worker, "error": str(exc)},
                    primary.message_id,
                )
            held.pop(primary.message_id, None)

    async def _finish_failed(
        self,
        agent: str,
        group: list[QueuedMessage],
        held: dict[str, list[str]],
        lock: anyio.Lock,
        result: RunResult,
    ) -> None:
        ids = [m.message_id for m in group]
        log.warning("agent %s: run failed for %s: %s", agent, ", ".join(ids), result.error)
        pause = int(self.config.rate_limit_pause_seconds * 1000)
        async with lock:
            try:
                await anyio.to_thread.run_sync(
                    lambda: self.rt.queue.fail_messages(
                        ids,
                        self.worker,
                        result.error or "unknown error",
                        count_attempt=not result.rate_limited,
                        retry_after_ms=pause if result.rate_limited else None,
                    )
                )
                self.stats.failed += len(ids)
            except LeaseLost as exc:
                self.stats.lease_lost += 1
                await self._event(
                    "queue",
                    "lease_lost",
                    {"agent": agent, "worker": self.worker, "error": str(exc)},
                    group[0].message_id,
                )
            held.pop(group[0].message_id, None)

    # -- helpers -----------------------------------------------------------------------------------------
    def _system_prompt(self, config: AgentSettings, agent: str) -> str:
        parts = [config.system_prompt.strip(), team_instructions(self.settings, agent)]
        return "\n\n".join(p for p in parts if p)

    def _prompt(self, config: AgentSettings, agent: str, group: list[QueuedMessage]) -> str:
        prompt = build_prompt(group)
        if config.provider != "claude":
            # Other CLIs have no "append system prompt" flag: the instructions lead the prompt.
            system = self._system_prompt(config, agent)
            if system:
                prompt = f"<instructions>\n{system}\n</instructions>\n\n{prompt}"
        return prompt

    async def _event(
        self, topic: str, type_: str, payload: dict[str, Any], message_id: str | None = None
    ) -> None:
        # Events are observability: a failure to write one must not fail the run it describes.
        try:
            await anyio.to_thread.run_sync(
                lambda: self.rt.events.append(topic, type_, payload, message_id=message_id)
            )
        except Exception as exc:
            log.warning("could not append event %s: %s", type_, exc)


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
    stats = run_processor(home)
    log.info("processor stopped: %s", stats)
