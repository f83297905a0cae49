"""The channel base every chat plugin shares (Telegram, Discord, WhatsApp, and third-party ones).

A plugin subclasses :class:`Channel` and fills in the platform half: connect (:meth:`Channel.open`),
receive (:meth:`Channel.receive`, which hands each inbound message to :meth:`Channel.handle`), send a text
chunk, send a file, show typing, disconnect. The base gives it the rest, talking to other processes only
through the database:

- **Inbound**: an allowlist or pairing check (unknown senders get a one-time code and their message is not
  queued), chat commands (``/agent NAME``, ``/team NAME``, ``/reset [@agent]``, ``/help``), a sticky default
  agent per chat (``@agent`` alone switches, ``@default`` clears), then ``enqueue_message`` with the
  platform's message id as ``external_id`` (a redelivered message is reported as a duplicate, not queued
  twice). :meth:`Channel.handle` returns only after the message is committed, so a platform delivery is
  acknowledged (an offset confirmed, a webhook answered) only then.
- **Delivery**: wake on new responses, claim the channel's responses with a lease, send each as parts (chunks
  split by :mod:`adapters.chunking`, then the attached files; a reply longer than ``max_chunks`` chunks goes
  as one file), record each part with ``mark_chunk_delivered`` and ack at the end. The parts are a pure
  function of the response, so after a crash the next claim resumes at the first part not recorded. Replies
  to commands and pairing codes go through the same responses table, so they are durable too.
- **Typing**: while a chat has a message pending or processing, show the platform's typing indicator.

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
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from adapters import chat_state
from adapters import pairing as pairings
from adapters.chunking import split_message
from shared.clock import now_ms
from shared.queue import InvalidInput, QueuedResponse
from shared.routing import AGENT_NAME_RE, resolve_route
from shared.runtime import Runtime, open_runtime
from shared.sessions import AGENT_SCOPE_KEY, clear_sessions
from shared.settings import Settings, SettingsError

TEST_PAUSE_ENV = "AGENTPOST_TEST_PAUSE_AFTER_FETCH"
_COMMAND_RE = re.compile(r"^/(?P<name>[A-Za-z_]+)(?:@[A-Za-z0-9_]+)?(?:\s+(?P<args>.*))?$", re.DOTALL)
_MENTION_ONLY_RE = re.compile(r"^@(?P<name>[A-Za-z0-9][A-Za-z0-9_-]{0,31})$")
_SAFE_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")

HELP_TEXT = """Commands:
/agent NAME - send this chat's messages to agent NAME by default
/team NAME - send this chat's messages to team NAME by default
/reset [@agent] - start a fresh conversation with the agent
/help - this help
@agent alone switches this chat's default agent; @default goes back to normal routing.
Start a message with @agent or @team to address one agent just once."""


class MissingSecret(SettingsError):
    """A token or secret the channel needs is not in the environment (the message names the variable)."""


class ChannelSettings(BaseModel):
    """Settings every channel has, in ``[channels.<name>]`` of settings.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowlist: list[str] = Field(
        default_factory=list, description="sender ids served without pairing; '*' serves everyone"
    )
    pairing: bool = Field(
        default=True, description="give unknown senders a pairing code (false: ignore them)"
    )
    pairing_max_pending: int = Field(default=pairings.MAX_PENDING, ge=1, le=100)
    max_chunks: int = Field(default=4, ge=1, le=50, description="longer replies are sent as a file")
    delivery_batch: int = Field(default=10, ge=1, le=100)
    delivery_attempts: int = Field(default=5, ge=1, le=100, description="failed sends before giving up")
    typing: bool = True
    typing_interval_seconds: float = Field(default=4.0, gt=0)
    poll_interval_seconds: float = Field(default=0.0, ge=0, description="0: the queue's poll interval")


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


HandleOutcome = Literal["queued", "duplicate", "command", "pairing_code", "unpaired", "ignored"]


@dataclass(frozen=True)
class Part:
    """One thing to send for a response: a text chunk, or a file with an optional caption."""

    kind: Literal["text", "file"]
    text: str = ""
    path: str = ""


