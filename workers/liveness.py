"""Watching one run while it goes on: ``/stop``, interrupting arrivals, "still working" notes, ``/status``.

A :class:`RunWatch` runs beside each CLI invocation. It wakes on every database change (the waker) and at
least every ``[processor] control_interval_seconds`` (at most five times a second), and then:

- takes a stop request from the agent's lease row (:meth:`shared.queue.control.Control.take_stop_request`, written by
  ``/stop``). One naming this run's chat (``<channel>:<conversation>``) or ``*`` stops the run: its CLI
  process group is killed and its messages complete with a short "stopped" reply. A request naming another
  chat is handed to the processor, which completes that chat's waiting messages the same way.
- under the ``interrupt`` policy, looks for a message of this chat that became available: it stops the run
  so the next one carries everything (:mod:`workers.busy`).
- under the ``steer`` policy, in a run that can take more messages (:attr:`RunInfo.steer`), claims the
  chat's messages that became available and hands them to the run (:mod:`workers.steer`) through
  ``on_steer`` (:meth:`RunWatch.steer`).
- every ``progress_note_seconds`` enqueues a "still working — 6 min, last step: …" note to the chat, with
  metadata ``{"kind": "progress", "edit_key": RUN_ID}`` so a channel can edit one message in place; the
  final reply carries ``{"kind": "final", "edit_key": RUN_ID}``.
- sends a notice the provider reported (:attr:`RunInfo.notice`: the AI service is overloaded and the CLI
  retries) as such a note at once, not at the next "still working" time.
- refreshes the run record :func:`shared.reads.conversation_status.conversation_status` reads (last step).
- tells a chat whose message waits behind this run — the run's own chat or another of the agent's — once
  per run, that it is queued and how the chat's busy policy will handle it (:func:`shared.notices.busy_note`;
  ``[channels.<name>] busy_notice = false`` turns it off). It is a note (``kind: progress``) with its own
  edit key, never the message's final reply.

Idle and ceiling timeouts are the provider's (:mod:`workers.providers`): they need the CLI's output.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import anyio

from shared.aio import call
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.log import PendingEvent
from shared.notices import busy_note
from shared.queue.core import INTERNAL_CHANNELS, QueuedMessage
from shared.reads.conversation_status import format_duration, update_run_step
from shared.runtime import Runtime
from shared.settings.busy_policy import BusyPolicy
from workers.busy import WorkGroup, busy_notice_on, resolve_policy
from workers.steer import SteerInbox
from workers.teams import origin_of

log = logging.getLogger("agentpost.processor")

#: Never check the database more often than this, however busy it is.
MIN_CHECK_SECONDS = 0.2
#: A running agent's progress events reach the event log at least this often (batched in between).
PROGRESS_EVENTS_SECONDS = 1.0
#: A run records at most this many ``agent_progress`` events, holding at most this many characters of text in
#: all, each at most ``PROGRESS_TEXT_CHARS``: a run printing 20 MB (200,000 lines) must not write 200,000 rows.
#: Steps reported close together share one event (their lines joined) while it has room; past the bounds the
#: lines are counted, and one last event of the run says how many were not recorded.
PROGRESS_MAX_EVENTS = 200
PROGRESS_MAX_CHARS = 100_000
PROGRESS_TEXT_CHARS = 4000


@dataclass
class RunInfo:
    """One run in progress: what the watch reports on, and why it stopped the run (if it did)."""

    agent: str
    run_id: str
    group: WorkGroup
    started_ms: int = field(default_factory=now_ms)
    started: float = field(default_factory=time.monotonic)
    last_step: str = ""
    last_step_at: int = 0
    stored_step: str = ""
    notes: int = 0
    pid: int | None = None  # the CLI's pid (= its process group), known once it is spawned
    notice: str = ""  # the latest notice for the chat (RunRequest.on_notice); sent by the watch
    notice_sent: str = ""
    reason: str = ""  # "stop" or "interrupt" when the watch ended the run
    # The key the run's notes and its final reply share (so a channel edits one note in place). A retry
    # continues the "trying again" note of its message instead of starting a new one.
    edit_key: str = ""
    #: ``agent_progress`` events not written yet: at most one write per ``PROGRESS_EVENTS_SECONDS`` while
    #: the run goes on, the rest with the run's end (a short run's steps cost no transaction of their own).
    pending_events: list[PendingEvent] = field(default_factory=list)
    events_written: float = field(default_factory=time.monotonic)
    #: Where messages steered into this run go (the ``steer`` policy, a claude run); None: it takes none.
    steer: SteerInbox | None = None
    #: The run's progress events so far, their text, and the lines left out past the bounds (see above).
    progress_events: int = 0
    progress_chars: int = 0
    progress_omitted: int = 0
    #: How long after the run's start the CLI printed its first text (ms; None: none yet), for the end event.
    first_text_ms: int | None = None

    def __post_init__(self) -> None:
        self.edit_key = self.edit_key or self.run_id

    def add_progress_event(self, event: PendingEvent) -> bool:
        """Keep ``event`` (an ``agent_progress`` one, its text in ``payload["text"]``) for writing, within the
        run's bounds: joined to the last pending one while their text fits one event, a new one while the
        run has events left, else only counted (:meth:`close_progress`). True when the pending events are
        due now."""
        text = str(event.payload.get("text", ""))[:PROGRESS_TEXT_CHARS]
        lines = text.count("\n") + 1
        last = self.pending_events[-1] if self.pending_events else None
        if self.progress_omitted or self.progress_chars + len(text) + 1 > PROGRESS_MAX_CHARS:
            self.progress_omitted += lines
        elif (
            last is not None
            and last.type == event.type
            and len(last.payload.get("text", "")) + 1 + len(text) <= PROGRESS_TEXT_CHARS
        ):
            last.payload["text"] = f"{last.payload['text']}\n{text}"
            self.progress_chars += len(text) + 1  # with the newline joining it
        elif self.progress_events >= PROGRESS_MAX_EVENTS:
            self.progress_omitted += lines
        else:
            self.pending_events.append(
                PendingEvent(event.type, {**event.payload, "text": text}, event.message_id, event.topic)
            )
            self.progress_events += 1
            self.progress_chars += len(text) + 1  # with the newline joining it
        return bool(self.pending_events) and time.monotonic() - self.events_written >= PROGRESS_EVENTS_SECONDS

    def close_progress(self) -> None:
        """At the run's end: the one event saying how many lines of progress were not recorded, if any."""
        if not self.progress_omitted:
            return
        omitted, self.progress_omitted = self.progress_omitted, 0
        ids = self.group.ids
        text = f"… {omitted:,} more line{'s' if omitted != 1 else ''} not recorded"
        payload = {
            "agent": self.agent,
            "text": text,
            "message_ids": ids,
            "run_id": self.run_id,
            "omitted": omitted,
        }
        self.pending_events.append(
            PendingEvent("agent_progress", payload, ids[0] if ids else None, "progress")
        )

    def take_events(self) -> list[PendingEvent]:
        """The pending events, oldest first, now counted as written."""
        taken, self.pending_events = self.pending_events, []
        self.events_written = time.monotonic()
        return taken

    def saw_text(self, text: str) -> None:
        """The CLI printed ``text`` (a step, or the reply streaming in): the first that is not blank sets
        :attr:`first_text_ms`."""
        if self.first_text_ms is None and text.strip():
            self.first_text_ms = max(0, now_ms() - self.started_ms)

    def spawned(self, pid: int) -> None:
        """``RunRequest.on_spawn``: remember the CLI's pid (for events about a run stopped mid-way)."""
        self.pid = pid

    def tell(self, text: str) -> None:
        """``RunRequest.on_notice``: a notice for the chat, sent as a progress note by the watch within a
        check interval; it is the run's last step too (``/status``, later "still working" notes)."""
        self.notice = text
        self.step(text)

    def step(self, text: str) -> None:
        """Remember the latest progress text (its first non-empty line) as the run's last step."""
        line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        if line:
            self.last_step = line[:300]
            self.last_step_at = now_ms()


