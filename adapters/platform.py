"""The platform seam: what differs between chat platforms (Telegram, Discord, WhatsApp, Slack, third-party
ones).

A channel plugin is a subclass of :class:`Platform` (the class the ``agentpost.channels`` entry point names).
It fills in only the platform's half:

- **connecting**: :meth:`Platform.open`, :meth:`Platform.close`, :meth:`Platform.is_unreachable`;
- **receiving**: :meth:`Platform.receive` runs until the channel stops, turning each platform update into an
  :class:`Inbound` and handing it to :attr:`Platform.inbox` (:meth:`adapters.intake.Intake.handle`, which
  returns once the message is committed — only then is the update acknowledged to the platform);
- **sending**: :meth:`Platform.send_text`, :meth:`Platform.send_file`, :meth:`Platform.send_note`,
  :meth:`Platform.edit_text`, :meth:`Platform.send_typing`, :meth:`Platform.classify_send_error`; live
  previews through :meth:`Platform.edit_reply`, at most one edit per :meth:`Platform.preview_edit_seconds`;
- **asking**: an agent's question before a tool runs (``permission_mode = "ask"``) goes out through
  :meth:`Platform.send_question` with :class:`Button` s, and is edited to its answer by
  :meth:`Platform.close_question`; a press comes back as a :class:`Press` handed to :meth:`Inbox.press`
  (which says what to tell the one who pressed). The defaults send the question as text with the chat
  commands that answer it (``/allow``, ``/deny``);
- **limits**: :attr:`Platform.limit` measured by :meth:`Platform.measure`, :attr:`Platform.can_edit`, the
  long-reply file type, where a pairing code goes (:meth:`Platform.pairing_replies`);
- **secrets**: :meth:`Platform.read_secrets` reads tokens from :attr:`Platform.env` when the plugin is built,
  with :meth:`Platform.require_env` for each one it cannot do without.

A plugin's own settings section (``[channels.<name>]``, validated against :attr:`Platform.settings_model` by
:func:`channel_config`) is :attr:`Platform.config`; the whole settings in force are :attr:`Platform.settings`.
Helpers a plugin calls, functions of this module rather than methods to override:
:func:`upload_folder` (where a chat's inbound files are saved), :func:`pause_for_tests_after_fetch` (the test
hook below), :func:`run_until_stopped` (a :meth:`Platform.receive` for a platform run by a client task),
:func:`safe_filename` and :func:`pairing_code_text`.

Everything else — allowlist and pairing, dedupe, chat commands, queueing, claiming and chunking replies,
progress notes, typing, retries, health, signals — is the one channel runner (:mod:`adapters.runner`), the
same for every platform. The runner attaches its intake as :attr:`Platform.inbox` before :meth:`open`, and
``agentpost run <name>`` runs the plugin's class under it (:func:`adapters.runner.run_process`, the
``agentpost.channel_runner`` entry point): this module imports nothing of the runner.

Test hook: ``AGENTPOST_TEST_PAUSE_AFTER_FETCH=SECONDS`` makes a plugin sleep after it fetched an inbound
message and before handling it (tests kill the process in that window), where the plugin calls
:func:`pause_for_tests_after_fetch`. Never set it in production.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import ConfigDict, create_model

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.file_access import chat_upload_dir, safe_name
from shared.runtime import Runtime
from shared.settings.channels import ChannelSettings
from shared.settings.model import Settings, SettingsError

if TYPE_CHECKING:
    from shared.storage.db import Tx

_T = TypeVar("_T")

#: A write that commits with a message a plugin hands in (its own update offset, say): ``also(tx)``.
Also = Callable[["Tx"], None]

TEST_PAUSE_ENV = "AGENTPOST_TEST_PAUSE_AFTER_FETCH"

__all__ = [
    "Also",
    "Button",
    "ChannelSettings",
    "HandleOutcome",
    "Inbound",
    "Inbox",
    "MissingSecret",
    "Platform",
    "Press",
    "PressOutcome",
    "SendFailure",
    "channel_config",
    "pairing_code_text",
    "pause_for_tests_after_fetch",
    "run_until_stopped",
    "safe_filename",
    "upload_folder",
]


class MissingSecret(SettingsError):
    """A token or secret the channel needs is not in the environment (the message names the variable)."""


@dataclass(frozen=True)
class Inbound:
    """One message a user sent on the platform, as a plugin hands it to :meth:`adapters.intake.Intake.handle`."""

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


@dataclass(frozen=True)
class Button:
    """One button under a question: its label, and the data a press of it hands back in :attr:`Press.data`
    (at most 64 bytes of ASCII: Telegram's limit for a button's data)."""

    label: str
    data: str


@dataclass(frozen=True)
class Press:
    """A person pressed a :class:`Button` (or picked a numbered answer): where, who, and the button's data."""

    conversation: str
    sender_id: str
    sender: str
    data: str


