"""The delivery part of the channel runner (:mod:`adapters.runner`): durable chunked delivery, progress notes, typing.

- **Delivery**: wake on new responses, claim the channel's responses with a lease — at most one per chat,
  the oldest unfinished one (:meth:`shared.queue.delivery.Responses.claim_responses_for_channel`) — and deliver each chat
  in its own task, so chats never wait for each other while each chat gets its replies in order, one at a
  time. A response is sent as parts (chunks split by :mod:`adapters.chunking`, then the attached files; a
  reply longer than ``max_chunks`` chunks goes as one file of a type the platform accepts); each part is
  recorded with ``mark_chunk_delivered`` right after the platform confirmed it, and the response is acked
  at the end. The parts are a pure function of the response, so after a crash the next claim resumes at the
  first part not recorded: only a part whose confirmation was lost in the crash can be sent twice. The
  lease is renewed while a part is being sent, so a slow send is not mistaken for a dead deliverer.
- **Send errors** are classified by the platform plugin (:meth:`adapters.platform.Platform.classify_send_error`): a
  *permanent* refusal (blocked bot, unknown chat, a window that closed, a file type refused) marks the
  response ``failed`` with the platform's reason at once and the chat is told the next time the user writes
  (:mod:`adapters.intake`); a *transient* one (5xx, network, rate limit) gives the response back with a
  backoff that holds up only its own chat, and after ``delivery_attempts`` of them it is failed too. A
  failed response is never reported as delivered.
- **Progress notes**: a response with metadata ``{"kind": "progress", "edit_key": K}`` goes to
  :class:`adapters.progress_notes.ProgressNotes`, which sends it once and edits that message with later
  notes of the key where the platform can; the final reply of the key closes the note ("done") in the
  transaction that records its last part.
- **Questions**: an agent's question before a tool runs (``{"kind": "approval"}``) is sent with buttons and
  edited to its answer (``{"kind": "approval_closed"}``) by :class:`adapters.approval_prompts.ApprovalPrompts`.
- **Late messages**: the final reply to a message that reached the adapter only after a restart (it was
  sent while the adapter was down, more than ``late_message_seconds`` before it was handled) starts with a
  line saying so.
- **Typing**: while a chat has a message pending (of an agent that is not paused) or processing, the
  platform's typing indicator is refreshed every ``typing_interval_seconds``, however long the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from adapters.approval_prompts import KINDS as QUESTION_KINDS
from adapters.approval_prompts import ApprovalPrompts
from adapters.chunking import split_message
from adapters.platform import SendFailure
from adapters.previews import Previews
from adapters.progress_notes import ProgressNotes
from shared.aio import call
from shared.chat import dedupe, lookups
from shared.clock import now_ms
from shared.file_access import MISSING, check_send_path, copy_for_sending, safe_name, send_roots
from shared.queue.core import QueuedResponse, TxWork
from shared.reads import late_messages
from shared.storage.db import Tx

if TYPE_CHECKING:
    from adapters.platform import Platform

#: How often the delivery loop forgets old delivery records (platform ids, notices nobody collected).
RECORD_PRUNE_INTERVAL_S = 3600.0
#: Response kinds a user is not told about when they fail (a lost progress note is no loss).
_SILENT_FAILURE_KINDS = frozenset({"progress", "undelivered_notice"})
#: Chats whose pending messages wait longer than this (a long backoff) show no typing.
TYPING_HORIZON_MS = 60_000


@dataclass(frozen=True)
class Part:
    """One thing to send for a response: a text chunk, or a file with an optional caption."""

    kind: Literal["text", "file"]
    text: str = ""
    path: str = ""
    #: For a file the agent attached: the folders it may come from; it is sent as a checked copy
    #: (:func:`shared.file_access.copy_for_sending`). Empty for a file of the channel's own.
    roots: tuple[str, ...] = ()


def offline_preface(sent_at_ms: int) -> str:
    """The first line of a reply to a message that arrived while the bot was offline."""
    at = datetime.fromtimestamp(sent_at_ms / 1000, UTC).strftime("%H:%M UTC on %b %d")
    return f"(Your message from {at} arrived while I was offline — here is my answer.)"


def _both(first: TxWork, second: TxWork | None) -> TxWork:
    """One write doing ``first`` then ``second`` (when given), for one ``also=``."""

    def write(tx: Tx) -> None:
        first(tx)
        if second is not None:
            second(tx)

    return write


class Delivery:
    """Delivers one channel's replies, progress notes and typing (a part of
    :class:`adapters.runner.ChannelRunner`).

    Given the platform (sending, its limits and error classification, its settings section), the
    runner's worker id (the lease owner of claimed responses), the queue poll interval, and the runner's
    stop event (checked between parts: a stopping channel hands the rest back)."""

    def __init__(
        self, platform: Platform, *, worker: str, poll_interval: float, stop_event: asyncio.Event
    ) -> None:
        self.platform = platform
        self.rt = platform.rt
        self.name = platform.name
        self.config = platform.config
        self.log = platform.log
        self.worker = worker
        self.lease_ms = self.rt.queue.config.lease_ms
        self.poll_interval = poll_interval
        self.stop_event = stop_event
        #: Live previews (a part of delivery: a final reply's first part becomes its run's preview).
        self.previews = Previews(platform, stop_event=stop_event, poll_interval=poll_interval)
        #: Progress notes (a part of delivery: a final reply closes its run's note).
        self.notes = ProgressNotes(
            platform, worker=worker, lease_ms=self.lease_ms, send_failed=self._send_failed
        )
        #: An agent's questions before a tool runs, and their answers (edited into the question).
        self.questions = ApprovalPrompts(
            platform, worker=worker, lease_ms=self.lease_ms, send_failed=self._send_failed
        )

    # -- planning --------------------------------------------------------------------------------------------
    def plan(self, response: QueuedResponse) -> list[Part]:
        """The parts a response is sent as. Deterministic, so a restart resumes at the same part."""
        text = response.message.strip()
        chunks = split_message(text, self.platform.limit, length=self.platform.measure) if text else []
        parts: list[Part] = []
        if len(chunks) > self.config.max_chunks:
            path = self._long_reply_file(response, text)
            parts.append(
                Part(
                    "file", f"The reply is long ({len(text)} characters), so it is attached as a file.", path
                )
            )
        else:
            parts.extend(Part("text", chunk) for chunk in chunks)
        # Checked again here, not only when the reply was queued: the API and the processor queue paths, and
        # a path can be swapped for a symlink in between (shared.file_access has the one rule).
        roots = send_roots(self.rt.settings, response.agent, response.address)
        for f in response.files:
            allowed, why = check_send_path(str(f), roots)
            if allowed is None:
                self.log.warning("refused to send %s for %s: %s", f, response.message_id, why)
                parts.append(
                    Part("text", f"(a file the agent attached, {Path(str(f)).name}, was not sent: {why})")
                )
            else:
                parts.append(Part("file", "", allowed, tuple(str(root) for root in roots)))
        return parts

    def _long_reply_file(self, response: QueuedResponse, text: str) -> str:
        folder = self.rt.settings.home / "files" / "outbound" / self.name
        folder.mkdir(parents=True, exist_ok=True)
        path = (
            folder / f"reply-{safe_name(response.message_id)}-{response.id}{self.platform.long_reply_suffix}"
        )
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text + "\n", encoding="utf-8")
            os.replace(tmp, path)
        return str(path)

    async def send_part(self, conversation: str, part: Part) -> str | None:
        """Send one part; a file that is gone is replaced by a short note rather than failing forever.
        Returns the platform's message id, if any."""
        if part.kind == "text":
            return await self.platform.send_text(conversation, part.text)
        if part.roots:
            return await self._send_agent_file(conversation, part)
        path = Path(part.path)
        if not path.is_file():
            return await self.platform.send_text(
                conversation, f"(the file {path.name} is no longer available)"
            )
        return await self.platform.send_file(conversation, path, part.text)

    async def _send_agent_file(self, conversation: str, part: Part) -> str | None:
        """Send a copy of a file the agent attached, made right now with the checks of
        :mod:`shared.file_access` (the agent could have swapped the file for a link, a FIFO or a hard link
        since the reply was planned); a file that fails them is replaced by a note saying why."""
        name = Path(part.path).name
        staging = self.rt.settings.home / "files" / "outbound" / self.name / f"send-{secrets.token_hex(8)}"
        try:
            await call(staging.mkdir, parents=True, mode=0o700)
            roots = [Path(root) for root in part.roots]
            copy, why = await call(copy_for_sending, part.path, roots, staging)
            if copy is None:
                self.log.warning("refused to send %s: %s", part.path, why)
                if why == MISSING:
                    return await self.platform.send_text(
                        conversation, f"(the file {name} is no longer available)"
                    )
                return await self.platform.send_text(
                    conversation, f"(a file the agent attached, {name}, was not sent: {why})"
                )
            return await self.platform.send_file(conversation, copy, part.text)
        finally:
            await call(shutil.rmtree, staging, ignore_errors=True)

    # -- delivering ------------------------------------------------------------------------------------------
    async def deliver(self, response: QueuedResponse) -> bool:
        """Send the unsent parts of one claimed response, recording each as soon as the platform confirmed
        it; ack at the end. Returns True when the response was finished by this call (acked or failed)."""
        meta = response.metadata or {}
        edit_key = str(meta.get("edit_key") or "")
        if meta.get("kind") == "progress" and edit_key:
            return await self.notes.deliver(response, edit_key)
        if meta.get("kind") in QUESTION_KINDS:
            return await self.questions.deliver(response)
        queue = self.rt.queue
        if meta.get("kind") == "final":
            response = await call(self._with_offline_preface, response)
        parts = self.plan(response)
        in_preview = False
        if response.delivered == 0 and not (edit_key and parts and parts[0].kind == "text"):
            # A reply that takes no preview's place (a failure notice): earlier runs' previews are stale.
            await self.previews.close_stale(response, edit_key)
        for index in range(response.delivered, len(parts)):
            if self.stop_event.is_set():
                # Stopping: hand the rest back at once (no attempt charged) instead of waiting for the lease.
                await call(self._give_back, response)
                return False
            preview: TxWork | None = None
            try:
                if index == 0 and edit_key and parts[0].kind == "text":
                    # The run's live preview becomes this part (one message holds the answer); the lock
                    # keeps a preview edit from landing after it.
                    async with self.previews.lock(response.conversation):
                        platform_id, preview = await self._send_over_preview(response, edit_key, parts[0])
                    in_preview = preview is not None
                else:
                    platform_id = await self.send_part(response.conversation, parts[index])
            except Exception as exc:
                return await self._send_failed(response, index, exc)
            last = index == len(parts) - 1
            # The last part, the progress note marked done and the ack are one write: until it commits this
            # reply is its chat's head, so a later note of the same run cannot be sent before it.
            note = (
                await self.notes.closing(response.conversation, edit_key, in_preview=in_preview)
                if last and edit_key
                else None
            )
            if preview is not None:
                note = _both(preview, note)
            held = await call(
                queue.responses.mark_chunk_delivered,
                response.id,
                self.worker,
                index,
                lease_ms=self.lease_ms,
                platform_id=platform_id,
                ack=last,
                also=note,
            )
            if not held:
                self.log.warning("lost response %s to another deliverer after part %s", response.id, index)
                return False
            if last:
                return True
        if edit_key:  # every part was recorded before a restart: only the note and the ack are left
            # Before the ack: until then this reply is its chat's head, so a later note of the same run
            # cannot be claimed (and sent) before the note is marked done.
            await self.notes.close(response.conversation, edit_key)
        return bool(await call(queue.responses.ack_response, response.id, self.worker))

    async def _send_over_preview(
        self, response: QueuedResponse, edit_key: str, part: Part
    ) -> tuple[str | None, TxWork | None]:
        """Send the first part of a run's reply: edited into the run's preview message when there is one
        (returns the write marking the preview done, for the part's record), else sent as a new message."""
        taken = await self.previews.take_for_final(response, edit_key)
        if taken is not None:
            message_id, done = taken
            if await self.platform.edit_reply(response.conversation, message_id, part.text):
                return message_id, done
            self.log.info("preview %s cannot be edited; sending the reply as a new message", edit_key)
            return await self.send_part(response.conversation, part), done
        return await self.send_part(response.conversation, part), None

    def _with_offline_preface(self, response: QueuedResponse) -> QueuedResponse:
        """The reply to a message that reached us only after a restart starts by saying so. Derived from the
        stored message, so the parts stay the same when a restart resumes the delivery."""
        sent_at = late_messages.offline_sent_at(self.rt.db, response.message_id)
        if sent_at is None:
            return response
        return dataclasses.replace(response, message=f"{offline_preface(sent_at)}\n\n{response.message}")

    def _give_back(self, response: QueuedResponse) -> None:
        base = int(self.config.delivery_backoff_base_seconds * 1000)
        self.rt.queue.responses.retry_response_later(
            response.id, self.worker, "", base_ms=base, max_ms=base, count=False
        )

    def failure_explanation(self, failure: SendFailure, *, gave_up: bool = False) -> str:
        """The plain words a user reads about a reply that could not be delivered."""
        label = self.platform.platform_label or self.name.capitalize()
        why = failure.explanation or ("sending kept failing" if gave_up else "it was refused")
        return f"{label}: {why}"

    async def _send_failed(self, response: QueuedResponse, index: int, exc: Exception) -> bool:
        failure = self.platform.classify_send_error(exc)
        queue = self.rt.queue
        silent = (response.metadata or {}).get("kind") in _SILENT_FAILURE_KINDS
        explanation = None if silent else self.failure_explanation(failure)
        if failure.permanent:
            self.log.error(
                "%s refused part %s of response %s to %s for good: %s",
                self.name,
                index,
                response.id,
                response.conversation,
                failure.reason,
            )
            return bool(
                await call(
                    queue.responses.fail_response,
                    response.id,
                    failure.reason,
                    worker=self.worker,
                    explanation=explanation,
                )
            )
        # A wait the platform asked for (Retry-After) is the least one: backoff with jitter takes at most
        # half off its ceiling, so a ceiling of twice the wait never retries early.
        asked_ms = int(failure.retry_after_seconds * 2000)
        retried = await call(
            queue.responses.retry_response_later,
            response.id,
            self.worker,
            failure.reason,
            base_ms=max(int(self.config.delivery_backoff_base_seconds * 1000), asked_ms),
            max_ms=max(int(self.config.delivery_backoff_max_seconds * 1000), asked_ms),
            max_attempts=self.config.delivery_attempts,
            explanation=None if silent else self.failure_explanation(failure, gave_up=True),
        )
        if retried is None:
            return False  # another deliverer holds it now
        if retried.failed:
            # The platform kept failing: the reply is undeliverable, and says so — it is not "delivered".
            self.log.error(
                "giving up on response %s after %s attempts: %s",
                response.id,
                retried.attempts,
                failure.reason,
            )
            return True
        self.log.warning(
            "sending part %s of response %s to %s failed (attempt %s of %s), retrying in %.1f s: %s",
            index,
            response.id,
            response.conversation,
            retried.attempts,
            self.config.delivery_attempts,
            max(0, retried.due - now_ms()) / 1000,
            failure.reason,
        )
        return False

    # -- the loop --------------------------------------------------------------------------------------------
    async def deliver_claimed(self, response: QueuedResponse) -> bool:
        """:meth:`deliver` with the lease renewed meanwhile; never raises (a failure is logged and the
        response comes back when its lease runs out)."""
        renewer = asyncio.create_task(self._renew_lease(response.id))
        try:
            return await self.deliver(response)
        except Exception:
            self.log.exception("delivering response %s failed", response.id)
            return False
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer

    async def _renew_lease(self, response_id: int) -> None:
        interval = max(0.05, self.lease_ms / 3000)
        while True:
            await asyncio.sleep(interval)
            try:
                held = await call(
                    self.rt.queue.responses.renew_response_lease,
                    response_id,
                    self.worker,
                    lease_ms=self.lease_ms,
                )
            except Exception as exc:  # a busy database: the next renewal tries again
                self.log.info("renewing the lease of response %s failed: %s", response_id, exc)
                continue
            if not held:
                return

    async def _claim(self, limit: int) -> list[QueuedResponse]:
        return await call(
            self.rt.queue.responses.claim_responses_for_channel,
            self.name,
            self.worker,
            limit=limit,
            lease_ms=self.lease_ms,
        )

    async def deliver_once(self) -> int:
        """Claim one batch (at most one response per chat) and deliver it, chats side by side; returns how
        many were claimed."""
        claimed = await self._claim(self.config.delivery_batch)
        await asyncio.gather(*(self.deliver_claimed(r) for r in claimed))
        return len(claimed)

    async def loop(self) -> None:
        """Deliver until stopped. Each claimed response is delivered in its own task, and a free slot is
        refilled as soon as a task ends, so a chat that is slow or backing off never holds up the others.
        Wakes on database changes, with the slow poll as the fallback."""
        waker = self.rt.waker
        running: dict[int, asyncio.Task[bool]] = {}
        pruned_at = 0.0
        try:
            while not self.stop_event.is_set():
                generation = waker.generation
                free = self.config.delivery_batch - len(running)
                if free > 0:
                    try:
                        claimed = await self._claim(free)
                    except Exception:
                        self.log.exception("claiming responses failed; retrying")
                        claimed = []
                        await asyncio.sleep(1.0)
                    for response in claimed:
                        running[response.id] = asyncio.create_task(
                            self.deliver_claimed(response), name=f"{self.name}-deliver-{response.id}"
                        )
                if time.monotonic() - pruned_at > RECORD_PRUNE_INTERVAL_S:
                    pruned_at = time.monotonic()
                    await self._prune_records()
                if self.stop_event.is_set():
                    break
                wake = asyncio.create_task(waker.wait_async(generation, self.poll_interval))
                done, _ = await asyncio.wait({wake, *running.values()}, return_when=asyncio.FIRST_COMPLETED)
                if wake not in done:
                    wake.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await wake
                for rid, task in list(running.items()):
                    if task.done():
                        del running[rid]
        finally:
            # Let the parts in flight finish: each task hands its response back at the next part.
            if running:
                await asyncio.wait(running.values(), timeout=4)
                for task in running.values():
                    task.cancel()

    async def _prune_records(self) -> None:
        try:
            await call(self.rt.queue.responses.prune_delivery_records, self.name)
            await call(dedupe.prune, self.rt.db, self.name)
        except Exception as exc:
            self.log.info("forgetting old delivery records failed: %s", exc)

    async def run_until_idle(self, timeout: float = 30.0) -> int:
        """Deliver until nothing claimable is left (tests); returns how many responses were claimed."""
        total = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            claimed = await self.deliver_once()
            total += claimed
            if claimed == 0:
                return total
        return total

    # -- typing ----------------------------------------------------------------------------------------------
    def busy_conversations(self) -> list[str]:
        """Chats of this channel with a message being processed, or pending soon for an unpaused agent."""
        return lookups.busy_conversations(self.rt.db, self.name, now_ms(), TYPING_HORIZON_MS)

    async def typing_loop(self) -> None:
        """Keep the typing indicator up in busy chats, refreshed every ``typing_interval_seconds`` for as
        long as the chat stays busy (a platform shows it only for a few seconds per call)."""
        waker = self.rt.waker
        interval = self.config.typing_interval_seconds
        shown: dict[str, float] = {}
        while not self.stop_event.is_set():
            generation = waker.generation
            try:
                busy = await call(self.busy_conversations)
            except Exception:
                self.log.exception("cannot read busy chats")
                busy = []
            now = time.monotonic()
            for conversation in busy:
                if now - shown.get(conversation, -interval) >= interval:
                    shown[conversation] = now
                    try:
                        await self.platform.send_typing(conversation)
                    except Exception as exc:
                        self.log.debug("typing in %s failed: %s", conversation, exc)
            for conversation in list(shown):
                if conversation not in busy:
                    del shown[conversation]
            # Sleep until the next refresh is due (not a whole interval after a wake-up), or a change.
            due = min((t + interval for t in shown.values()), default=now + self.poll_interval)
            timeout = max(0.05, min(self.poll_interval, due - time.monotonic()))
            await waker.wait_async(generation, timeout)
            await asyncio.sleep(0.2)  # a busy database wakes us often; typing needs no faster pace