def note_target(message: QueuedMessage) -> ChatAddress | None:
    """Where notes about a run for ``message`` go: its chat, or the user chat a teammate's chain started
    from; ``None`` for agentpost's own channels (heartbeats, schedules, chains without an origin)."""
    origin = origin_of(message)
    if origin is None or origin["channel"] in INTERNAL_CHANNELS:
        return None
    return ChatAddress.of(origin)


def progress_text(elapsed_ms: int, last_step: str) -> str:
    """``Still working — 6 min, last step: …``."""
    text = f"Still working — {format_duration(elapsed_ms)}"
    step = " ".join(last_step.split())
    return text + (f", last step: {step[:160]}{'…' if len(step) > 160 else ''}" if step else "")


class RunWatch:
    """The watcher of one run (see the module docstring). ``on_foreign_stop`` receives stop requests that
    name another chat of the same agent."""

    def __init__(
        self,
        rt: Runtime,
        worker: str,
        info: RunInfo,
        *,
        control_interval: float,
        note_seconds: float,
        on_foreign_stop: Callable[[str], None],
        default_policy: BusyPolicy = "collect",
        on_steer: Callable[[list[QueuedMessage]], Awaitable[None]] | None = None,
        claiming: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        self.rt = rt
        self.worker = worker
        self.info = info
        self.control_interval = control_interval
        self.note_seconds = note_seconds
        self.on_foreign_stop = on_foreign_stop
        self.default_policy = default_policy
        self.target = note_target(info.group.messages[0])
        #: The chats told during this run that their message waits behind it.
        self.told: set[tuple[str, str]] = set()
        #: Receives the messages claimed into the run (see :meth:`steer`).
        self.on_steer = on_steer
        #: Around a claim into the run, until the run holds what it took (the processor's sweep of claims no
        #: run holds must not take them back in between).
        self.claiming = claiming

    async def run(self, scope: anyio.CancelScope) -> None:
        """Watch until the run ends (the caller cancels this) or the watch stops it (cancels ``scope``)."""
        while True:
            generation = self.rt.waker.generation
            try:
                reason = await call(self.check)
            except Exception as exc:  # a database hiccup: the run goes on; try again shortly
                log.warning("agent %s: run watch: %s", self.info.agent, exc)
                reason = ""
            if not reason:
                await self.steer()
            if reason:
                self.info.reason = reason
                scope.cancel()
                return
            await self._write_due_events()
            timeout = self.control_interval
            if self.note_seconds > 0 and self.target is not None:
                due = self.info.started + self.note_seconds * (self.info.notes + 1)
                timeout = min(timeout, max(0.0, due - time.monotonic()))
            await self.rt.waker.wait_async(generation, max(MIN_CHECK_SECONDS, timeout))
            await anyio.sleep(MIN_CHECK_SECONDS)

    async def steer(self) -> None:
        """Under ``steer``, while the run takes messages: claim the chat's new ones into the run and hand
        them to ``on_steer``. Shielded, so what was claimed reaches the run (or the agent's next run) even
        when the run ends meanwhile and cancels this watch."""
        info, on_steer = self.info, self.on_steer
        if info.steer is None or info.steer.closed or info.group.policy != "steer" or on_steer is None:
            return
        claim = self.rt.queue.messages.claim_chat_into_run
        with anyio.CancelScope(shield=True), self.claiming():
            try:
                steered = await call(
                    claim, info.agent, self.worker, info.group.messages[0].address, info.run_id
                )
            except Exception as exc:  # a database hiccup: they wait for the next check or run
                log.warning("agent %s: could not take new messages into the run: %s", info.agent, exc)
                return
            if steered:
                await on_steer(steered)

    async def _write_due_events(self) -> None:
        # A step reported and then a long silence: its event must not wait for the run's end. Taken here, in
        # the event loop's thread like the progress callback that adds them, so none is lost between the two.
        info = self.info
        if info.pending_events and time.monotonic() - info.events_written >= PROGRESS_EVENTS_SECONDS:
            events = info.take_events()
            try:
                await call(self.rt.events.append_many, events)
            except Exception as exc:  # observability: the run goes on
                log.warning("agent %s: could not write %d progress events: %s", info.agent, len(events), exc)

    def check(self) -> str:
        """One round of checks (in a worker thread); returns why to stop the run, or ``""``."""
        info = self.info
        chat = info.group.chat
        taken = self.rt.queue.control.take_stop_request(info.agent, self.worker)
        if taken in ("*", chat):
            return "stop"
        if taken:
            self.on_foreign_stop(taken)
        self._tell_waiting()
        arrival = self.rt.queue.control.chat_has_arrival
        if info.group.policy == "interrupt" and arrival(info.agent, info.group.messages[0].address):
            return "interrupt"
        elapsed = time.monotonic() - info.started
        if (
            self.note_seconds > 0
            and self.target is not None
            and elapsed >= self.note_seconds * (info.notes + 1)
        ):
            self._send_note(int(elapsed * 1000))
        if info.notice != info.notice_sent and self.target is not None:
            info.notice_sent = info.notice
            self._send_note(int(elapsed * 1000), info.notice)
        if info.last_step != info.stored_step:
            info.stored_step = info.last_step
            update_run_step(self.rt.db, info.agent, info.run_id, info.last_step, info.last_step_at)
        return ""

    def _send_note(self, elapsed_ms: int, text: str = "") -> None:
        info, target = self.info, self.target
        assert target is not None
        # Count the note first: a failure to queue one must not make every later check retry it at once.
        if not text:
            info.notes = int(elapsed_ms / 1000 / self.note_seconds)
        primary = info.group.messages[0]
        self.rt.queue.responses.enqueue_response(
            target,
            text or progress_text(elapsed_ms, info.last_step),
            agent=info.agent,
            metadata={"kind": "progress", "edit_key": info.edit_key, "agent": info.agent, "note": info.notes},
            message_id=primary.message_id,
        )

    def _tell_waiting(self) -> None:
        """Send the busy note to each chat with a message newly waiting behind this run (once per run)."""
        info = self.info
        try:
            arrivals = self.rt.queue.control.waiting_arrivals(info.agent)
        except Exception as exc:  # a note is a courtesy: the run goes on
            log.warning("agent %s: could not look for waiting messages: %s", info.agent, exc)
            return
        for message_id, address in arrivals:
            key = address.key
            if key in self.told or address.channel in INTERNAL_CHANNELS:
                continue
            if key == info.group.key and info.steer is not None and not info.steer.closed:
                continue  # taken into this run at once (steer), with a note of its own
            # Counted first: a note that cannot be queued is not retried on every check.
            self.told.add(key)
            settings = self.rt.settings
            if not busy_notice_on(settings, address.channel):
                continue
            try:
                policy = (
                    info.group.policy
                    if key == info.group.key
                    else resolve_policy(self.rt.db, settings, self.default_policy, address)
                )
                if policy == "steer" and (key != info.group.key or info.steer is None):
                    policy = "collect"  # it cannot join this run: it waits for the chat's next one
                same_chat = self.target is not None and key == self.target.key
                self.rt.queue.responses.enqueue_response(
                    address,
                    busy_note(info.agent, policy, same_chat=same_chat),
                    agent=info.agent,
                    metadata={
                        "kind": "progress",
                        "note": "busy",
                        "edit_key": f"busy_{message_id}",
                        "agent": info.agent,
                        "policy": policy,
                        "run_id": info.run_id,
                    },
                    message_id=message_id,
                )
            except Exception as exc:
                log.warning("agent %s: could not queue the busy note for %s: %s", info.agent, message_id, exc)