#: The answer to a question without buttons, appended by the default :meth:`Platform.send_question`.
ANSWER_IN_WORDS = "Answer with /allow, /deny, or /allow chat (allow it for the rest of this chat)."


@dataclass(frozen=True)
class PressOutcome:
    """What a press of a question's button did (:meth:`Inbox.press`)."""

    #: What to tell the one who pressed ("✅ Allowed", "Only Ann can answer this request.").
    text: str
    #: The press decided the request (allowed, denied): the chat is told the same decision by the question's
    #: edit, or by a new message where it cannot be edited, so the presser needs no word of their own.
    decided: bool


#: What became of an inbound message (:meth:`adapters.intake.Intake.handle`).
HandleOutcome = Literal["queued", "duplicate", "command", "pairing_code", "unpaired", "ignored"]


class Inbox(Protocol):
    """Where a plugin hands what it receives: the channel runner's intake (:class:`adapters.intake.Intake`),
    attached as :attr:`Platform.inbox` before :meth:`Platform.open`. Declared here so a plugin knows the
    runner only through this."""

    #: Set when the channel stops: :meth:`Platform.receive` returns then.
    stop_event: asyncio.Event

    async def handle(self, message: Inbound, *, also: Also | None = None) -> HandleOutcome:
        """Take ``message`` in; returns once it is committed (acknowledge the update to the platform only
        then). ``also(tx)`` commits with it (a plugin's cursor)."""
        ...

    async def may_download(self, sender_id: str) -> bool:
        """Whether to fetch this sender's attachments (not a stranger's)."""
        ...

    async def until_stored(self, work: Callable[[], Awaitable[_T]], what: str) -> _T:
        """``await work()``, again while the database is away, until the channel stops."""
        ...

    def reply(self, message: Inbound, text: str, *, kind: str, also: Also | None = None) -> None:
        """Queue a reply of the channel itself to ``message``'s chat."""
        ...

    async def saved(self, key: str) -> str | None:
        """A value the plugin keeps for itself (an update offset), or None; waits out storage trouble."""
        ...

    def saving(self, key: str, value: str) -> Also:
        """The write of a kept value, to pass as ``also`` to :meth:`handle`: it commits with what the
        message caused, so an update is never confirmed without it."""
        ...

    async def save(self, key: str, value: str) -> None:
        """Keep a value on its own (an update that queued nothing); waits out storage trouble."""
        ...

    async def press(self, press: Press) -> PressOutcome:
        """A button of a question was pressed: apply the answer (only the person who sent the message may
        give it; at most once) and return what it did."""
        ...


@dataclass(frozen=True)
class SendFailure:
    """How a platform refused a send: for good (``permanent``) or for now, and why.

    ``reason`` is the platform's own words (kept in ``responses.last_error`` for operators); ``explanation``
    is a short plain-language version for the user ("the bot was blocked"), used when the reply failed for
    good.
    """

    permanent: bool
    reason: str
    explanation: str = ""
    #: The platform asked for this wait before the next try (a rate limit's ``Retry-After``): a transient
    #: failure's retry comes no sooner.
    retry_after_seconds: float = 0.0


def pairing_code_text(code: str) -> str:
    """The message that gives a new sender their code."""
    return (
        f"Hi! I don't know you yet. Your pairing code is {code}. Ask the operator to run: "
        f"agentpost pairing approve {code} — I'll answer your message as soon as they do."
    )


def safe_filename(name: str, fallback: str = "file") -> str:
    """A file name with no path parts or odd characters (inbound attachments are saved under it); the rule
    of :func:`shared.file_access.safe_name`, under the name plugins import."""
    return safe_name(name, fallback)


async def run_until_stopped(task: asyncio.Task[None], stop: asyncio.Event, what: str) -> None:
    """A :meth:`Platform.receive` for a platform whose client or server runs as ``task``: wait until
    ``stop`` is set (``task`` is left to :meth:`Platform.close`), or until ``task`` ends — then raise why it
    ended, or a ``RuntimeError`` saying ``what`` stopped."""
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if task in done:
        task.result()
        raise RuntimeError(f"{what} stopped")


