"""One run of an agent, from prompt to outcome: the part of :class:`workers.processor.Processor` that
starts the CLI for a work group and writes what became of it.

Outcomes, each written in one transaction while the group's leases are held (:meth:`RunSteps._settle`):

- success: the reply (metadata ``kind: final`` and the run's ``edit_key``), handoffs, chat posts and
  history; a heartbeat whose reply is the agent's silent token is recorded with no response;
- failure: back to ``pending`` with a backoff, counting an attempt (dead with one notice at the limit);
- rate limit: the fallback model or a pause, no attempt counted (:mod:`workers.ratelimit`);
- ``/stop``: completed with one short "stopped" reply (kind ``stopped``);
- interrupted by a newer message: not completed, not failed; back in front of the waiting groups;
- dropped by the ``max_waiting`` cap: completed with one notice listing them (kind ``dropped``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec

import anyio

from shared.aio import call
from shared.chat.address import ChatAddress
from shared.chat.agents import record_answer
from shared.chat.sessions import AGENT_SCOPE_KEY, get_session, set_session_in
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.file_access import chat_upload_dir, send_roots
from shared.ids import new_id
from shared.queue.core import CompleteOutcome, LeaseLost, QueuedMessage, ResponseDraft, TxWork, retry_edit_key
from shared.reads.conversation_status import clear_run, clear_run_in, record_run_in
from shared.runtime import Runtime
from shared.settings.model import AgentSettings, Settings
from shared.storage.db import Tx
from shared.storage.dialect import sqlite_path
from workers.agent_env import child_env
from workers.budgets import budget_gate, usage_work
from workers.busy import WorkGroup, build_prompt, dropped_notice, resolve_policy
from workers.drive import Drive, step_done
from workers.errors import diagnose
from workers.files import OutboundFiles, outbound_files
from workers.liveness import RunInfo, RunWatch, note_target
from workers.pauses import RateLimitPauses, WaitedNote
from workers.processor_config import ProcessorSettings, ProcessorStats
from workers.providers import (
    AgentProvider,
    ProviderError,
    RunRequest,
    RunResult,
    provider_for,
)
from workers.ratelimit import (
    backoff_ms,
    fallback_until,
    notify_waiting_chats,
    parse_reset,
    paused_text,
    use_fallback_until,
)
from workers.sandbox import Sandboxed, SandboxPlan, SandboxView
from workers.storage_steps import StorageSteps
from workers.teams import plan_reply
from workers.workspace import WorkspaceElsewhere, host_of, prepare_workspace, team_instructions

log = logging.getLogger("agentpost.processor")

P = ParamSpec("P")

STOPPED_TEXT = "Stopped. I did not finish this; send it again when you want me to continue."


class RunSteps(StorageSteps):
    """The run steps of the processor (a mixin: :class:`workers.processor.Processor` provides the state;
    writes go through :meth:`~workers.storage_steps.StorageSteps._persist`)."""

    rt: Runtime
    settings: Settings
    config: ProcessorSettings
    worker: str
    env: dict[str, str]
    stats: ProcessorStats
    pauses: RateLimitPauses

    if TYPE_CHECKING:

        def sandbox_plan(self) -> SandboxPlan: ...

    async def _drop(self, drive: Drive, batch: list[QueuedMessage]) -> None:
        ids = [m.message_id for m in batch]
        target = note_target(batch[0])
        draft = None
        if target is not None:
            draft = ResponseDraft.to(
                target,
                dropped_notice(batch, self.config.max_waiting),
                metadata={"kind": "dropped", "dropped": ids, "agent": drive.agent},
            )
        group = WorkGroup(batch, "collect")
        if await self._settle(drive, group, self.rt.queue.complete_messages, ids, self.worker, draft):
            self.stats.dropped += len(ids)
            await self._event(
                "queue",
                "messages_dropped",
                {"agent": drive.agent, "message_ids": ids, "max": self.config.max_waiting},
                ids[0],
            )

    async def _settle(
        self,
        drive: Drive,
        group: WorkGroup,
        write: Callable[P, object],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> bool:
        """Write a group's outcome, ``write(*args, **kwargs)``, under the renewal lock, and stop holding the
        group; False if the lease was lost. A write the database refuses for a while (a full disk, a server
        restarting) is made again until it lands, still held: the reply of a finished run is not thrown
        away, and its messages are not left behind in ``processing``. Should the leases lapse meanwhile
        and another worker take the messages over, the write is fenced off (``LeaseLost``), never doubled."""
        async with drive.lock:
            try:
                await self._persist(
                    f"agent {drive.agent}: outcome of {', '.join(group.ids)}",
                    functools.partial(write, *args, **kwargs),
                )
                return True
            except LeaseLost as exc:
                self.stats.lease_lost += 1
                await self._event(
                    "queue",
                    "lease_lost",
                    {"agent": drive.agent, "worker": self.worker, "error": str(exc)},
                    group.messages[0].message_id,
                )
                return False
            finally:
                drive.forget(group)

    async def _run_group(self, drive: Drive, group: WorkGroup) -> None:
        agent, primary = drive.agent, group.messages[0]
        config = self.settings.agents.get(agent)
        if config is None:
            await self._finish_failed(
                drive,
                group,
                RunResult(ok=False, error=f"agent {agent!r} is not configured", cannot_start=True),
            )
            return
        over = await call(budget_gate(self.settings).over, self.rt.db, agent, primary)
        if over is not None:
            await self._settle(
                drive,
                group,
                self.rt.queue.fail_messages,
                group.ids,
                self.worker,
                over.error(),
                permanent=True,
                explanation=over.explanation(),
                advice=over.advice(now_ms()),
            )
            self.stats.failed += len(group.ids)
            return
        group.policy = await call(
            resolve_policy, self.rt.db, self.settings, self.config.busy_policy, group.key
        )
        try:
            workspace = await call(prepare_workspace, self.rt.db, self.settings, agent, host_of(self.worker))
        except WorkspaceElsewhere as elsewhere:
            await self._refuse_elsewhere(drive, group, elsewhere)
            return
        session_key = AGENT_SCOPE_KEY if config.session_scope == "agent" else group.chat
        session = await call(get_session, self.rt.db, agent, session_key)
        run_config, on_fallback = await self._model_for(agent, config)
        run = RunInfo(agent, new_id("run"), group)
        if any(m.retry_count for m in group.messages):
            run.edit_key = retry_edit_key(primary.message_id)
        request = self._request(run, config, run_config, workspace, session)
        fallback_model = run_config.model if on_fallback else None
        started = self._run_start(run, config.provider, session is not None, fallback_model)
        try:
            # From here a crash of this processor costs these messages an interrupted run; before, nothing.
            await self._persist(
                f"agent {agent}: start of the run for {', '.join(group.ids)}",
                functools.partial(self.rt.queue.mark_run_started, group.ids, self.worker, also=started),
            )
        except LeaseLost:
            drive.lost = True
            drive.forget(group)
            return
        self.stats.invocations += 1
        try:
            result = await self._invoke(drive, run, request, config.provider)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._quietly(clear_run, self.rt.db, agent, run.run_id)
            raise
        await self._conclude(drive, run, result, workspace, session_key, on_fallback)

    async def _refuse_elsewhere(self, drive: Drive, group: WorkGroup, elsewhere: WorkspaceElsewhere) -> None:
        """Not in an empty folder: the group ends with one plain notice, the operator's line in its error."""
        log.warning("agent %s: %s", drive.agent, elsewhere.error())
        if await self._settle(
            drive,
            group,
            self.rt.queue.fail_messages,
            group.ids,
            self.worker,
            elsewhere.error(),
            permanent=True,
            explanation=elsewhere.explanation(),
            advice=elsewhere.advice(),
        ):
            self.stats.failed += len(group.ids)

    def _run_start(self, run: RunInfo, provider: str, resumed: bool, fallback_model: str | None) -> TxWork:
        """What commits with the run's start: its ``chain_step_start`` event and its status record."""
        group, primary = run.group, run.group.messages[0]
        payload: dict[str, Any] = {
            "agent": run.agent,
            "provider": provider,
            "message_ids": group.ids,
            "attempt": primary.retry_count + 1,
            "worker": self.worker,
            "session": "continue" if resumed else "new",
            "run_id": run.run_id,
            "policy": group.policy,
            **({"carried": group.carried} if group.carried else {}),
            **({"model": fallback_model, "fallback": True} if fallback_model is not None else {}),
        }
        start = PendingEvent("chain_step_start", payload, primary.message_id, topic="queue")

        def started(tx: Tx) -> None:
            append_events(tx, [start])
            record_run_in(
                tx,
                run.agent,
                run_id=run.run_id,
                worker=self.worker,
                channel=group.key[0],
                conversation=group.key[1],
                message_ids=group.ids,
                started_at=run.started_ms,
            )

        return started

    async def _conclude(
        self,
        drive: Drive,
        run: RunInfo,
        result: RunResult,
        workspace: Path,
        session_key: str,
        on_fallback: bool,
    ) -> None:
        """Write what the run came to. A success's end event, last progress events and the status record's
        removal commit with its completion; any other end writes them first, then its own outcome."""
        agent, group = run.agent, run.group
        done = PendingEvent(
            "chain_step_done", step_done(run, result), group.messages[0].message_id, topic="queue"
        )

        # What the run cost commits with its outcome, whichever it is: never counted twice, never lost.
        spent = usage_work(agent, run.run_id, group.messages[0], result)

        def ended(tx: Tx) -> None:
            append_events(tx, [*run.pending_events, done])  # taken once the write has succeeded
            clear_run_in(tx, agent, run.run_id)
            if spent is not None:
                spent(tx)

        if not run.reason and result.ok:
            self.pauses.clear_strikes(agent)
            try:
                finished = await self._finish_ok(drive, group, run, result, workspace, session_key, ended)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._quietly(clear_run, self.rt.db, agent, run.run_id)
                raise
            if finished:
                run.take_events()
                return
        await self._quietly(clear_run, self.rt.db, agent, run.run_id)
        await self._events([*run.take_events(), done])
        if run.reason == "stop":
            await self._finish_stopped(drive, group, run.edit_key)
        elif run.reason == "interrupt":
            await self._requeue_interrupted(drive, group)
        elif not result.ok:
            await self._finish_failed(drive, group, result, on_fallback, also=spent)

    def _request(
        self,
        run: RunInfo,
        config: AgentSettings,
        run_config: AgentSettings,
        workspace: Path,
        session: str | None,
    ) -> RunRequest:
        """What the provider needs for ``run``: prompt, environment, limits (``run_config``: the model in
        force, the fallback one during a rate limit)."""
        agent, group = run.agent, run.group
        primary = group.messages[0]
        uploads = self._upload_dir(primary)
        extra_env = [("AGENTPOST_AGENT", agent), ("AGENTPOST_MESSAGE_ID", primary.message_id)]
        if uploads is not None:
            extra_env.append(("AGENTPOST_UPLOAD_DIR", str(uploads)))
        return RunRequest(
            agent=agent,
            settings=run_config,
            workspace=workspace,
            prompt=self._prompt(config, agent, group),
            system_prompt=self._system_prompt(config, agent) if config.provider == "claude" else "",
            session_id=session,
            env=child_env(self.env, config, extra_env),
            timeout=config.timeout_seconds,
            idle_timeout=self.config.idle_timeout_seconds,
            orphan_guard=self.config.orphan_guard,
            on_spawn=run.spawned,
            on_notice=run.tell,
            read_dirs=(uploads,) if uploads is not None else (),
            sandbox=self._sandboxed(agent, workspace, uploads),
        )

    def _sandboxed(self, agent: str, workspace: Path, uploads: Path | None) -> Sandboxed | None:
        """The sandbox of one run (None when this processor runs agents unconfined): its workspace, its own
        CLI home under ``sandbox/<agent>``, the chat's uploads; agentpost's home, the SQLite database's
        folder and the service user's home hidden."""
        plan = self.sandbox_plan()
        if plan.kind == "none":
            return None
        home = self.settings.home
        service_home = Path(self.env.get("HOME") or Path.home())
        hidden = [home, service_home]
        url = self.settings.database_url
        if url.startswith("sqlite:///"):
            hidden.append(Path(sqlite_path(url)).parent)
        view = SandboxView(
            workspace=workspace,
            cli_home=home / "sandbox" / agent,
            readable=(uploads,) if uploads is not None else (),
            hidden=tuple(p for p in hidden if p.is_absolute() and len(p.parts) > 1),
        )
        return Sandboxed(plan, view, login_home=service_home)

    async def _requeue_interrupted(self, drive: Drive, group: WorkGroup) -> None:
        """Not completed, not failed: the group waits in front, and the next claim merges the messages that
        interrupted it; the next run is told what it had started on. No attempt is counted."""
        self.stats.interrupted += 1
        group.carried = len(group.messages)
        drive.running = None
        drive.groups.insert(0, group)
        await self._event(
            "queue",
            "run_interrupted",
            {"agent": drive.agent, "message_ids": group.ids},
            group.messages[0].message_id,
        )

    def _upload_dir(self, primary: QueuedMessage) -> Path | None:
        """The upload folder of the chat this run answers (a teammate's run: the chat its chain started
        from), when it exists: the run may read it, so the files the user sent reach the agent."""
        target = note_target(primary) or primary.address
        folder = chat_upload_dir(self.settings, target.channel, target.conversation)
        return folder if folder.is_dir() else None

    async def _invoke(self, drive: Drive, run: RunInfo, request: RunRequest, kind: str) -> RunResult:
        """Run the CLI with a watch beside it; a stop or interrupt cancels the run (``run.reason``)."""
        try:
            provider: AgentProvider = provider_for(kind)
        except ProviderError as exc:
            return RunResult(ok=False, error=str(exc), cannot_start=True)
        ids = run.group.ids

        async def progress(text: str) -> None:
            run.step(text)
            if not self.config.progress_events:
                return
            payload = {"agent": run.agent, "text": text[:4000], "message_ids": ids, "run_id": run.run_id}
            if run.add_progress_event(PendingEvent("agent_progress", payload, ids[0], topic="progress")):
                await self._events(run.take_events())

        watch = RunWatch(
            self.rt,
            self.worker,
            run,
            control_interval=self.config.control_interval_seconds,
            note_seconds=self.config.progress_note_seconds,
            on_foreign_stop=drive.stops.add,
            default_policy=self.config.busy_policy,
        )
        result = RunResult(ok=False, error="stopped before the CLI finished")
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch.run, scope)
                result = await provider.run(request, progress)
                tg.cancel_scope.cancel()
        return result

    async def _finish_ok(
        self,
        drive: Drive,
        group: WorkGroup,
        run: RunInfo,
        result: RunResult,
        workspace: Path,
        session_key: str,
        ended: TxWork,
    ) -> bool:
        """Complete a successful run with its reply; ``ended`` (the run's end event and record) and the
        conversation's new session are written with it. True when that write happened; False (lease lost)
        leaves ``ended`` to the caller."""
        agent, primary = drive.agent, group.messages[0]
        user_chat = note_target(primary)  # None for agentpost's own channels
        target = user_chat or primary.address
        out = await self._outbound(agent, primary, target, result.text, workspace)
        chat_agents = await self._chat_agents(agent, user_chat)
        plan = plan_reply(
            self.settings,
            agent,
            group.messages,
            out.text,
            out.files,
            {"kind": "final", "edit_key": run.edit_key},
            chat_agents=chat_agents,
        )
        for item in plan.ignored:
            await self._event("queue", "chain_handoff_ignored", {"agent": agent, **item}, primary.message_id)
        token = self.config.silent_tokens.get(agent, self.config.silent_token)
        silent = (
            bool(token) and primary.channel == "heartbeat" and out.text.strip() == token and not out.files
        )
        if silent:
            plan.response = None  # recorded in the history, sent to no one
        session_id = result.session_id
        waited: list[WaitedNote] = []

        def written_with(tx: Tx) -> None:
            ended(tx)
            # Asked again on every try: a reply held back by a full disk may have waited long enough by now.
            waited[:] = [n for n in [self._waited_note(primary)] if n is not None]
            for note in waited:
                note.write(tx)
            if session_id:
                set_session_in(tx, agent, session_key, session_id, started_at=run.started_ms)

        outcome: list[CompleteOutcome] = []

        def complete() -> None:
            outcome.append(
                self.rt.queue.complete_messages(
                    group.ids,
                    self.worker,
                    plan.response,
                    followups=plan.followups,
                    chat_posts=plan.chat_posts,
                    history=plan.history,
                    release_when_idle=not drive.groups,
                    also=written_with,
                )
            )

        if not await self._settle(drive, group, complete):
            return False
        for note in waited:
            note.told()
        drive.released = outcome[0].released
        self.stats.completed += len(group.ids)
        if silent:
            self.stats.silent += 1
            await self._event(
                "queue", "heartbeat_silent", {"agent": agent, "message_ids": group.ids}, primary.message_id
            )
        return True

    async def _outbound(
        self, agent: str, primary: QueuedMessage, target: ChatAddress, text: str, workspace: Path
    ) -> OutboundFiles:
        """The reply's text and the files it may attach (refused ones logged and reported as events)."""
        roots = send_roots(self.settings, agent, target.channel, target.conversation)
        out = outbound_files(text, workspace, roots)
        for path, reason in out.refused:
            log.warning("agent %s: refused to send %s: %s", agent, path, reason)
            await self._event(
                "queue",
                "send_file_refused",
                {"agent": agent, "path": path, "reason": reason},
                primary.message_id,
            )
        return out

    async def _chat_agents(self, agent: str, chat: ChatAddress | None) -> list[str]:
        """The agents a user chat has talked to, ``agent`` now included (replies name their agent once
        there is more than one); empty for agentpost's own channels (``chat`` None)."""
        if chat is None:
            return []
        try:
            return await call(record_answer, self.rt.db, chat.channel, chat.conversation, agent)
        except Exception as exc:  # who answered is presentation: never fail a finished run over it
            log.warning("could not record who answered %s: %s", chat.label, exc)
            return []

    async def _finish_failed(
        self,
        drive: Drive,
        group: WorkGroup,
        result: RunResult,
        on_fallback: bool = False,
        also: TxWork | None = None,
    ) -> None:
        ids = group.ids
        log.warning("agent %s: run failed for %s: %s", drive.agent, ", ".join(ids), result.error)
        diagnosis = diagnose(result)
        if diagnosis.pauses_agent:
            await self._rate_limited(drive, group, result, on_fallback, also)
            return
        if await self._settle(
            drive,
            group,
            self.rt.queue.fail_messages,
            ids,
            self.worker,
            result.error or "unknown error",
            permanent=diagnosis.permanent,
            explanation=diagnosis.explanation,
            advice=diagnosis.advice,
            tell_retry=True,
            also=also,
        ):
            self.stats.failed += len(ids)

    async def _rate_limited(
        self, drive: Drive, group: WorkGroup, result: RunResult, on_fallback: bool, also: TxWork | None = None
    ) -> None:
        """Fallback model or pause, without counting an attempt (see :mod:`workers.ratelimit`)."""
        agent, now = drive.agent, now_ms()
        strikes = self.pauses.strike(agent)
        reset = parse_reset(result.error, now)
        until = reset or now + backoff_ms(
            strikes, self.config.rate_limit_pause_seconds, self.config.rate_limit_max_pause_seconds
        )
        self.stats.rate_limited += len(group.ids)
        error = result.error or "rate limited"
        fallback = self.settings.agents[agent].fallback_model if agent in self.settings.agents else ""
        if fallback and not on_fallback:
            await call(use_fallback_until, self.rt.db, agent, until)
            await self._event(
                "agents",
                "model_fallback",
                {"agent": agent, "model": fallback, "until": until, "message_ids": group.ids},
                group.messages[0].message_id,
            )
            await self._settle(
                drive,
                group,
                self.rt.queue.fail_messages,
                group.ids,
                self.worker,
                error,
                count_attempt=False,
                retry_after_ms=0,
                also=also,
            )
            return
        reason = f"rate limited{' (stated reset)' if reset else ''}: {error[:200]}"
        await call(self.rt.queue.pause_agent, agent, until, reason)
        wait = max(0, until - now)
        for held in [group, *drive.groups]:
            why = error if held is group else "released: the agent is paused by a rate limit"
            await self._settle(
                drive,
                held,
                self.rt.queue.fail_messages,
                held.ids,
                self.worker,
                why,
                count_attempt=False,
                retry_after_ms=wait,
                also=also if held is group else None,
            )
        drive.paused = True
        self.pauses.pause(agent, wait / 1000)
        told = await call(
            notify_waiting_chats,
            self.rt.queue,
            agent,
            until,
            paused_text(until, now, on_fallback, overloaded=result.overloaded, service=result.service),
        )
        await self._event("agents", "rate_limit_notice", {"agent": agent, "until": until, "chats": told})

    async def _finish_stopped(self, drive: Drive, group: WorkGroup, run_id: str | None) -> None:
        """Complete a group the user stopped with one short "stopped" reply (kind ``stopped``)."""
        primary = group.messages[0]
        target = note_target(primary)
        draft = None
        if target is not None:
            draft = ResponseDraft.to(
                target,
                STOPPED_TEXT,
                metadata={
                    "kind": "stopped",
                    "agent": drive.agent,
                    **({"edit_key": run_id} if run_id else {}),
                },
            )
        if await self._settle(drive, group, self.rt.queue.complete_messages, group.ids, self.worker, draft):
            self.stats.stopped += len(group.ids)
            await self._event(
                "queue",
                "run_stopped",
                {"agent": drive.agent, "message_ids": group.ids, "running": run_id is not None},
                primary.message_id,
            )

    async def _model_for(self, agent: str, config: AgentSettings) -> tuple[AgentSettings, bool]:
        """The agent's settings for this run: on its fallback model while a rate limit lasts."""
        if not config.fallback_model:
            return config, False
        until = await call(fallback_until, self.rt.db, agent)
        if until <= now_ms():
            return config, False
        return config.model_copy(update={"model": config.fallback_model, "fallback_model": ""}), True

    def _system_prompt(self, config: AgentSettings, agent: str) -> str:
        parts = [config.system_prompt.strip(), team_instructions(self.settings, agent)]
        return "\n\n".join(p for p in parts if p)

    def _prompt(self, config: AgentSettings, agent: str, group: WorkGroup) -> str:
        prompt = build_prompt(group.messages, group.carried)
        if config.provider != "claude":
            # Other CLIs have no "append system prompt" flag: the instructions lead the prompt.
            system = self._system_prompt(config, agent)
            if system:
                prompt = f"<instructions>\n{system}\n</instructions>\n\n{prompt}"
        return prompt

    async def _quietly(self, write: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs) -> None:
        # Status records are observability: a failure to write one must not fail the run.
        try:
            await call(write, *args, **kwargs)
        except Exception as exc:
            log.warning("could not update the run record: %s", exc)

    async def _events(self, events: list[PendingEvent]) -> None:
        # Events are observability: a failure to write them must not fail the run they describe.
        try:
            await call(self.rt.events.append_many, events)
        except Exception as exc:
            log.warning("could not append %d events: %s", len(events), exc)

    async def _event(
        self, topic: str, type_: str, payload: dict[str, Any], message_id: str | None = None
    ) -> None:
        # Events are observability: a failure to write one must not fail the run it describes.
        try:
            await call(self.rt.events.append, topic, type_, payload, message_id=message_id)
        except Exception as exc:
            log.warning("could not append event %s: %s", type_, exc)
