"""The processor's half of asking a person before a tool runs (``[agents.X] permission_mode = "ask"``).

An :class:`Approver` is a run's ``RunRequest.ask``: for each tool use the CLI asks about
(:mod:`workers.providers.permissions`) it

1. allows at once what the chat allowed "for this chat" earlier (the same tool and pattern; ``/reset``
   forgets it);
2. otherwise writes the request with its question to the chat (:func:`shared.queue.approvals.ask`): the run's
   preview and ``/status`` say it waits for an approval;
3. waits — woken by every database change, checking at least every :data:`CHECK_SECONDS` — until it is
   answered, its time (``[processor] approval_timeout_seconds``) runs out (a denial, the chat told), or the run
   ends first (a ``/stop``, a shutdown: the request is cancelled, the chat told);
4. returns the decision; a denial tells the model why, so the agent goes on, and the run's final reply ends
   with what was not done (:meth:`Approver.not_run_note`).

Nothing here holds the request: a processor killed while one waits leaves it in the database, the message
is run again like after any crash, and its new run asks again (the earlier request is expired when the run
starts: :func:`shared.queue.approvals.expire_for_messages_in`). The wait is not counted against the run's
idle and ceiling limits (:meth:`workers.providers.base.StreamState.begin_wait`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from shared.aio import call
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue import approvals
from shared.queue.approvals import Question
from shared.runtime import Runtime
from shared.storage.statuses import ApprovalStatus
from workers.liveness import RunInfo
from workers.providers.permissions import ToolAsk, ToolDecision, detail_of

log = logging.getLogger("agentpost.processor")

#: The longest a waiting run goes without reading its request (a change signal usually comes first).
CHECK_SECONDS = 1.0


class Approver:
    """``RunRequest.ask`` of one run (see the module docstring): ``chat`` is where to ask (None: nobody
    can be asked in a chat, only operators), ``timeout`` the seconds a request waits; ``show`` puts a line
    in the run's live preview."""

    def __init__(
        self,
        rt: Runtime,
        run: RunInfo,
        chat: ChatAddress | None,
        timeout: float,
        show: Callable[[str], None] | None = None,
    ) -> None:
        self.rt = rt
        self.run = run
        self.chat = chat
        self.timeout = timeout
        self.show = show
        #: What the run was not allowed to do, for its final reply.
        self.not_run: list[str] = []

    async def __call__(self, ask: ToolAsk) -> ToolDecision:
        db = self.rt.db
        if self.chat is not None:
            rules = await call(approvals.chat_rules, db, self.run.agent, self.chat)
            if approvals.allowed_by_rule(rules, ask.tool, ask.subject):
                return ToolDecision(True)
        question = Question(
            agent=self.run.agent,
            tool=ask.tool,
            summary=ask.summary,
            detail=detail_of(ask),
            pattern=ask.pattern,
            message_id=self.run.group.messages[0].message_id,
            run_id=self.run.run_id,
            chat=self.chat,
            timeout_ms=int(self.timeout * 1000),
        )
        request = await call(approvals.ask, db, self.rt.queue.responses, question)
        waiting = f"Waiting for your approval: {ask.tool}: {' '.join(ask.summary.split())[:120]}"
        self.run.step(waiting)
        if self.show is not None:
            self.show(f"⏳ {waiting}")
        log.info("agent %s: run %s asks %s (%s)", self.run.agent, self.run.run_id, request.id, ask.tool)
        final = await self._wait(request.id, request.expires_at)
        decision = self._decision(ask, final)
        if self.show is not None:  # the preview no longer says it waits
            doing = "Running" if decision.allow else "Not run"
            self.show(
                f"{'▶' if decision.allow else '⏭'} {doing}: {ask.tool}: {' '.join(ask.summary.split())[:120]}"
            )
        return decision

    async def _wait(self, approval_id: str, expires_at_ms: int) -> approvals.Approval:
        """Wait until the request is answered or over; end it when its time runs out or the run stops."""
        db, responses, waker = self.rt.db, self.rt.queue.responses, self.rt.waker
        deadline = time.monotonic() + max(0.0, (expires_at_ms - now_ms()) / 1000)
        try:
            while True:
                generation = waker.generation
                current = await call(approvals.get, db, approval_id)
                if current is None or current.status != ApprovalStatus.PENDING:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    await call(
                        approvals.end_waiting, db, responses, approval_id, ApprovalStatus.TIMED_OUT, "timeout"
                    )
                    continue  # read what it came to (an answer may have landed first)
                await waker.wait_async(generation, min(CHECK_SECONDS, left))
        except BaseException:
            # The run ends first (a /stop, a lost lease, a shutdown): nobody waits for this answer any more.
            with anyio.CancelScope(shield=True):
                try:
                    await call(
                        approvals.end_waiting, db, responses, approval_id, ApprovalStatus.CANCELLED, "stop"
                    )
                except Exception:  # the database is away: the request expires by its time anyway
                    log.warning("could not cancel approval request %s", approval_id, exc_info=True)
            raise
        if current is None:  # removed under us (never by agentpost): as good as denied
            raise LookupError(f"approval request {approval_id} disappeared")
        return current

    def _decision(self, ask: ToolAsk, final: approvals.Approval) -> ToolDecision:
        what = f"{ask.tool}: {' '.join(ask.summary.split())[:160]}"
        if final.status == ApprovalStatus.ALLOWED:
            return ToolDecision(True)
        if final.status == ApprovalStatus.DENIED:
            self.not_run.append(f"{what} (denied)")
            return ToolDecision(
                False,
                "The person you are working for denied this tool use, so it did not run. Do not try to do the "
                "same another way; go on without it and say in your reply what you could not do.",
            )
        within = approvals.wait_words(int(self.timeout * 1000))
        self.not_run.append(f"{what} (no answer within {within})")
        return ToolDecision(
            False,
            f"Nobody answered the request to allow this within {within}, so it did not run. Go on without it "
            "and say in your reply what you could not do.",
        )

    def not_run_note(self) -> str:
        """The line the run's final reply ends with when something was not allowed ("" when all was)."""
        if not self.not_run:
            return ""
        return "Not run: " + "; ".join(self.not_run) + "."
