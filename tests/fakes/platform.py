"""An in-memory chat platform behind the :class:`adapters.platform.Platform` seam, for tests of the channel
runner (:mod:`adapters.runner`) without a platform library: what a user sends is pushed in, what the runner
sends is recorded, and a send can be made to fail the way a remote platform refuses one.

It fakes the remote platform, not our code: the runner's intake, commands, delivery and lifecycle run for real
against a real database.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from adapters.platform import Inbound, Platform, SendFailure


class PlatformRefused(Exception):
    """The fake platform refused a send (``permanent``: for good, like a blocked bot)."""

    def __init__(self, reason: str, *, permanent: bool) -> None:
        super().__init__(reason)
        self.permanent = permanent


@dataclass(frozen=True)
class Sent:
    """One thing the platform accepted: a text, a file, a progress note or an edit of one, or typing."""

    kind: str
    conversation: str
    text: str = ""
    message_id: str = ""


class FakePlatform(Platform):
    """The platform ``fake``: 60-character messages, editable notes, typing; thread-safe for a test thread."""

    name: ClassVar[str] = "fake"
    prefix: ClassVar[str] = "fake"
    limit: ClassVar[int] = 60
    can_edit: ClassVar[bool] = True
    platform_label: ClassVar[str] = "Fake"

    def read_secrets(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.sent: list[Sent] = []
        self.outcomes: list[str] = []
        #: The next sends fail with these, in order (then sends succeed again).
        self.refusals: list[PlatformRefused] = []
        self._inbound: asyncio.Queue[Inbound] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def is_open(self) -> bool:
        """Whether the runner has opened the platform (messages can be pushed)."""
        return self._inbound is not None

    # -- the user's side ------------------------------------------------------------------------------------
    def push(self, message: Inbound) -> None:
        """A user sends ``message`` (from any thread, once the platform is open)."""
        assert self._loop is not None and self._inbound is not None, "the platform is not open"
        self._loop.call_soon_threadsafe(self._inbound.put_nowait, message)

    def texts(self, conversation: str) -> list[str]:
        """What the chat received as messages (texts and notes), oldest first."""
        with self._lock:
            return [
                s.text for s in self.sent if s.conversation == conversation and s.kind in ("text", "note")
            ]

    # -- the seam ---------------------------------------------------------------------------------------------
    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._inbound = asyncio.Queue()

    async def receive(self) -> None:
        assert self._inbound is not None
        while not self.inbox.stop_event.is_set():
            with contextlib.suppress(TimeoutError):
                message = await asyncio.wait_for(self._inbound.get(), 0.1)
                outcome = await self.inbox.handle(message)
                with self._lock:
                    self.outcomes.append(outcome)

    def _record(self, kind: str, conversation: str, text: str) -> str:
        with self._lock:
            if self.refusals:
                raise self.refusals.pop(0)
            message_id = str(next(self._ids))
            self.sent.append(Sent(kind, conversation, text, message_id))
            return message_id

    async def send_text(self, conversation: str, text: str) -> str | None:
        assert self.measure(text) <= self.limit, f"a chunk over the limit: {text!r}"
        return self._record("text", conversation, text)

    async def send_file(self, conversation: str, path: Path, caption: str) -> str | None:
        return self._record("file", conversation, f"{path.name}|{caption}")

    async def send_note(self, conversation: str, text: str) -> str:
        return self._record("note", conversation, text)

    async def edit_text(self, conversation: str, message_id: str, text: str) -> bool:
        self._record("edit", conversation, f"{message_id}|{text}")
        return True

    async def send_typing(self, conversation: str) -> None:
        with self._lock:  # typing is never refused: the refusals are for replies
            self.sent.append(Sent("typing", conversation))

    def classify_send_error(self, exc: Exception) -> SendFailure:
        if isinstance(exc, PlatformRefused):
            return SendFailure(exc.permanent, f"Fake: {exc}", "the chat is gone" if exc.permanent else "")
        return super().classify_send_error(exc)
