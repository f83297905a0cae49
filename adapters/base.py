"""The channel base every chat plugin shares (Telegram, Discord, WhatsApp, and third-party ones).

A plugin subclasses :class:`Channel` and fills in the platform half: connect (:meth:`Channel.open`),
receive (:meth:`Channel.receive`, which hands each inbound message to :meth:`Channel.handle`), send a text
chunk, send a file, show typing, disconnect. The base gives it the rest, talking to other processes only
through the database:

- **Inbound**: an allowlist or pairing check (unknown senders get a one-time code and their message is not
  queued), chat commands (:mod:`adapters.chat_commands`: ``/agent``, ``/team``, ``/reset``, ``/status``,
  ``/stop``, ``/queue``, ``/help``), a sticky default agent per chat (``@agent`` alone switches, ``@default``
  clears), then ``enqueue_message`` with the platform's message id as ``external_id`` (a redelivered message
  is reported as a duplicate, not queued twice — also after the message row was pruned: the ids taken in
  are remembered for longer than any platform redelivers, :mod:`shared.chat.dedupe`) and the chat debounce (``[queue] debounce_ms``: a burst of
  quick messages becomes one run). :meth:`Channel.handle` returns only after the message is committed, so a
  platform delivery is acknowledged (an offset confirmed, a webhook answered) only then. A command's answer
  commits with the message's seen mark and the plugin's cursor in the same way, so a crash never answers
  it twice. While the database is away (a server restarting, a lock, a full disk), :meth:`Channel.handle`
  waits and tries again (:meth:`Channel.until_stored`) instead of dropping the update.
- **Delivery, progress notes and typing**: :mod:`adapters.delivery`. Replies to commands and pairing codes go
  through the same responses table, so they are durable too.
- **Connecting and running**: :mod:`adapters.channel_lifecycle` (retries while the platform is unreachable,
  the recorded connection state, the loops run until a signal).
- **Replies that could not be delivered**: when a user whose earlier reply failed for good (the platform
  refused it) writes again, a short note saying so is queued first, in that chat — the path that works.

Test hook: ``AGENTPOST_TEST_PAUSE_AFTER_FETCH=SECONDS`` makes a plugin sleep after it fetched an inbound
message and before handling it (tests kill the process in that window). Never set it in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import ConfigDict, create_model

from adapters import pairing as pairings
from adapters.channel_lifecycle import ChannelLifecycle
from adapters.chat_commands import COMMANDS, HELP_TEXT, ChatCommands, reset_conversation
from adapters.delivery import Part, safe_filename
from shared.aio import call
from shared.chat import dedupe, held
from shared.chat.address import ChatAddress
from shared.chat.cursors import OFFLINE_SENT_AT
from shared.clock import now_ms
from shared.file_access import chat_upload_dir
from shared.queue.core import TxWork, UnknownMention
from shared.runtime import Runtime, open_runtime
from shared.settings.channels import ChannelSettings
from shared.settings.model import Settings, SettingsError
from shared.storage.db import Tx
from shared.storage.errors import transient_problem
from shared.worker_identity import new_worker_id

TEST_PAUSE_ENV = "AGENTPOST_TEST_PAUSE_AFTER_FETCH"
_T = TypeVar("_T")
#: Longest pause between two tries to reach a database that is away.
_STORAGE_RETRY_MAX_SECONDS = 5.0
_COMMAND_RE = re.compile(r"^/(?P<name>[A-Za-z_]+)(?:@[A-Za-z0-9_]+)?(?:\s+(?P<args>.*))?$", re.DOTALL)
_MENTION_ONLY_RE = re.compile(r"^@(?P<name>[A-Za-z0-9][A-Za-z0-9_-]{0,31})$")

__all__ = [
    "COMMANDS",
    "HELP_TEXT",
    "Channel",
    "ChannelSettings",
    "HandleOutcome",
    "Inbound",
    "MissingSecret",
    "Part",
    "pairing_code_text",
    "reset_conversation",
    "safe_filename",
    "worker_name",
]


class MissingSecret(SettingsError):
    """A token or secret the channel needs is not in the environment (the message names the variable)."""


@dataclass(frozen=True)
class Inbound:
    """One message a user sent on the platform, as a plugin hands it to :meth:`Channel.handle`."""

    conversation: str
    sender_id: str
    sender: str
    text: str
    external_id: str
    files: Sequence[Path] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: When the user sent it (epoch ms, 0: unknown). Older than ``late_message_seconds`` (a minute) when
    #: handled: it arrived while the adapter was down, and the reply says so.
    sent_at: int = 0

    def address_on(self, channel: str) -> ChatAddress:
        """Where the message came from on ``channel``, and so where replies to it go."""
        return ChatAddress(channel, self.sender, self.sender_id, self.conversation)

    def held_record(self) -> dict[str, Any]:
        """The message as :mod:`shared.chat.held` keeps it while its sender waits for approval (a
        stored format: :meth:`from_held` reads it back)."""
        return {
            "conversation": self.conversation,
            "sender_id": self.sender_id,
            "sender": self.sender,
            "text": self.text,
            "external_id": self.external_id,
            "metadata": dict(self.metadata),
            "sent_at": self.sent_at or now_ms(),
        }

    @classmethod
    def from_held(cls, sender_id: str, record: Mapping[str, Any]) -> Inbound:
        """A message kept by :meth:`held_record`, from the sender ``sender_id``."""
        return cls(
            conversation=str(record.get("conversation") or ""),
            sender_id=sender_id,
            sender=str(record.get("sender") or ""),
            text=str(record.get("text") or ""),
            external_id=str(record.get("external_id") or ""),
            metadata=dict(record.get("metadata") or {}),
            sent_at=int(record.get("sent_at") or 0),
        )


HandleOutcome = Literal["queued", "duplicate", "command", "pairing_code", "unpaired", "ignored"]


_WORKER_NAMES_TAKEN: set[str] = set()


#: How long messages of a sender nobody approves are kept (their code expires after an hour).
HELD_FOR_MS = 24 * 3_600_000
APPROVED_TEXT = "You're approved — answering your message now."


def pairing_reminder_text(kept: bool) -> str:
    """The occasional reminder to a sender still waiting for approval. It never repeats the code: it may be
    posted where others read (a guild channel), while the code went privately."""
    kept_text = "I've kept this message and will answer it" if kept else "I'll answer your first messages"
    return f"Still waiting for the operator to approve your pairing code. {kept_text} once they do."


def pairing_code_text(code: str) -> str:
    """The message that gives a new sender their code."""
    return (
        f"Hi! I don't know you yet. Your pairing code is {code}. Ask the operator to run: "
        f"agentpost pairing approve {code} — I'll answer your message as soon as they do."
    )


def worker_name(channel: str) -> str:
    """The delivery worker id: ``host:pid:start`` (:func:`shared.worker_identity.new_worker_id`), so a
    restarted adapter on this host sees that its predecessor is gone and takes over its replies at once.

    A second adapter of the same channel in one process (tests) gets a random suffix: its id no longer
    parses as a process, so its claims are judged by their lease alone, as before.
    """
    worker = new_worker_id()
    if channel in _WORKER_NAMES_TAKEN:
        return f"{worker}:{secrets.token_hex(3)}"
    _WORKER_NAMES_TAKEN.add(channel)
    return worker


class Channel(ChatCommands, ChannelLifecycle):
    """Base class of channel plugins. Subclasses set the class attributes and the platform methods."""

    #: The channel name (the ``channel`` column, the ``[channels.<name>]`` settings table).
    name: ClassVar[str] = ""
    #: Prefix of the message ids this channel creates.
    prefix: ClassVar[str] = ""
    #: The platform's text limit per message, in the units :meth:`measure` counts.
    limit: ClassVar[int] = 2000
    #: The settings model of ``[channels.<name>]``.
    settings_model: ClassVar[type[ChannelSettings]] = ChannelSettings
    #: How long :meth:`handle` waits for a database that is away (a restarting server, a lock, a full
    #: disk) before it gives up and raises; None: until the adapter is stopped. A plugin whose platform
    #: redelivers what was not acknowledged (a webhook answered with an error) sets a bound, so the
    #: platform is told to try again instead of being kept waiting.
    storage_wait_seconds: ClassVar[float | None] = None

    def __init__(
        self,
        runtime: Runtime,
        config: ChannelSettings | None = None,
        env: Mapping[str, str] | None = None,
        *,
        worker_id: str | None = None,
    ) -> None:
        self.rt = runtime
        self.config = config if config is not None else self.load_config(runtime.settings)
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.worker = worker_id or worker_name(self.name)
        self.log = logging.getLogger(f"agentpost.channel.{self.name}")
        self.lease_ms = runtime.queue.config.lease_ms
        self.poll_interval = self.config.poll_interval_seconds or self.settings.queue.poll_interval_seconds
        self.stop_event = asyncio.Event()
        self.read_secrets()

    # -- configuration -------------------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:  # type: ignore[override]
        """The settings in force now: an edited settings.toml is picked up without a restart (agents,
        teams and queue tuning; the channel's own section is read at start)."""
        return self.rt.settings

    @classmethod
    def load_config(cls, settings: Settings) -> ChannelSettings:
        """Validate ``[channels.<name>]`` (errors name the key, e.g. ``channels.telegram.allowlist``)."""
        wrapper = create_model(  # type: ignore[call-overload]
            f"{cls.__name__}Section",
            __config__=ConfigDict(extra="allow"),
            **{cls.name: (cls.settings_model, cls.settings_model())},
        )
        section = settings.section("channels", wrapper)
        config: ChannelSettings = getattr(section, cls.name)
        return config

    def read_secrets(self) -> None:
        """Read tokens and addresses from :attr:`env`; raise :class:`MissingSecret` naming a missing one."""

    def require_env(self, variable: str, what: str) -> str:
        """The value of ``variable``, or :class:`MissingSecret` telling the operator to set it."""
        value = self.env.get(variable, "").strip()
        if not value:
            raise MissingSecret(
                f"the {self.name} adapter needs {what}: set the environment variable {variable}"
            )
        return value

    # The sending methods (send_text, send_file, send_typing, send_note, edit_text, measure) are declared
    # with the delivery in adapters.delivery.Delivery.

    # -- inbound ---------------------------------------------------------------------------------------------
    async def test_pause_after_fetch(self, what: str) -> None:
        """The documented test hook (see the module docstring): sleep between fetching and handling."""
        seconds = float(self.env.get(TEST_PAUSE_ENV) or 0)
        if seconds > 0:
            self.log.warning("test hook: paused %.1f s after fetching %s", seconds, what)
            await asyncio.sleep(seconds)

    async def handle(self, message: Inbound, *, also: TxWork | None = None) -> HandleOutcome:
        """Authorise, run commands, or queue one inbound message; returns once the outcome is committed.

        While the database is away it waits and tries again (:meth:`until_stored`): a plugin acknowledges
        an update to its platform only after this returns, so an update is never dropped, nor confirmed
        before it is stored.

        ``also(tx)`` is written in the transaction that queues the message or its answer (a plugin's
        cursor, so the update and what it caused commit together); it is not called for a message that is
        neither queued nor answered (ignored, a duplicate, a sender waiting for pairing)."""
        return await self.until_stored(
            lambda: call(self.handle_sync, message, also=also), f"taking in message {message.external_id}"
        )

    async def until_stored(self, work: Callable[[], Awaitable[_T]], what: str) -> _T:
        """``await work()``; while it fails on storage trouble (:func:`shared.storage.errors.transient_problem`:
        a server restarting or unreachable, a lock, a full disk), wait with a doubling pause and run it
        again, up to :attr:`storage_wait_seconds` or until the adapter is stopped — then raise. ``work``
        must be safe to run again: it is one transaction, or checks what an earlier try committed (an
        update already taken in is a duplicate). Other errors are raised at once."""
        limit = self.storage_wait_seconds
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

    def handle_sync(self, message: Inbound, *, also: TxWork | None = None) -> HandleOutcome:
        """:meth:`handle` in the calling thread (blocking database work)."""
        db = self.rt.db
        text = message.text.strip()
        refs = [f"[file: {p}]" for p in message.files]
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
            answer = self.run_command(
                message, command.group("name").lower(), (command.group("args") or "").strip()
            )
            self.reply(message, answer, kind="command", also=taken_in)
            return "command"
        switch = _MENTION_ONLY_RE.match(text)
        if switch and not refs:
            switched = self._switch(message, switch.group("name").lower())
            if switched is not None:
                self.reply(message, switched, kind="command", also=taken_in)
                return "command"
        body = "\n".join([text, *refs]) if text else "\n".join(refs)
        agent = self._sticky_for(message.conversation, text)
        metadata = dict(message.metadata)
        if message.sent_at and now_ms() - message.sent_at > self.config.late_message_seconds * 1000:
            metadata[OFFLINE_SENT_AT] = message.sent_at  # the final reply will say it arrived while offline
        try:
            result = self.rt.queue.enqueue_message(
                self.name,
                message.sender,
                body,
                sender_id=message.sender_id,
                conversation=message.conversation,
                external_id=message.external_id,
                metadata=metadata,
                agent=agent,
                prefix=self.prefix or self.name,
                debounce_ms=self.settings.queue.debounce_ms if self.config.debounce else 0,
                also=taken_in,
            )
        except UnknownMention as exc:  # "@nosuch hi": answered with the names we know, nothing queued
            self.reply(message, self.unknown_mention_reply(message, exc), kind="command", also=taken_in)
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
            self.send_pairing_code(message, check.code)
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

    def upload_folder(self, conversation: str) -> Path:
        """Where a chat's inbound files are saved (created if missing): the chat's upload folder of
        :func:`shared.file_access.chat_upload_dir`, so replies to that chat may attach them again."""
        folder = chat_upload_dir(self.settings, self.name, conversation)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

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

    def send_pairing_code(self, message: Inbound, code: str) -> None:
        """Tell a new sender their pairing code (in the chat they wrote in; plugins with public chats
        override this to send it privately)."""
        self.reply(message, pairing_code_text(code), kind="pairing")

    def reply(self, message: Inbound, text: str, *, kind: str, also: TxWork | None = None) -> None:
        """Queue a reply of the channel itself (a command answer, a pairing code) for delivery; ``also(tx)``
        commits with it."""
        self.reply_to(message.address_on(self.name), text, kind=kind, also=also)

    def reply_to(self, address: ChatAddress, text: str, *, kind: str, also: TxWork | None = None) -> None:
        """Queue a message of the channel itself to ``address`` (durable like any reply); ``kind`` goes in
        its metadata, ``also(tx)`` commits with it."""
        self.rt.queue.enqueue_response(
            address.channel,
            address.sender,
            text,
            sender_id=address.sender_id,
            conversation=address.conversation,
            metadata={"kind": kind},
            also=also,
        )

    def _seen(self, external_id: str) -> bool:
        return dedupe.is_seen(self.rt.db, self.name, external_id)

    def _tell_undelivered(self, message: Inbound) -> None:
        """Queue a note about replies of this chat that could not be delivered, before anything else the
        user gets now (they wrote, so this chat works again)."""
        queue = self.rt.queue
        if not queue.has_undelivered_notices(self.name, message.conversation):
            return
        for notice in queue.take_undelivered_notices(self.name, message.conversation):
            at = datetime.fromtimestamp(notice.created_at / 1000, UTC).strftime("%H:%M UTC")
            self.reply(
                message,
                f"My reply to your message at {at} could not be delivered ({notice.explanation}). "
                f"Send it again if you still need it. Ref: {notice.message_id}",
                kind="undelivered_notice",
            )

    @classmethod
    def run_process(cls, home: Path | None = None) -> None:
        """``agentpost run <name>``: open the runtime, check settings and secrets, run until a signal.

        Bad settings or a missing token raise :class:`SettingsError` (the CLI prints it, exit code 2).
        """
        logging.basicConfig(
            level=os.environ.get("AGENTPOST_LOG_LEVEL", "INFO"),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        for noisy in ("httpx", "telegram", "discord", "uvicorn.access"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        runtime = open_runtime(home)
        try:
            channel = cls(runtime)
            try:
                asyncio.run(channel.serve_with_signals())
            except Exception as exc:  # the platform refused us (bad token, unreachable): say so, exit 1
                channel.log.error("%s adapter stopped: %s: %s", cls.name, type(exc).__name__, exc)
                raise SystemExit(1) from None
        finally:
            runtime.close()
