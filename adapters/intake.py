"""The intake of the channel runner: every inbound message a platform hands over, taken in durably.

- an allowlist or pairing check (unknown senders get a one-time code and their message is kept, not queued,
  until the operator approves them: :mod:`adapters.pairing`, :mod:`shared.chat.held`);
- chat commands and a sticky default agent per chat (:mod:`adapters.chat_commands`: ``/agent``, ``/team``,
  ``/reset``, ``/status``, ``/stop``, ``/queue``, ``/help``…; ``@agent`` alone switches, ``@default``
  clears);
- then ``enqueue_message`` with the platform's message id as ``external_id`` (a redelivered message is
  reported as a duplicate, not queued twice — also after the message row was pruned: the ids taken in are
  remembered for longer than any platform redelivers, :mod:`shared.chat.dedupe`) and the chat debounce
  (``[queue] debounce_ms``: a burst of quick messages becomes one run).

:meth:`Intake.handle` returns only after the message is committed, so a platform delivery is acknowledged
(an offset confirmed, a webhook answered) only then. A command's answer commits with the message's seen mark
and the plugin's cursor in the same way, so a crash never answers it twice. While the database is away (a
server restarting, a lock, a full disk), :meth:`Intake.handle` waits and tries again
(:meth:`Intake.until_stored`) instead of dropping the update.

Replies that could not be delivered: when a user whose earlier reply failed for good (the platform refused
it) writes again, a short note saying so is queued first, in that chat — the path that works. Replies to
commands and pairing codes go through the same responses table as agents' replies, so they are durable too.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from adapters import pairing as pairings
from adapters.approval_prompts import answer_press
from adapters.chat_commands import COMMANDS, IN_TRANSACTION, ChatCommands
from adapters.platform import HandleOutcome, Inbound, Press, PressOutcome
from adapters.voice import VoiceNotes
from shared.aio import call
from shared.chat import dedupe, held
from shared.chat.address import ChatAddress
from shared.chat.kept_values import keep_value_in, kept_value
from shared.clock import now_ms
from shared.inbound_media import IMAGES_KEY, describe_files
from shared.queue.core import TxWork, UnknownMention
from shared.reads.late_messages import OFFLINE_SENT_AT
from shared.storage.db import Tx
from shared.storage.errors import transient_problem

if TYPE_CHECKING:
    from adapters.platform import Platform

_T = TypeVar("_T")
#: Longest pause between two tries to reach a database that is away.
_STORAGE_RETRY_MAX_SECONDS = 5.0
_COMMAND_RE = re.compile(r"^/(?P<name>[A-Za-z_]+)(?:@[A-Za-z0-9_]+)?(?:\s+(?P<args>.*))?$", re.DOTALL)
_MENTION_ONLY_RE = re.compile(r"^@(?P<name>[A-Za-z0-9][A-Za-z0-9_-]{0,31})$")

#: How long messages of a sender nobody approves are kept (their code expires after an hour).
HELD_FOR_MS = 24 * 3_600_000
APPROVED_TEXT = "You're approved — answering your message now."


def pairing_reminder_text(kept: bool) -> str:
    """The occasional reminder to a sender still waiting for approval. It never repeats the code: it may be
    posted where others read (a guild channel), while the code went privately."""
    kept_text = "I've kept this message and will answer it" if kept else "I'll answer your first messages"
    return f"Still waiting for the operator to approve your pairing code. {kept_text} once they do."


class Intake:
    """Takes in what one platform receives (a part of :class:`adapters.runner.ChannelRunner`).

    Given the platform (its name, settings section and pairing-code routing), the chat commands, the queue
    poll interval (the pairing loop's fallback) and the runner's stop event (a wait for the database ends
    when the channel stops)."""

    def __init__(
        self,
        platform: Platform,
        commands: ChatCommands,
        *,
        poll_interval: float,
        stop_event: asyncio.Event,
    ) -> None:
        self.platform = platform
        self.rt = platform.rt
        self.name = platform.name
        self.config = platform.config
        self.commands = commands
        #: Set when the channel stops: receive loops end, waits for the database give up.
        self.stop_event = stop_event
        self.log = platform.log
        self.poll_interval = poll_interval
        #: Messages with a recording: heard by the speech-to-text service before they are queued.
        self.voice = VoiceNotes(self, poll_seconds=poll_interval)

    async def handle(self, message: Inbound, *, also: TxWork | None = None) -> HandleOutcome:
        """Authorise, run commands, or queue one inbound message; returns once the outcome is committed.

        While the database is away it waits and tries again (:meth:`until_stored`): a plugin acknowledges
        an update to its platform only after this returns, so an update is never dropped, nor confirmed
        before it is stored.

        ``also(tx)`` is written in the transaction that queues the message or its answer (a plugin's
        cursor, so the update and what it caused commit together); it is not called for a message that is
        neither queued nor answered (ignored, a duplicate, a sender waiting for pairing).

        A message with a recording is stored for :attr:`voice` to hear, and queued with its words."""
        if VoiceNotes.wanted(message):
            return await self.voice.take_in(message, also)
        return await self.until_stored(
            lambda: call(self.handle_sync, message, also=also), f"taking in message {message.external_id}"
        )

    async def until_stored(self, work: Callable[[], Awaitable[_T]], what: str) -> _T:
        """``await work()``; while it fails on storage trouble (:func:`shared.storage.errors.transient_problem`:
        a server restarting or unreachable, a lock, a full disk), wait with a doubling pause and run it
        again, up to :attr:`storage_wait_seconds` or until the adapter is stopped — then raise. ``work``
        must be safe to run again: it is one transaction, or checks what an earlier try committed (an
        update already taken in is a duplicate). Other errors are raised at once."""
        limit = self.platform.storage_wait_seconds
        deadline = None if limit is None else time.monotonic() + limit
        pause = 0.25
        waiting = False
        while True:
            try:
                result = await work()
            except Exception as exc:
                problem = transient_problem(exc, self.rt.db.url)
                if problem is None or self.stop_event.is_set():
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                if not waiting:  # once per wait, not per try: an outage is one event for the operator
                    self.log.warning("%s: %s; waiting for the database", what, problem.describe())
                    waiting = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), pause)
                pause = min(pause * 2, _STORAGE_RETRY_MAX_SECONDS)
                continue
            if waiting:
                self.log.info("%s: done, the database is back", what)
            return result

    # -- what a plugin keeps for itself ------------------------------------------------------------------
    async def saved(self, key: str) -> str | None:
        """A value the plugin keeps for itself (:meth:`adapters.platform.Inbox.saved`)."""
        own = self.platform.state_scope
        return await self.until_stored(
            lambda: call(kept_value, self.rt.db, self.name, key, own_scope=own), f"reading the kept {key}"
        )

    def saving(self, key: str, value: str) -> TxWork:
        """The write of a kept value, committed with a message (:meth:`adapters.platform.Inbox.saving`)."""
        channel, own = self.name, self.platform.state_scope

        def write(tx: Tx) -> None:
            keep_value_in(tx, channel, key, value, own_scope=own)

        return write

    async def save(self, key: str, value: str) -> None:
        """Keep a value on its own (:meth:`adapters.platform.Inbox.save`)."""
        await self.until_stored(
            lambda: call(self.rt.db.run_transaction, self.saving(key, value)), f"keeping {key}"
        )

    async def press(self, press: Press) -> PressOutcome:
        """A button of a question was pressed (:meth:`adapters.platform.Inbox.press`): the answer applied
        (:mod:`adapters.approval_prompts`), what it did returned."""
        return await self.until_stored(
            lambda: call(answer_press, self.rt, self.name, press), f"answering request {press.data}"
        )

    def handle_sync(self, message: Inbound, *, also: TxWork | None = None) -> HandleOutcome:
        """:meth:`handle` in the calling thread (blocking database work)."""
        db = self.rt.db
        text = message.text.strip()
        # Images the model can take are shown to it too (by the processor, from the metadata).
        refs, images = describe_files(message.files)
        if not text and not refs:
            return "ignored"
        if not self.authorised(message.sender_id):
            if not self.config.pairing:
                self.log.info("ignored a message from %s (not on the allowlist)", message.sender_id)
                return "ignored"
            check = pairings.check_sender(
                db,
                self.name,
                message.sender_id,
                message.sender,
                max_pending=self.config.pairing_max_pending,
            )
            if check.decision != "approved":
                return self._while_unpaired(message, check)
        if self._seen(message.external_id):
            return "duplicate"  # a redelivery of a message taken in before (even one pruned since)
        self._tell_undelivered(message)
        # A chat-answered message (a command, ``@agent`` alone, ``@nosuch …``) is taken in like a queued
        # one: its answer, its seen mark and the plugin's cursor commit together, so a crash can neither
        # answer it twice (answer kept, update handed over again) nor lose the answer (update confirmed).
        taken_in = self._commits_with_message(message.external_id, also)
        command = _COMMAND_RE.match(text)
        if command and command.group("name").lower() in COMMANDS:
            name, args = command.group("name").lower(), (command.group("args") or "").strip()
            if name in IN_TRANSACTION:
                # Its effect, its answer and the seen mark commit together: a crash leaves all or none.
                def effect_and_answer(tx: Tx) -> None:
                    answer = self.commands.run_command_in(tx, message, name, args)
                    self.reply_in(tx, message.address_on(self.name), answer, kind="command")
                    taken_in(tx)

                self.rt.db.run_transaction(effect_and_answer)
                return "command"
            self.reply(message, self.commands.run_command(message, name, args), kind="command", also=taken_in)
            return "command"
        switch = _MENTION_ONLY_RE.match(text)
        if switch and not refs:
            switched = self.commands.switch(message, switch.group("name").lower())
            if switched is not None:
                self.reply(message, switched, kind="command", also=taken_in)
                return "command"
        body = "\n".join([text, *refs]) if text else "\n".join(refs)
        agent = self.commands.sticky_for(message.address_on(self.name), text)
        metadata = dict(message.metadata)
        if images:
            metadata[IMAGES_KEY] = images
        if message.sent_at and now_ms() - message.sent_at > self.config.late_message_seconds * 1000:
            metadata[OFFLINE_SENT_AT] = message.sent_at  # the final reply will say it arrived while offline
        try:
            result = self.rt.queue.intake.enqueue_message(
                ChatAddress(
                    self.name, message.sender, sender_id=message.sender_id, conversation=message.conversation
                ),
                body,
                external_id=message.external_id,
                metadata=metadata,
                agent=agent,
                prefix=self.platform.prefix or self.name,
                debounce_ms=self.rt.settings.queue.debounce_ms if self.config.debounce else 0,
                also=taken_in,
            )
        except UnknownMention as exc:  # "@nosuch hi": answered with the names we know, nothing queued
            self.reply(
                message, self.commands.unknown_mention_reply(message, exc), kind="command", also=taken_in
            )
            return "command"
        return "duplicate" if result.duplicate else "queued"

    def _commits_with_message(self, external_id: str, also: TxWork | None) -> TxWork:
        """What commits with a queued message or a chat's answer: the platform id marked seen (commands
        are not queue messages, and queued ones are pruned a day after completion, so the queue's duplicate
        check alone cannot catch every redelivery; this record outlives both), and the plugin's own record."""

        def write(tx: Tx) -> None:
            dedupe.remember_in(tx, self.name, external_id)
            if also is not None:
                also(tx)

        return write

    def _while_unpaired(self, message: Inbound, check: pairings.PairingCheck) -> HandleOutcome:
        """Keep the message for when the sender is approved; give the code once, remind now and then."""
        kept = held.hold(self.rt.db, self.name, message.sender_id, message.held_record())
        if check.decision == "new_code":
            for address, text, kind in self.platform.pairing_replies(message, check.code):
                self.reply_to(address, text, kind=kind)
            self._tell_operator(message, check.code)
            return "pairing_code"
        if check.decision == "pending" and held.remind_due(self.rt.db, self.name, message.sender_id):
            self.reply(message, pairing_reminder_text(kept), kind="pairing")
        self.log.info("unpaired sender %s (%s): message kept=%s", message.sender_id, check.decision, kept)
        return "unpaired"

    def _tell_operator(self, message: Inbound, code: str) -> None:
        chat = self.config.operator_chat
        if not chat:
            return
        who = f"{message.sender} ({message.sender_id})" if message.sender else message.sender_id
        self.reply_to(
            ChatAddress(self.name, conversation=chat),
            f"New pairing request on {self.name} from {who}. To let them in: agentpost pairing approve {code}",
            kind="pairing_request",
        )

    def release_approved(self) -> int:
        """Answer the messages of senders approved since they wrote (told first that they are in). Returns
        how many messages were taken back in."""
        taken = 0
        for sender_id, kept in held.approved_with_held(self.rt.db, self.name).items():
            # In the order they were written (an adapter may have taken two in side by side); platform ids
            # are numbers on most platforms, so shorter ones are older at the same millisecond.
            messages = sorted(
                (Inbound.from_held(sender_id, item) for item in kept),
                key=lambda m: (m.sent_at, len(m.external_id), m.external_id),
            )
            many = APPROVED_TEXT.replace("message", f"{len(messages)} messages")
            self.reply(messages[0], APPROVED_TEXT if len(messages) == 1 else many, kind="pairing")
            for message in messages:
                self.handle_sync(message)
                taken += 1
            held.release(self.rt.db, self.name, sender_id)
        return taken

    async def pairing_loop(self) -> None:
        """Take back held messages as soon as their senders are approved (an approval is a database
        change, so the waker notices it; the poll is the fallback)."""
        waker = self.rt.waker
        pruned_at = 0.0
        while not self.stop_event.is_set():
            generation = waker.generation
            try:
                await call(self.release_approved)
                if time.monotonic() - pruned_at > 3600:
                    pruned_at = time.monotonic()
                    await call(held.prune_held, self.rt.db, self.name, now_ms() - HELD_FOR_MS)
            except Exception as exc:
                problem = transient_problem(exc, self.rt.db.url)
                if problem is None:
                    self.log.exception("taking back messages of approved senders failed; retrying")
                else:  # a database that is away is not a bug: one line, not a traceback per poll
                    self.log.warning("taking back messages of approved senders: %s", problem.describe())
            await waker.wait_async(generation, self.poll_interval)

    async def may_download(self, sender_id: str) -> bool:
        """Whether to fetch a sender's attachments: not for strangers (they only get a pairing code)."""
        return await self.until_stored(
            lambda: call(self.authorised, sender_id), f"checking sender {sender_id}"
        )

    def authorised(self, sender_id: str) -> bool:
        """Allowlisted (or ``*``) senders skip pairing; others must be paired."""
        allow = self.config.allowlist
        if "*" in allow or sender_id in allow:
            return True
        return pairings.is_approved(self.rt.db, self.name, sender_id)

    def reply(self, message: Inbound, text: str, *, kind: str, also: TxWork | None = None) -> None:
        """Queue a reply of the channel itself (a command answer, a pairing code) for delivery; ``also(tx)``
        commits with it."""
        self.reply_to(message.address_on(self.name), text, kind=kind, also=also)

    def reply_to(self, address: ChatAddress, text: str, *, kind: str, also: TxWork | None = None) -> None:
        """Queue a message of the channel itself to ``address`` (durable like any reply); ``kind`` goes in
        its metadata, ``also(tx)`` commits with it."""
        self.rt.db.run_transaction(lambda tx: self.reply_in(tx, address, text, kind=kind, also=also))

    def reply_in(
        self, tx: Tx, address: ChatAddress, text: str, *, kind: str, also: TxWork | None = None
    ) -> None:
        """:meth:`reply_to` inside the caller's transaction (the reply commits with what it tells of)."""
        self.rt.queue.responses.enqueue_response_in(
            tx,
            ChatAddress(
                address.channel,
                address.sender,
                sender_id=address.sender_id,
                conversation=address.conversation,
            ),
            text,
            metadata={"kind": kind},
        )
        if also is not None:
            also(tx)

    def _seen(self, external_id: str) -> bool:
        return dedupe.is_seen(self.rt.db, self.name, external_id)

    def _tell_undelivered(self, message: Inbound) -> None:
        """Queue a note about replies of this chat that could not be delivered, before anything else the
        user gets now (they wrote, so this chat works again). The notices are removed in the transaction
        that queues the notes: a crash between would lose them, or tell them twice."""
        queue = self.rt.queue
        chat = message.address_on(self.name)
        if not queue.responses.has_undelivered_notices(chat):
            return

        def take_and_tell(tx: Tx) -> None:
            for notice in queue.responses.take_undelivered_notices_in(tx, chat):
                at = datetime.fromtimestamp(notice.created_at / 1000, UTC).strftime("%H:%M UTC")
                self.reply_in(
                    tx,
                    chat,
                    f"My reply to your message at {at} could not be delivered ({notice.explanation}). "
                    f"Send it again if you still need it. Ref: {notice.message_id}",
                    kind="undelivered_notice",
                )

        self.rt.db.run_transaction(take_and_tell)