class Platform(abc.ABC):
    """Base class of channel plugins: one chat platform's connection, receiving and sending. Subclasses set
    the class attributes and override the platform methods; the defaults suit a platform without typing,
    editing or permanent errors."""

    #: The channel name (the ``channel`` column, the ``[channels.<name>]`` settings table).
    name: ClassVar[str] = ""
    #: Prefix of the message ids this channel creates.
    prefix: ClassVar[str] = ""
    #: The platform's text limit per message, in the units :meth:`measure` counts.
    limit: ClassVar[int] = 2000
    #: The settings model of ``[channels.<name>]``.
    settings_model: ClassVar[type[ChannelSettings]] = ChannelSettings
    #: Whether :meth:`edit_text` can change a sent message in place (progress notes are edited).
    can_edit: ClassVar[bool] = False
    #: The platform's name as users know it (in notices about replies that could not be delivered).
    platform_label: ClassVar[str] = ""
    #: File name suffix of a long reply sent as a file: a type the platform accepts as a document.
    long_reply_suffix: ClassVar[str] = ".txt"
    #: How long taking in a message waits for a database that is away (a restarting server, a lock, a full
    #: disk) before it gives up and raises; None: until the adapter is stopped. A plugin whose platform
    #: redelivers what was not acknowledged (a webhook answered with an error) sets a bound, so the
    #: platform is told to try again instead of being kept waiting.
    storage_wait_seconds: ClassVar[float | None] = None
    #: Where the values a plugin keeps through :meth:`Inbox.saved` live (a ``kv`` scope); empty: one of
    #: its own named after the channel.
    state_scope: ClassVar[str] = ""

    #: Where inbound messages go: the channel runner's intake, attached before :meth:`open`.
    inbox: Inbox

    def __init__(
        self, runtime: Runtime, config: ChannelSettings | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        self.rt = runtime
        self.config = config if config is not None else channel_config(type(self), runtime.settings)
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.log = logging.getLogger(f"agentpost.channel.{self.name}")
        self.read_secrets()

    # -- configuration -------------------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        """The settings in force now: an edited settings.toml is picked up without a restart (agents,
        teams and queue tuning; the channel's own section is read at start)."""
        return self.rt.settings

    def read_secrets(self) -> None:  # noqa: B027  (optional: a platform without secrets)
        """Read tokens and addresses from :attr:`env`; raise :class:`MissingSecret` naming a missing one."""

    def require_env(self, variable: str, what: str) -> str:
        """The value of ``variable``, or :class:`MissingSecret` telling the operator to set it."""
        value = self.env.get(variable, "").strip()
        if not value:
            raise MissingSecret(
                f"the {self.name} adapter needs {what}: set the environment variable {variable}"
            )
        return value

    # -- connecting (override) -----------------------------------------------------------------------------
    async def open(self) -> None:  # noqa: B027  (optional: a platform with nothing to connect)
        """Connect to the platform (log in); called before delivery starts."""

    async def close(self) -> None:  # noqa: B027  (optional, like open)
        """Disconnect; called once at the end, also after a failed :meth:`open`."""

    def is_unreachable(self, exc: BaseException) -> bool:
        """Whether a failure to :meth:`open` means the platform cannot be reached now (worth retrying), as
        opposed to a refusal such as a bad token. Plugins add their library's network errors."""
        # Not every OSError: a webhook port that is taken will not free itself by waiting.
        return isinstance(exc, ConnectionError | TimeoutError | socket.gaierror)

    # -- receiving (override) ------------------------------------------------------------------------------
    async def receive(self) -> None:
        """Receive inbound messages until the channel stops (``inbox.stop_event``), handing each to
        :meth:`adapters.intake.Intake.handle` on :attr:`inbox`."""
        await self.inbox.stop_event.wait()

    def pairing_replies(self, message: Inbound, code: str) -> list[tuple[ChatAddress, str, str]]:
        """Where a new sender's pairing code goes, as ``(address, text, kind)`` replies: by default in the
        chat they wrote in; plugins with public chats send it privately."""
        return [(message.address_on(self.name), pairing_code_text(code), "pairing")]

    # -- sending (override) --------------------------------------------------------------------------------
    def measure(self, text: str) -> int:
        """Length of ``text`` in the platform's units (characters by default)."""
        return len(text)

    @abc.abstractmethod
    async def send_text(self, conversation: str, text: str) -> str | None:
        """Send one chunk (already within :attr:`limit`) to ``conversation``; returns the platform's id of
        the sent message when it gives one (so a failure it reports later can be traced back)."""

    @abc.abstractmethod
    async def send_file(self, conversation: str, path: Path, caption: str) -> str | None:
        """Send one file to ``conversation`` with a short caption (may be empty); returns the platform's
        message id when it gives one."""

    async def send_note(self, conversation: str, text: str) -> str:
        """Send a progress note (plain text within :attr:`limit`); returns the platform's message id
        (``""`` when the platform gives none). Default: :meth:`send_text`."""
        await self.send_text(conversation, text)
        return ""

    async def edit_text(self, conversation: str, message_id: str, text: str) -> bool:
        """Replace the text of a message sent earlier. True when edited (or unchanged); False when the
        message cannot be edited any more (deleted, too old), so a new one should be sent. Other failures
        raise (the delivery is retried)."""
        return False

    async def edit_reply(self, conversation: str, message_id: str, text: str) -> bool:
        """Replace a message's text with (part of) a reply, formatted as :meth:`send_text` formats it (a
        live preview, and the final answer it becomes). Returns and raises as :meth:`edit_text`, which it
        is by default."""
        return await self.edit_text(conversation, message_id, text)

    def preview_edit_seconds(self, conversation: str) -> float:
        """The least time between two edits of a live preview in ``conversation``, inside the platform's
        limits (default: one a second)."""
        return 1.0

    async def send_question(self, conversation: str, text: str, buttons: Sequence[Button]) -> str | None:
        """Send a question with ``buttons`` (an agent asking before a tool runs); returns the platform's id of
        the message, so :meth:`close_question` can edit it to the answer. Default: the question as text, with
        the chat commands that answer it (a platform without buttons)."""
        return await self.send_text(conversation, f"{text}\n\n{ANSWER_IN_WORDS}")

    async def close_question(self, conversation: str, message_id: str, text: str) -> bool:
        """Replace a question sent by :meth:`send_question` with what became of it, its buttons removed.
        Returns as :meth:`edit_text` (False: send ``text`` as a new message instead), which it is by
        default."""
        return await self.edit_text(conversation, message_id, text)

    async def send_typing(self, conversation: str) -> None:
        """Show the typing indicator in ``conversation`` (default: the platform has none)."""
        return None

    def classify_send_error(self, exc: Exception) -> SendFailure:
        """Whether a send error is permanent (the reply can never be delivered) or worth retrying.
        Default: everything is retried; plugins name their platform's permanent refusals."""
        return SendFailure(False, f"{type(exc).__name__}: {exc}")


# -- helpers a plugin calls (not overridden, so not methods) ------------------------------------------------
def channel_config(platform: type[Platform], settings: Settings) -> ChannelSettings:
    """Validate the ``[channels.<name>]`` section of ``platform`` against its :attr:`Platform.settings_model`
    (errors name the key, e.g. ``channels.telegram.allowlist``)."""
    wrapper = create_model(  # type: ignore[call-overload]
        f"{platform.__name__}Section",
        __config__=ConfigDict(extra="allow"),
        **{platform.name: (platform.settings_model, platform.settings_model())},
    )
    section = settings.section("channels", wrapper)
    config: ChannelSettings = getattr(section, platform.name)
    return config


def upload_folder(platform: Platform, conversation: str) -> Path:
    """Where ``platform`` saves a chat's inbound files (created if missing): the chat's upload folder of
    :func:`shared.file_access.chat_upload_dir`, so replies to that chat may attach them again."""
    folder = chat_upload_dir(platform.settings, ChatAddress(platform.name, conversation=conversation))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def pause_for_tests_after_fetch(platform: Platform, what: str) -> None:
    """The documented test hook (see the module docstring): sleep between fetching ``what`` and handling
    it, when :attr:`Platform.env` sets ``AGENTPOST_TEST_PAUSE_AFTER_FETCH``."""
    seconds = float(platform.env.get(TEST_PAUSE_ENV) or 0)
    if seconds > 0:
        platform.log.warning("test hook: paused %.1f s after fetching %s", seconds, what)
        await asyncio.sleep(seconds)
