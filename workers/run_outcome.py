"""Writing what became of a work group: each outcome in one transaction while the group's leases are held.

- success: the reply (metadata ``kind: final`` and the run's ``edit_key``), handoffs, chat posts and
  history; a heartbeat whose reply is the agent's silent token is recorded with no response;
- failure: back to ``pending`` with a backoff, counting an attempt (dead with one notice at the limit);
- refused before it ran (over a budget, its workspace on another host): dead at once with one notice;
- rate limit: the fallback model or a pause, no attempt counted (:mod:`workers.ratelimit`);
- ``/stop``: completed with one short "stopped" reply (kind ``stopped``);
- interrupted by a newer message: not completed, not failed; back in front of the waiting groups;
- dropped by the ``max_waiting`` cap: completed with one notice listing them (kind ``dropped``).

An :class:`OutcomeWriter` serves one drive (:class:`workers.drive.Drive`): a :class:`workers.run.Run`
returns what it came to as one value (:mod:`workers.outcome`) and :meth:`OutcomeWriter.apply` writes it; the
processor also uses the writer for the groups it settles without a run (stopped while waiting, dropped by
the cap).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec

import anyio

from shared.aio import call
from shared.chat.address import ChatAddress
from shared.chat.agents import record_answer
from shared.chat.sessions import clear_sessions, set_session, set_session_in
from shared.clock import now_ms
from shared.file_access import chat_upload_dir, send_roots
from shared.queue.core import CompleteOutcome, LeaseLost, QueuedMessage, ResponseDraft, TxWork
from shared.queue.model_fallback import use_fallback_until
from shared.reads.conversation_status import clear_run
from shared.runtime import Runtime
from shared.storage.db import Tx
from workers.busy import WorkGroup, dropped_notice
from workers.drive import Drive
from workers.errors import diagnose
from workers.files import OutboundFiles, outbound_files
from workers.liveness import RunInfo, note_target
from workers.observe import quietly, record_event, record_events
from workers.outcome import (
    CannotStart,
    Completed,
    Failed,
    Interrupted,
    Refused,
    ResumeWholeSession,
    RunEnd,
    RunOutcome,
    StartAfresh,
    Stopped,
    Superseded,
)
from workers.output_bounds import save_long_reply
from workers.pauses import RateLimitPauses, WaitedNote
from workers.processor_config import ProcessorSettings, ProcessorStats
from workers.providers.base import RunResult
from workers.providers.claude_warm import split_session_ref
from workers.ratelimit import backoff_ms, notify_waiting_chats, parse_reset, paused_text
from workers.storage_steps import StorageSteps
from workers.teams import plan_reply

log = logging.getLogger("agentpost.processor")

P = ParamSpec("P")

STOPPED_TEXT = "Stopped. I did not finish this; send it again when you want me to continue."


class OutcomeWriter:
    """Writes the outcomes of ``drive``'s groups (see the module docstring): through ``storage`` (a write
    refused for a while is made again), under the drive's renewal lock, counted in ``stats``; ``pauses``
    keeps the agent's rate-limit strikes; ``config`` is the ``[processor]`` section in force."""

    def __init__(
        self,
        rt: Runtime,
        drive: Drive,
        *,
        worker: str,
        config: ProcessorSettings,
        stats: ProcessorStats,
        pauses: RateLimitPauses,
        storage: StorageSteps,
    ) -> None:
        self.rt = rt
        self.drive = drive
        self.worker = worker
        self.config = config
        self.stats = stats
        self.pauses = pauses
        self.storage = storage

    async def _event(
        self, topic: str, type_: str, payload: dict[str, Any], message_id: str | None = None
    ) -> None:
        await record_event(self.rt.events, topic, type_, payload, message_id)

    async def settle(
        self, group: WorkGroup, write: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs
    ) -> bool:
        """Write a group's outcome, ``write(*args, **kwargs)``, under the renewal lock, and stop holding the
        group; False if the lease was lost. A write the database refuses for a while (a full disk, a server
        restarting) is made again until it lands, still held: the reply of a finished run is not thrown
        away, and its messages are not left behind in ``processing``. Should the leases lapse meanwhile
        and another worker take the messages over, the write is fenced off (``LeaseLost``), never doubled."""
        drive = self.drive
        async with drive.lock:
            try:
                await self.storage.persist(
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

    # -- what a run came to ----------------------------------------------------------------------------------
    async def apply(self, group: WorkGroup, outcome: RunOutcome) -> None:
        """Write what ``group``'s run came to (see :mod:`workers.outcome`). A completion carries the run's
        end with it in one transaction; any other end of a started run first closes the run (its status
        record, its preview's text, its events), then writes its own outcome."""
        match outcome:
            case CannotStart(result):
                await self.failed(group, result)
            case Refused(error, explanation, advice):
                await self.refused(group, error, explanation=explanation, advice=advice)
            case Superseded():
                self.drive.lost = True
                self.drive.forget(group)
            case Completed(end, workspace, session_key):
                try:
                    finished = await self.succeeded(
                        end.run, end.result, workspace, session_key, end.with_completion
                    )
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        await self._forget_run(end)
                    raise
                if finished:
                    end.run.take_events()
                else:  # the lease was lost: the run still ends, with nothing else to write
                    await self._close_run(end)
            case Stopped(end):
                await self._close_run(end)
                await self.stopped(group, end.run.edit_key)
            case Interrupted(end):
                await self._close_run(end)
                await self.interrupted(group)
            case StartAfresh(end, session_key):
                await self._close_run(end)
                await self.start_afresh(group, session_key, also=end.spent)
            case ResumeWholeSession(end, session_key, session):
                await self._close_run(end)
                await self.resume_whole_session(group, session_key, session, also=end.spent)
            case Failed(end, on_fallback):
                await self._close_run(end)
                await self.failed(group, end.result, on_fallback, also=end.spent)

    async def _forget_run(self, end: RunEnd) -> None:
        """Remove the run's status record and its preview's text (a run that ended without a final reply)."""
        await quietly(clear_run, self.rt.db, end.run.agent, end.run.run_id)
        if end.preview is not None:
            await end.preview.clear()

    async def _close_run(self, end: RunEnd) -> None:
        """End a run whose outcome is written on its own: :meth:`_forget_run`, then its events."""
        await self._forget_run(end)
        await record_events(self.rt.events, [*end.run.take_events(), end.done])

    # -- without a run -------------------------------------------------------------------------------------
    async def dropped(self, batch: list[QueuedMessage]) -> None:
        """Complete messages the ``max_waiting`` cap dropped, with one notice listing them."""
        ids = [m.message_id for m in batch]
        target = note_target(batch[0])
        draft = None
        if target is not None:
            draft = ResponseDraft.to(
                target,
                dropped_notice(batch, self.config.max_waiting),
                metadata={"kind": "dropped", "dropped": ids, "agent": self.drive.agent},
            )
        group = WorkGroup(batch, "collect")
        if await self.settle(group, self.rt.queue.messages.complete_messages, ids, self.worker, draft):
            self.stats.dropped += len(ids)
            await self._event(
                "queue",
                "messages_dropped",
                {"agent": self.drive.agent, "message_ids": ids, "max": self.config.max_waiting},
                ids[0],
            )

    async def refused(self, group: WorkGroup, error: str, *, explanation: str, advice: str) -> None:
        """A group that may not run (over a budget, its workspace on another host): dead at once, with one
        plain notice to its sender (``explanation`` and ``advice``) and the operator's line in ``error``."""
        if await self.settle(
            group,
            self.rt.queue.failures.fail_messages,
            group.ids,
            self.worker,
            error,
            permanent=True,
            explanation=explanation,
            advice=advice,
        ):
            self.stats.failed += len(group.ids)

    async def stopped(self, group: WorkGroup, edit_key: str | None) -> None:
        """Complete a group the user stopped with one short "stopped" reply (kind ``stopped``); ``edit_key``
        is the key of its run's notes (None: it was stopped while waiting)."""
        primary = group.messages[0]
        target = note_target(primary)
        draft = None
        if target is not None:
            draft = ResponseDraft.to(
                target,
                STOPPED_TEXT,
                metadata={
                    "kind": "stopped",
                    "agent": self.drive.agent,
                    **({"edit_key": edit_key} if edit_key else {}),
                },
            )
        if await self.settle(group, self.rt.queue.messages.complete_messages, group.ids, self.worker, draft):
            self.stats.stopped += len(group.ids)
            await self._event(
                "queue",
                "run_stopped",
                {"agent": self.drive.agent, "message_ids": group.ids, "running": edit_key is not None},
                primary.message_id,
            )

    # -- after a run ---------------------------------------------------------------------------------------
    async def interrupted(self, group: WorkGroup) -> None:
        """Not completed, not failed: the group waits in front, and the next claim merges the messages that
        interrupted it; the next run is told what it had started on. No attempt is counted."""
        drive = self.drive
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

    async def start_afresh(self, group: WorkGroup, session_key: str, *, also: TxWork | None) -> None:
        """The chat's conversation is not on this host (another host ran it, or its CLI home was removed):
        forget it, and run the messages again at once in a new conversation, charging them nothing (a retry
        would only fail the same way here)."""
        why = "the conversation to continue is not on this host; starting a new one"
        log.warning("agent %s, chat %s: %s", self.drive.agent, group.chat, why)
        await quietly(clear_sessions, self.rt.db, self.drive.agent, session_key, reason=why)
        fail = self.rt.queue.failures.fail_messages
        if await self.settle(
            group, fail, group.ids, self.worker, why, count_attempt=False, retry_after_ms=0, also=also
        ):
            self.stats.released += len(group.ids)

    async def resume_whole_session(
        self, group: WorkGroup, session_key: str, session: str, *, also: TxWork | None
    ) -> None:
        """The conversation's recorded resume point is not in its session file (a write there was lost):
        continue the session from its end instead, and run the messages again at once, charging them
        nothing — resuming at the lost point would fail the same way on every try, and starting afresh
        would drop the conversation."""
        whole, _ = split_session_ref(session)
        why = "the point to continue the conversation from was lost; continuing from its end"
        log.warning("agent %s, chat %s: %s (%s)", self.drive.agent, group.chat, why, session)
        await quietly(set_session, self.rt.db, self.drive.agent, session_key, whole)
        fail = self.rt.queue.failures.fail_messages
        if await self.settle(
            group, fail, group.ids, self.worker, why, count_attempt=False, retry_after_ms=0, also=also
        ):
            self.stats.released += len(group.ids)

    async def succeeded(
        self, run: RunInfo, result: RunResult, workspace: Path, session_key: str, ended: TxWork
    ) -> bool:
        """Complete a successful run with its reply; ``ended`` (the run's end event and record) and the
        conversation's new session are written with it. True when that write happened; False (lease lost)
        leaves ``ended`` to the caller."""
        drive, group = self.drive, run.group
        agent, primary = drive.agent, group.messages[0]
        self.pauses.clear_strikes(agent)
        user_chat = note_target(primary)  # None for agentpost's own channels
        target = user_chat or primary.address
        text, whole_reply = await self._bounded(run, result, target)
        out = await self._outbound(primary, target, text, workspace)
        if whole_reply is not None:
            out.files.append(str(whole_reply))
        chat_agents = await self._chat_agents(user_chat)
        plan = plan_reply(
            self.rt.settings,
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
            waited[:] = [n for n in [self.storage.waited_note(primary)] if n is not None]
            for note in waited:
                note.write(tx)
            if session_id:
                set_session_in(tx, agent, session_key, session_id, started_at=run.started_ms)

        outcome: list[CompleteOutcome] = []

        def complete() -> None:
            outcome.append(
                self.rt.queue.messages.complete_messages(
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

        if not await self.settle(group, complete):
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

    async def _bounded(self, run: RunInfo, result: RunResult, target: ChatAddress) -> tuple[str, Path | None]:
        """The reply's text within ``[processor] reply_max_chars``, and the file holding the whole of a longer
        one (:func:`workers.output_bounds.save_long_reply`). The file goes to the upload folder of the chat the
        reply goes to: agentpost's own folder, which the attachment rule allows (shared/file_access.py) and
        no agent run may write (a run reads its chat's uploads, never writes them), in a folder of its own
        per run; not the workspace, where the agent could swap the file for another before it is sent."""
        limit = self.config.reply_max_chars
        if result.whole is None and len(result.text) <= limit:
            return result.text, None
        folder = chat_upload_dir(self.rt.settings, target) / f"reply-{run.run_id}"
        text, path = await call(save_long_reply, result.text, result.whole, limit, folder)
        await self._event(
            "queue",
            "reply_cut",
            {
                "agent": self.drive.agent,
                "run_id": run.run_id,
                "chars": result.whole.chars if result.whole is not None else len(result.text),
                "shown": limit,
                "file": str(path) if path is not None else None,
            },
            run.group.messages[0].message_id,
        )
        return text, path

    async def _outbound(
        self, primary: QueuedMessage, target: ChatAddress, text: str, workspace: Path
    ) -> OutboundFiles:
        """The reply's text and the files it may attach (refused ones logged and reported as events)."""
        agent = self.drive.agent
        roots = send_roots(self.rt.settings, agent, target)
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

    async def _chat_agents(self, chat: ChatAddress | None) -> list[str]:
        """The agents a user chat has talked to, this one now included (replies name their agent once
        there is more than one); empty for agentpost's own channels (``chat`` None)."""
        if chat is None:
            return []
        try:
            return await call(record_answer, self.rt.db, chat, self.drive.agent)
        except Exception as exc:  # who answered is presentation: never fail a finished run over it
            log.warning("could not record who answered %s: %s", chat.label, exc)
            return []

    async def failed(
        self, group: WorkGroup, result: RunResult, on_fallback: bool = False, also: TxWork | None = None
    ) -> None:
        """A run that failed (or could not start): back with a backoff, or dead at the limit; a rate limit
        goes to :meth:`_rate_limited`. ``also`` (the run's usage) commits with the outcome."""
        ids = group.ids
        log.warning("agent %s: run failed for %s: %s", self.drive.agent, ", ".join(ids), result.error)
        diagnosis = diagnose(result)
        if diagnosis.pauses_agent:
            await self._rate_limited(group, result, on_fallback, also)
            return
        if await self.settle(
            group,
            self.rt.queue.failures.fail_messages,
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
        self, group: WorkGroup, result: RunResult, on_fallback: bool, also: TxWork | None = None
    ) -> None:
        """Fallback model or pause, without counting an attempt (see :mod:`workers.ratelimit`)."""
        drive = self.drive
        agent, now = drive.agent, now_ms()
        strikes = self.pauses.strike(agent)
        reset = parse_reset(result.error, now)
        until = reset or now + backoff_ms(
            strikes, self.config.rate_limit_pause_seconds, self.config.rate_limit_max_pause_seconds
        )
        self.stats.rate_limited += len(group.ids)
        error = result.error or "rate limited"
        settings = self.rt.settings
        fallback = settings.agents[agent].fallback_model if agent in settings.agents else ""
        if fallback and not on_fallback:
            await call(use_fallback_until, self.rt.db, agent, until)
            await self._event(
                "agents",
                "model_fallback",
                {"agent": agent, "model": fallback, "until": until, "message_ids": group.ids},
                group.messages[0].message_id,
            )
            await self.settle(
                group,
                self.rt.queue.failures.fail_messages,
                group.ids,
                self.worker,
                error,
                count_attempt=False,
                retry_after_ms=0,
                also=also,
            )
            return
        reason = f"rate limited{' (stated reset)' if reset else ''}: {error[:200]}"
        await call(self.rt.queue.control.pause_agent, agent, until, reason)
        wait = max(0, until - now)
        for held in [group, *drive.groups]:
            why = error if held is group else "released: the agent is paused by a rate limit"
            await self.settle(
                held,
                self.rt.queue.failures.fail_messages,
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
