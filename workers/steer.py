"""The ``steer`` busy policy: a message sent while its chat's run goes on is handed to that run.

Under ``steer`` a claude run goes through the stream-json input of :mod:`workers.providers.claude_warm`
(whether or not the process is kept afterwards). While it runs, the run's watch (:mod:`workers.liveness`)
claims any message of the same chat that arrives — marked as started in this run, so a crash costs it an
interrupted run exactly as it costs the run's own messages, and the re-run answers them together as under
``collect`` — and offers it to the run's :class:`SteerInbox`. A feeder writes it to the CLI's stdin at once,
as one more user message. The CLI takes it at its next step:

- during a tool step, into the turn going on ("the user sent a new message while you were working"): that
  turn's one ``result`` answers both;
- during a reply without tools, as the next turn of the same process, right after the current one.

The run knows which by the CLI's echo of each user message it takes (``--replay-user-messages``): it ends at
the first ``result`` after every message it wrote was echoed. Messages waiting on the CLI's input when a turn
ends are taken together, as one user message (their texts joined by newlines): one echo then answers several
(:func:`echoed_count`). Either way the run has one final reply for the
whole folded group — its own messages and every message steered into it — made of each turn's answer in
order. A message offered after the run has read its last ``result`` is refused (:meth:`SteerInbox.offer`)
and waits for the chat's next run, as under ``collect``. Codex and command agents, which cannot take a
message mid-run, treat ``steer`` as ``collect``.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from shared.queue.core import QueuedMessage
from workers.busy import build_prompt


class SteerInbox:
    """Messages handed to one run while it goes on, in the order they arrived.

    Used from the event loop only: :meth:`offer` (the run's watch) and :meth:`take` (the feeder writing to
    the CLI) never interleave with :meth:`settle` (the reader, at each ``result``), so a message is either
    refused or answered by the run, never lost in between.
    """

    def __init__(self) -> None:
        self._waiting: list[str] = []
        self._wake: anyio.Event | None = None
        #: The messages taken by the feeder (written, or being written, to the CLI), in order.
        self.written: list[str] = []
        #: True once the run has read its last answer (or ended): no more messages are accepted.
        self.closed = False

    def offer(self, prompt: str) -> bool:
        """Hand ``prompt`` to the run; False when the run no longer takes messages."""
        if self.closed:
            return False
        self._waiting.append(prompt)
        if self._wake is not None:
            self._wake.set()
        return True

    async def take(self) -> str:
        """The next message to write to the CLI (waits for one)."""
        while not self._waiting:
            self._wake = anyio.Event()
            await self._wake.wait()
        self._wake = None
        prompt = self._waiting.pop(0)
        self.written.append(prompt)
        return prompt

    @property
    def taken(self) -> int:
        """How many messages the feeder has taken."""
        return len(self.written)

    def settle(self, answered: int) -> bool:
        """At a ``result``: True (and closed) when every message handed over has been taken in by the CLI —
        ``answered`` of them were echoed so far — so this result is the run's last; False when the CLI has
        more to answer."""
        if self._waiting or answered < self.taken:
            return False
        self.closed = True
        return True

    def close(self) -> None:
        """The run ended some other way (a failure, a stop): refuse what comes later."""
        self.closed = True


def echoed_count(echo: str, pending: Sequence[str]) -> int:
    """How many of ``pending`` (messages written to the CLI and not yet echoed, in order) one echo of a user
    message stands for. The CLI takes the messages waiting on its input together when a turn ends — two
    messages written while a reply streams come back as one user message, their texts joined by a newline —
    so one echo can answer several. At least one: an echo answers the oldest message written."""
    rest = echo.strip()
    count = 0
    for text in pending:
        text = text.strip()
        if rest == text:
            return count + 1
        if not rest.startswith(text + "\n"):
            break
        rest = rest[len(text) + 1 :].lstrip("\n")
        count += 1
    return max(count, 1)


def steered_prompt(messages: Sequence[QueuedMessage], running: Sequence[QueuedMessage]) -> str:
    """What the CLI is given for ``messages`` steered into the run of ``running``: their text as a collected
    group would have it, and, when someone else in a group chat sent them, who (the run's own sender needs
    no label, as in a one-to-one chat)."""
    text = build_prompt(messages)
    senders = {m.sender_id or m.sender for m in running}
    if len(messages) == 1 and (messages[0].sender_id or messages[0].sender) not in senders:
        who = messages[0].sender or messages[0].sender_id
        if who:
            return f"[from {who}]:\n{text}"
    return text
