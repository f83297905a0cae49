"""One run: a work group (claimed messages of one chat) going through one agent CLI run.

:meth:`Run.attempt` takes the group from its claim to what it came to, returned as one value
(:mod:`workers.outcome`), and :meth:`Run.go` hands that to the drive's writer:

1. checks that may end it before anything runs: the agent is configured, neither its sender nor its agent
   is over a ``[budgets]`` limit (:mod:`workers.budgets`), its workspace is not on another host
   (:mod:`workers.workspace`);
2. gathers what the CLI needs: the chat's busy policy, the conversation's session, the model in force (the
   fallback one during a rate limit), the prompt and system prompt, the environment and the sandbox;
3. marks the run started, with its ``chain_step_start`` event and its status record, in one transaction
   (from then on a crash of this processor costs the messages an *interrupted run*);
4. starts the provider with a watch beside it (:class:`workers.liveness.RunWatch`: ``/stop``, interrupting
   messages, "still working" notes);
5. returns what it came to (:func:`workers.outcome.classify`), with what the run leaves to write (its end
   event, status record, preview and usage: :class:`workers.outcome.RunEnd`); the drive's
   :meth:`workers.run_outcome.OutcomeWriter.apply` writes it, in one transaction with the completion where
   the run succeeded.

A :class:`Run` is built by the processor for each group with what it needs passed in; it holds nothing
after it ends.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from shared.aio import call
from shared.chat.sessions import AGENT_SCOPE_KEY, get_session
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.file_access import chat_upload_dir
from shared.ids import new_id
from shared.notices import steered_note
from shared.private_files import private_dir
from shared.queue import approvals
from shared.queue.core import LeaseLost, QueuedMessage, TxWork, retry_edit_key
from shared.queue.model_fallback import fallback_until
from shared.reads.conversation_status import clear_run, record_run_in
from shared.runtime import Runtime
from shared.settings.model import AgentSettings, Settings
from shared.storage.db import Tx
from shared.storage.dialect import sqlite_path
from workers.agent_env import child_env
from workers.approvals import Approver
from workers.budgets import budget_gate, usage_work
from workers.busy import WorkGroup, build_prompt, busy_notice_on, merge_arrivals, resolve_policy
from workers.drive import Drive, step_done
from workers.egress import EgressProxy
from workers.liveness import RunInfo, RunWatch, note_target
from workers.observe import quietly, record_events
from workers.outcome import CannotStart, Refused, RunEnd, RunOutcome, Superseded, classify, close
from workers.previews import PreviewWriter
from workers.processor_config import ProcessorSettings, ProcessorStats
from workers.prompt_images import images_of
from workers.providers.base import AgentProvider, ProviderError, RunRequest, RunResult
from workers.providers.claude_warm import WarmPool, WarmSlot
from workers.providers.registry import provider_for
from workers.run_outcome import OutcomeWriter
from workers.sandbox import Sandboxed, SandboxError, SandboxPlan, SandboxView, cli_home_for, for_agent
from workers.steer import SteerInbox, steered_prompt
from workers.storage_steps import StorageSteps
from workers.workspace import WorkspaceElsewhere, host_of, prepare_workspace, team_instructions

log = logging.getLogger("agentpost.processor")


class Run:
    """One work group's run (see the module docstring).

    ``rt`` gives the settings in force, the queue, the database and the event log; ``drive`` is the agent's
    holdings (its renewal lock, its waiting groups, where stop requests for other chats go); ``outcomes``
    writes the result; ``storage`` makes the run's start again while the database refuses it; ``sandbox``
    gives the plan agent CLIs run in (chosen when first asked); ``env`` is the base environment of the CLI;
    ``config`` the ``[processor]`` section in force; ``stats`` counts the invocation."""

    def __init__(
        self,
        rt: Runtime,
        drive: Drive,
        group: WorkGroup,
        *,
        outcomes: OutcomeWriter,
        storage: StorageSteps,
        worker: str,
        config: ProcessorSettings,
        env: Mapping[str, str],
        sandbox: Callable[[], SandboxPlan],
        stats: ProcessorStats,
        egress: EgressProxy | None = None,
        warm: WarmPool | None = None,
    ) -> None:
        self.rt = rt
        self.drive = drive
        self.group = group
        self.agent = drive.agent
        self.outcomes = outcomes
        self.storage = storage
        self.worker = worker
        self.config = config
        self.env = env
        self.sandbox = sandbox
        #: The processor's egress proxy: a sandboxed run's only way out (workers/egress.py).
        self.egress = egress
        self.stats = stats
        #: Kept claude processes (workers/providers/claude_warm.py); used when session_idle_seconds > 0.
        self.warm = warm
        #: The settings this run was started with (the agent's, its team's, where files may go).
        self.settings: Settings = rt.settings
        #: Writes the reply's text as it streams, for the chat's live preview (None: no preview).
        self.preview: PreviewWriter | None = None

    async def go(self) -> None:
        """Run the group and write its outcome: :meth:`attempt`, then the drive's writer
        (:meth:`workers.run_outcome.OutcomeWriter.apply`). Returns once the group is no longer held by this
        run: completed, failed, released, or (interrupted) back in the drive's front."""
        outcome = await self.attempt()
        try:
            await self.outcomes.apply(self.group, outcome)
        finally:
            close(outcome)

    async def attempt(self) -> RunOutcome:
        """Take the group through its run (see the module docstring) and return what it came to; writes
        only the run's start. The CLI's reply file, if any, stays open until the outcome is written."""
        agent, group, primary = self.agent, self.group, self.group.messages[0]
        config = self.settings.agents.get(agent)
        if config is None:
            error = f"agent {agent!r} is not configured"
            return CannotStart(RunResult(ok=False, error=error, cannot_start=True))
        over = await call(budget_gate(self.settings).over, self.rt.db, agent, primary)
        if over is not None:
            return Refused(over.error(), over.explanation(), over.advice(now_ms()))
        group.policy = await call(
            resolve_policy, self.rt.db, self.settings, self.config.busy_policy, group.messages[0].address
        )
        try:
            workspace = await call(prepare_workspace, self.rt.db, self.settings, agent, host_of(self.worker))
        except WorkspaceElsewhere as elsewhere:
            # Not in an empty folder: the group ends with one plain notice, the operator's line in its error.
            log.warning("agent %s: %s", agent, elsewhere.error())
            return Refused(elsewhere.error(), elsewhere.explanation(), elsewhere.advice())
        session_key = AGENT_SCOPE_KEY if config.session_scope == "agent" else group.chat
        session = await call(get_session, self.rt.db, agent, session_key)
        run_config, on_fallback = await self._model_for(config)
        run = RunInfo(agent, new_id("run"), group)
        if group.policy == "steer" and config.provider == "claude":
            run.steer = SteerInbox()  # codex and command agents cannot take a message mid-run: collect
        if any(m.retry_count for m in group.messages):
            run.edit_key = retry_edit_key(primary.message_id)
        self.preview = PreviewWriter.for_run(self.rt.db, self.settings, primary, run.edit_key, group.ids)
        approver = self._approver(run, config)
        try:
            egress = await self._egress_socket(run)
            request = self._request(run, config, run_config, workspace, session, session_key, egress)
            if approver is not None:
                request = dataclasses.replace(
                    request, ask=approver, warm=self._warm_slot(config, session_key, ask=True)
                )
        except SandboxError as exc:  # the agent's own user cannot be created: nothing can run confined
            return CannotStart(RunResult(ok=False, error=str(exc), cannot_start=True))
        fallback_model = run_config.model if on_fallback else None
        started = self._run_start(
            run, config.provider, session is not None, fallback_model, approver is not None
        )
        try:
            # From here a crash of this processor costs these messages an interrupted run; before, nothing.
            await self.storage.persist(
                f"agent {agent}: start of the run for {', '.join(group.ids)}",
                functools.partial(
                    self.rt.queue.messages.mark_run_started, group.ids, self.worker, also=started
                ),
            )
        except LeaseLost:
            return Superseded()
        self.stats.invocations += 1
        try:
            result = await self._invoke(run, request, config.provider)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await quietly(clear_run, self.rt.db, agent, run.run_id)
                await self._clear_preview()
            raise
        if approver is not None and result.ok and result.whole is None and approver.not_run_note():
            result.text = f"{result.text}\n\n{approver.not_run_note()}".strip()
        done = PendingEvent("chain_step_done", step_done(run, result), primary.message_id, topic="queue")
        run.close_progress()
        # What the run cost commits with its outcome, whichever it is: never counted twice, never lost.
        end = RunEnd(run, result, done, self.preview, usage_work(agent, run.run_id, primary, result))
        return classify(
            end, workspace=workspace, session_key=session_key, session=session, on_fallback=on_fallback
        )

    def _run_start(
        self, run: RunInfo, provider: str, resumed: bool, fallback_model: str | None, asks: bool = False
    ) -> TxWork:
        """What commits with the run's start: its ``chain_step_start`` event and its status record; for an
        agent that asks before tools run, the end of the requests an earlier attempt left waiting."""
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

        responses = self.rt.queue.responses

        def started(tx: Tx) -> None:
            append_events(tx, [start])
            if asks:
                approvals.expire_for_messages_in(tx, responses, group.ids)
            record_run_in(
                tx,
                run.agent,
                run_id=run.run_id,
                worker=self.worker,
                chat=group.messages[0].address,
                message_ids=group.ids,
                started_at=run.started_ms,
            )

        return started

    def _request(
        self,
        run: RunInfo,
        config: AgentSettings,
        run_config: AgentSettings,
        workspace: Path,
        session: str | None,
        session_key: str,
        egress: Path | None,
    ) -> RunRequest:
        """What the provider needs for ``run``: prompt, environment, limits (``run_config``: the model in
        force, the fallback one during a rate limit)."""
        agent, group = run.agent, run.group
        primary = group.messages[0]
        uploads = self._upload_dir()
        # Shown to claude as image blocks, which only its stream-json input takes: such a run needs a slot.
        images = images_of(group.messages) if config.provider == "claude" else ()
        extra_env = [("AGENTPOST_AGENT", agent), ("AGENTPOST_MESSAGE_ID", primary.message_id)]
        if uploads is not None:
            extra_env.append(("AGENTPOST_UPLOAD_DIR", str(uploads)))
        return RunRequest(
            agent=agent,
            settings=run_config,
            workspace=workspace,
            prompt=self._prompt(config),
            system_prompt=self._system_prompt(config) if config.provider == "claude" else "",
            session_id=session,
            env=child_env(self.env, config, extra_env),
            timeout=config.timeout_seconds,
            idle_timeout=self.config.idle_timeout_seconds,
            orphan_guard=self.config.orphan_guard,
            on_spawn=run.spawned,
            on_notice=run.tell,
            on_partial=self._on_partial(run),
            read_dirs=(uploads,) if uploads is not None else (),
            sandbox=self._sandboxed(workspace, uploads, egress, session_key),
            # agentpost's own folder, hidden from every run (the files there have no name anyway).
            spool_dir=private_dir(self.settings.home / "tmp"),
            warm=self._warm_slot(config, session_key, steer=run.steer is not None or bool(images)),
            steer=run.steer,
            images=images,
        )

    def _on_partial(self, run: RunInfo) -> Callable[[str], None] | None:
        """``RunRequest.on_partial`` when the chat shows a live preview: the text so far goes to the preview,
        and its first words time the run's first text (None: no preview, so no partial text is asked for)."""
        preview = self.preview
        if preview is None:
            return None

        def partial(text: str) -> None:
            run.saw_text(text)
            preview.update(text)

        return partial

    def _warm_slot(
        self, config: AgentSettings, session_key: str, *, steer: bool = False, ask: bool = False
    ) -> WarmSlot | None:
        """Where this run's turn goes when the chat's claude process is kept between runs, or the run takes
        steered messages or answers permission prompts (stream-json input, kept only with warm sessions
        on); None: cold."""
        if self.warm is None or config.provider != "claude":
            return None
        if self.config.session_idle_seconds <= 0 and not (steer or ask):
            return None
        return self.warm.slot(self.agent, session_key)

    async def _steer(self, run: RunInfo, messages: list[QueuedMessage]) -> None:
        """Messages of this chat claimed while the run goes on (the ``steer`` policy): hand them to the run
        and tell the chat; when the run no longer takes any, they wait for the agent's next run."""
        if run.steer is not None and run.steer.offer(steered_prompt(messages, run.group.messages)):
            # Answered by the run's final reply, renewed with its leases; their claim's event names the run.
            run.group.messages.extend(messages)
            await quietly(self._tell_steered, run, messages)
        else:
            merge_arrivals(self.drive.groups, messages, lambda _key: "collect")

    def _tell_steered(self, run: RunInfo, messages: list[QueuedMessage]) -> None:
        """The note each steered message's chat gets (unless ``busy_notice`` is off for its channel)."""
        for message in messages:
            target = note_target(message)
            if target is None or not busy_notice_on(self.settings, message.channel):
                continue
            self.rt.queue.responses.enqueue_response(
                target,
                steered_note(run.agent),
                agent=run.agent,
                metadata={
                    "kind": "progress",
                    "note": "steer",
                    "edit_key": f"busy_{message.message_id}",
                    "agent": run.agent,
                    "policy": "steer",
                    "run_id": run.run_id,
                },
                message_id=message.message_id,
            )

    def _approver(self, run: RunInfo, config: AgentSettings) -> Approver | None:
        """Who answers the CLI's permission prompts of an agent in ``ask`` mode (claude only): the person in
        the chat the message came from (a teammate's run: the chat its chain started from)."""
        if config.permission_mode != "ask" or config.provider != "claude":
            return None
        return Approver(
            self.rt,
            run,
            note_target(run.group.messages[0]),
            self.config.approval_timeout_seconds,
            show=self.preview.update if self.preview is not None else None,
        )

    def _plan(self) -> SandboxPlan:
        """The sandbox plan for this agent's runs (its own user, when the service runs as root)."""
        return for_agent(self.sandbox(), self.agent)

    async def _egress_socket(self, run: RunInfo) -> Path | None:
        """The egress proxy's socket for this agent's runs, when they run in a network of their own."""
        plan = await call(self._plan)
        if self.egress is None or plan.kind == "none" or not plan.network:
            return None
        path = await self.egress.socket_for(run.agent, plan.user)
        self.egress.new_run(run.agent, run.run_id)
        return path

    def _sandboxed(
        self, workspace: Path, uploads: Path | None, egress: Path | None, session_key: str
    ) -> Sandboxed | None:
        """The sandbox of this run (None when this processor runs agents unconfined): its workspace, the
        CLI home of its chat (:func:`cli_home_for`), the chat's uploads; agentpost's home, the SQLite
        database's folder and the service user's home hidden."""
        plan = self._plan()
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
            cli_home=cli_home_for(home, self.agent, session_key),
            readable=(uploads,) if uploads is not None else (),
            hidden=tuple(p for p in hidden if p.is_absolute() and len(p.parts) > 1),
            egress=egress,
            home=home,
        )
        return Sandboxed(plan, view, login_home=service_home)

    def _upload_dir(self) -> Path | None:
        """The upload folder of the chat this run answers (a teammate's run: the chat its chain started
        from), when it exists: the run may read it, so the files the user sent reach the agent."""
        primary = self.group.messages[0]
        target = note_target(primary) or primary.address
        folder = chat_upload_dir(self.settings, target)
        return folder if folder.is_dir() else None

    async def _invoke(self, run: RunInfo, request: RunRequest, kind: str) -> RunResult:
        """Run the CLI with a watch beside it; a stop or interrupt cancels the run (``run.reason``)."""
        try:
            provider: AgentProvider = provider_for(kind)
        except ProviderError as exc:
            return RunResult(ok=False, error=str(exc), cannot_start=True)
        ids = run.group.ids

        async def progress(text: str) -> None:
            run.saw_text(text)
            run.step(text)
            if not self.config.progress_events:
                return
            payload = {"agent": run.agent, "text": text[:4000], "message_ids": ids, "run_id": run.run_id}
            if run.add_progress_event(PendingEvent("agent_progress", payload, ids[0], topic="progress")):
                await record_events(self.rt.events, run.take_events())

        watch = RunWatch(
            self.rt,
            self.worker,
            run,
            control_interval=self.config.control_interval_seconds,
            note_seconds=self.config.progress_note_seconds,
            on_foreign_stop=self.drive.stops.add,
            default_policy=self.config.busy_policy,
            on_steer=functools.partial(self._steer, run),
            claiming=self.storage.claiming,
        )
        result = RunResult(ok=False, error="stopped before the CLI finished")
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch.run, scope)
                if self.preview is not None:
                    tg.start_soon(self.preview.run)
                result = await provider.run(request, progress)
                if self.preview is not None:
                    self.preview.stop()  # a write in flight finishes before the cancel below returns
                tg.cancel_scope.cancel()
        return result

    async def _clear_preview(self) -> None:
        """Forget the live preview's text of a run that ended without a final reply."""
        if self.preview is not None:
            await self.preview.clear()

    async def _model_for(self, config: AgentSettings) -> tuple[AgentSettings, bool]:
        """The agent's settings for this run: on its fallback model while a rate limit lasts."""
        if not config.fallback_model:
            return config, False
        until = await call(fallback_until, self.rt.db, self.agent)
        if until <= now_ms():
            return config, False
        return config.model_copy(update={"model": config.fallback_model, "fallback_model": ""}), True

    def _system_prompt(self, config: AgentSettings) -> str:
        parts = [config.system_prompt.strip(), team_instructions(self.settings, self.agent)]
        return "\n\n".join(p for p in parts if p)

    def _prompt(self, config: AgentSettings) -> str:
        prompt = build_prompt(self.group.messages, self.group.carried)
        if config.provider != "claude":
            # Other CLIs have no "append system prompt" flag: the instructions lead the prompt.
            system = self._system_prompt(config)
            if system:
                prompt = f"<instructions>\n{system}\n</instructions>\n\n{prompt}"
        return prompt