def worker_name(channel: str) -> str:
    """``channel:host:pid:random``, unique per process start."""
    return f"{channel}:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def safe_filename(name: str, fallback: str = "file") -> str:
    """A file name with no path parts or odd characters (inbound attachments are saved under it)."""
    cleaned = _SAFE_NAME_RE.sub("_", Path(name).name).strip("._")
    return cleaned[:100] or fallback


class Channel:
    """Base class of channel plugins. Subclasses set the class attributes and the platform methods."""

    #: The channel name (the ``channel`` column, the ``[channels.<name>]`` settings table).
    name: ClassVar[str] = ""
    #: Prefix of the message ids this channel creates.
    prefix: ClassVar[str] = ""
    #: The platform's text limit per message, in the units :meth:`measure` counts.
    limit: ClassVar[int] = 2000
    #: The settings model of ``[channels.<name>]``.
    settings_model: ClassVar[type[ChannelSettings]] = ChannelSettings

    def __init__(
        self,
        runtime: Runtime,
        config: ChannelSettings | None = None,
        env: Mapping[str, str] | None = None,
        *,
        worker_id: str | None = None,
    ) -> None:
        self.rt = runtime
        self.settings: Settings = runtime.settings
        self.config = config if config is not None else self.load_config(runtime.settings)
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.worker = worker_id or worker_name(self.name)
        self.log = logging.getLogger(f"agentpost.channel.{self.name}")
        self.lease_ms = runtime.queue.config.lease_ms
        self.poll_interval = self.config.poll_interval_seconds or self.settings.queue.poll_interval_seconds
        self.stop_event = asyncio.Event()
        self.read_secrets()

    # -- configuration -------------------------------------------------------------------------------------
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

    def measure(self, text: str) -> int:
        """Length of ``text`` in the platform's units (characters by default)."""
        return len(text)

    # -- platform half (override) ----------------------------------------------------------------------------
    async def open(self) -> None:
        """Connect to the platform (log in); called before delivery starts."""

    async def close(self) -> None:
        """Disconnect; called once at the end, also after a failed :meth:`open`."""

    async def receive(self) -> None:
        """Receive inbound messages until :attr:`stop_event` is set, calling :meth:`handle` for each."""
        await self.stop_event.wait()

    async def send_text(self, conversation: str, text: str) -> None:
        """Send one chunk (already within :attr:`limit`) to ``conversation``."""
        raise NotImplementedError

    async def send_file(self, conversation: str, path: Path, caption: str) -> None:
        """Send one file to ``conversation`` with a short caption (may be empty)."""
        raise NotImplementedError

    async def send_typing(self, conversation: str) -> None:
        """Show the typing indicator in ``conversation`` (default: the platform has none)."""

    # -- inbound ---------------------------------------------------------------------------------------------
    async def test_pause_after_fetch(self, what: str) -> None:
        """The documented test hook (see the module docstring): sleep between fetching and handling."""
        seconds = float(self.env.get(TEST_PAUSE_ENV) or 0)
        if seconds > 0:
            self.log.warning("test hook: paused %.1f s after fetching %s", seconds, what)
            await asyncio.sleep(seconds)

    async def handle(self, message: Inbound) -> HandleOutcome:
        """Authorise, run commands, or queue one inbound message; returns once the outcome is committed."""
        return await asyncio.to_thread(self.handle_sync, message)

    def handle_sync(self, message: Inbound) -> HandleOutcome:
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
            if check.decision == "approved":
                pass
            elif check.decision == "new_code":
                self.reply(
                    message,
                    f"Hi! I don't know you yet. Your pairing code is {check.code}. Ask the operator to run: "
                    f"agentpost pairing approve {check.code}",
                    kind="pairing",
                )
                return "pairing_code"
            else:
                self.log.info(
                    "unpaired sender %s (%s): message not queued", message.sender_id, check.decision
                )
                return "unpaired"
        command = _COMMAND_RE.match(text)
        if command and command.group("name").lower() in ("agent", "team", "reset", "help", "start"):
            if self._seen(message.external_id):
                return "duplicate"
            answer = self.run_command(
                message, command.group("name").lower(), (command.group("args") or "").strip()
            )
            self.reply(message, answer, kind="command")
            self._mark_seen(message.external_id)
            return "command"
        switch = _MENTION_ONLY_RE.match(text)
        if switch and not refs:
            answer = self._switch(message, switch.group("name").lower())
            if answer is not None:
                if self._seen(message.external_id):
                    return "duplicate"
                self.reply(message, answer, kind="command")
                self._mark_seen(message.external_id)
                return "command"
        body = "\n".join([text, *refs]) if text else "\n".join(refs)
        agent = self._sticky_for(message.conversation, text)
        result = self.rt.queue.enqueue_message(
            self.name,
            message.sender,
            body,
            sender_id=message.sender_id,
            conversation=message.conversation,
            external_id=message.external_id,
            metadata=dict(message.metadata),
            agent=agent,
            prefix=self.prefix or self.name,
        )
        return "duplicate" if result.duplicate else "queued"

    async def may_download(self, sender_id: str) -> bool:
        """Whether to fetch a sender's attachments: not for strangers (they only get a pairing code)."""
        return await asyncio.to_thread(self.authorised, sender_id)

    def authorised(self, sender_id: str) -> bool:
        """Allowlisted (or ``*``) senders skip pairing; others must be paired."""
        allow = self.config.allowlist
        if "*" in allow or sender_id in allow:
            return True
        return pairings.is_approved(self.rt.db, self.name, sender_id)

    def reply(self, message: Inbound, text: str, *, kind: str) -> None:
        """Queue a reply of the channel itself (a command answer, a pairing code) for delivery."""
        self.rt.queue.enqueue_response(
            self.name,
            message.sender,
            text,
            sender_id=message.sender_id,
            conversation=message.conversation,
            metadata={"kind": kind},
        )

    def _seen(self, external_id: str) -> bool:
        return (
            bool(external_id)
            and chat_state.kv_get(self.rt.db, f"handled:{self.name}", external_id) is not None
        )

    def _mark_seen(self, external_id: str) -> None:
        # Commands are not queue messages, so the queue's duplicate check cannot catch a redelivered one.
        if external_id:
            chat_state.kv_set(self.rt.db, f"handled:{self.name}", external_id, str(now_ms()))

    def _known(self, name: str) -> Literal["agent", "team", ""]:
        if name in self.settings.agents:
            return "agent"
        if name in self.settings.teams:
            return "team"
        return ""

    def _names(self, kind: str) -> str:
        names = sorted(self.settings.agents) if kind == "agent" else sorted(self.settings.teams)
        return ", ".join(names) or "none"

    def _sticky_for(self, conversation: str, text: str) -> str | None:
        sticky = chat_state.sticky_agent(self.rt.db, self.name, conversation)
        if not sticky or not self._known(sticky):
            return None
        directory = self.rt.queue.directory
        route = resolve_route(text, directory.agents, directory.teams, directory.default_agent, None)
        return None if route.explicit else sticky  # "@other ..." still addresses other, once

    def _switch(self, message: Inbound, name: str) -> str | None:
        db = self.rt.db
        if name == "default":
            chat_state.clear_sticky_agent(db, self.name, message.conversation)
            return (
                f"This chat is back to normal routing (default agent @{self.settings.queue.default_agent})."
            )
        kind = self._known(name)
        if not kind:
            return None  # not a name we know: the text goes to the agent like any message
        chat_state.set_sticky_agent(db, self.name, message.conversation, name)
        return f"Messages in this chat now go to {kind} @{name}. Send @default to undo."

    def run_command(self, message: Inbound, name: str, args: str) -> str:
        """Run one chat command and return the answer."""
        db = self.rt.db
        if name in ("help", "start"):
            return HELP_TEXT
        if name in ("agent", "team"):
            target = args.removeprefix("@").strip().lower()
            if not target:
                current = chat_state.sticky_agent(db, self.name, message.conversation)
                shown = f"@{current}" if current else f"normal routing (@{self.settings.queue.default_agent})"
                return f"This chat's default is {shown}. Known {name}s: {self._names(name)}."
            if target == "default":
                answer = self._switch(message, "default")
                assert answer is not None
                return answer
            if self._known(target) != name:
                return f"Unknown {name} {target!r}. Known {name}s: {self._names(name)}."
            chat_state.set_sticky_agent(db, self.name, message.conversation, target)
            return f"Messages in this chat now go to {name} @{target}. Send @default to undo."
        # reset
        target = args.removeprefix("@").strip().lower()
        if not target:
            target = chat_state.sticky_agent(db, self.name, message.conversation) or ""
            target = target or self.settings.queue.default_agent
        kind = self._known(target)
        if not kind:
            return f"Unknown agent {target!r}. Known agents: {self._names('agent')}."
        agents = [target] if kind == "agent" else list(self.settings.teams[target].agents)
        for agent in agents:
            reset_conversation(self.rt, agent, self.name, message.conversation)
        shown = ", ".join(f"@{a}" for a in agents)
        return f"Started a fresh conversation with {shown}."

    # -- delivery --------------------------------------------------------------------------------------------
    def plan(self, response: QueuedResponse) -> list[Part]:
        """The parts a response is sent as. Deterministic, so a restart resumes at the same part."""
        text = response.message.strip()
        chunks = split_message(text, self.limit, length=self.measure) if text else []
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
        parts.extend(Part("file", "", str(f)) for f in response.files)
        return parts

    def _long_reply_file(self, response: QueuedResponse, text: str) -> str:
        folder = self.settings.home / "files" / "outbound" / self.name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"reply-{safe_filename(response.message_id)}-{response.id}.md"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text + "\n", encoding="utf-8")
            os.replace(tmp, path)
        return str(path)

    async def send_part(self, conversation: str, part: Part) -> None:
        """Send one part; a file that is gone is replaced by a short note rather than failing forever."""
        if part.kind == "text":
            await self.send_text(conversation, part.text)
            return
        path = Path(part.path)
        if not path.is_file():
            await self.send_text(conversation, f"(the file {path.name} is no longer available)")
            return
        await self.send_file(conversation, path, part.text)

    async def deliver(self, response: QueuedResponse) -> bool:
        """Send the unsent parts of one claimed response, recording each; ack at the end.

        Returns True when the response was acked (by this call).
        """
        queue = self.rt.queue
        parts = self.plan(response)
        for index in range(response.delivered, len(parts)):
            try:
                await self.send_part(response.conversation, parts[index])
            except Exception as exc:
                return await self._send_failed(response, index, exc)
            held = await asyncio.to_thread(
                queue.mark_chunk_delivered, response.id, self.worker, index, lease_ms=self.lease_ms
            )
            if not held:
                self.log.warning("lost response %s to another deliverer after part %s", response.id, index)
                return False
        acked = await asyncio.to_thread(queue.ack_response, response.id, self.worker)
        return bool(acked)

    async def _send_failed(self, response: QueuedResponse, index: int, exc: Exception) -> bool:
        scope = f"delivery_attempts:{self.name}"
        key = str(response.id)
        attempts = int(await asyncio.to_thread(chat_state.kv_get, self.rt.db, scope, key) or 0) + 1
        await asyncio.to_thread(chat_state.kv_set, self.rt.db, scope, key, str(attempts))
        self.log.warning(
            "sending part %s of response %s to %s failed (attempt %s of %s): %s",
            index,
            response.id,
            response.conversation,
            attempts,
            self.config.delivery_attempts,
            exc,
        )
        if attempts >= self.config.delivery_attempts:
            # The platform keeps refusing (a deleted chat, a blocked bot): stop retrying, keep the record.
            self.log.error("giving up on response %s after %s attempts", response.id, attempts)
            await asyncio.to_thread(self.rt.queue.ack_response, response.id, self.worker)
            await asyncio.to_thread(chat_state.kv_delete, self.rt.db, scope, key)
            return True
        return False  # the lease runs out and the next claim retries from this part

    async def deliver_once(self) -> int:
        """Claim and deliver one batch of this channel's responses; returns how many were claimed."""
        claimed = await asyncio.to_thread(
            self.rt.queue.claim_responses_for_channel,
            self.name,
            self.worker,
            limit=self.config.delivery_batch,
            lease_ms=self.lease_ms,
        )
        for response in claimed:
            if self.stop_event.is_set():
                break  # the rest of the batch returns to the pool when its lease expires
            await self.deliver(response)
        return len(claimed)

    async def delivery_loop(self) -> None:
        """Deliver until stopped: wake on database changes, with the slow poll as the fallback."""
        waker = self.rt.waker
        while not self.stop_event.is_set():
            generation = waker.generation
            try:
                claimed = await self.deliver_once()
            except Exception:
                self.log.exception("delivery failed; retrying")
                claimed = 0
                await asyncio.sleep(1.0)
            if claimed == 0 and not self.stop_event.is_set():
                await waker.wait_async(generation, self.poll_interval)

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
        """Chats of this channel with a message pending or being processed."""
        rows = self.rt.db.read(
            "SELECT DISTINCT conversation FROM messages WHERE channel = :c AND status IN ('pending', 'processing') "
            "AND conversation <> ''",
            {"c": self.name},
        )
        return [str(r["conversation"]) for r in rows]

    async def typing_loop(self) -> None:
        """Keep the typing indicator up in busy chats (refreshed every ``typing_interval_seconds``)."""
        waker = self.rt.waker
        interval = self.config.typing_interval_seconds
        shown: dict[str, float] = {}
        while not self.stop_event.is_set():
            generation = waker.generation
            try:
                busy = await asyncio.to_thread(self.busy_conversations)
            except Exception:
                self.log.exception("cannot read busy chats")
                busy = []
            now = time.monotonic()
            for conversation in busy:
                if now - shown.get(conversation, 0.0) >= interval:
                    shown[conversation] = now
                    try:
                        await self.send_typing(conversation)
                    except Exception as exc:
                        self.log.debug("typing in %s failed: %s", conversation, exc)
            for conversation in list(shown):
                if conversation not in busy:
                    del shown[conversation]
            await waker.wait_async(generation, min(interval, self.poll_interval))
            await asyncio.sleep(0.2)  # a busy database wakes us often; typing needs no faster pace

    # -- running ---------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Connect, then receive, deliver and show typing until :attr:`stop_event` is set; then close."""
        try:
            await self.open()
            tasks = [
                asyncio.create_task(self.receive(), name=f"{self.name}-receive"),
                asyncio.create_task(self.delivery_loop(), name=f"{self.name}-deliver"),
            ]
            if self.config.typing:
                tasks.append(asyncio.create_task(self.typing_loop(), name=f"{self.name}-typing"))
            stopper = asyncio.create_task(self.stop_event.wait())
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            self.stop_event.set()
            failed = [t for t in done if t is not stopper and not t.cancelled() and t.exception()]
            # Let an in-flight part finish (the loops check stop_event between parts), then cancel.
            _, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            stopper.cancel()
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
        finally:
            with contextlib.suppress(Exception):
                await self.close()

    async def serve_with_signals(self) -> None:
        """:meth:`run` until SIGTERM or SIGINT."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        self.log.info("%s adapter %s started", self.name, self.worker)
        await self.run()
        self.log.info("%s adapter %s stopped", self.name, self.worker)

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


def reset_conversation(runtime: Runtime, agent: str, channel: str, conversation: str) -> int:
    """Make ``agent`` start a fresh conversation for this chat, through the ``sessions`` table.

    The processor keys sessions by ``""`` (``session_scope = "agent"``) or ``"channel:conversation"``
    (``"conversation"``), so the key cleared follows the agent's setting. Returns sessions cleared.
    """
    if not AGENT_NAME_RE.match(agent):
        raise InvalidInput(f"bad agent name {agent!r}")
    config = runtime.settings.agents.get(agent)
    scope = config.session_scope if config is not None else "agent"
    key = AGENT_SCOPE_KEY if scope == "agent" else f"{channel}:{conversation}"
    return clear_sessions(runtime.db, agent, key, reason=f"/reset in {channel}")
