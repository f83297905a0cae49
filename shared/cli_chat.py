"""The CLI as a channel: follow one message from the terminal until it is answered.

The CLI has no adapter process: its replies (channel ``cli``) wait in the queue until a terminal reads them —
``agentpost send --wait`` and ``agentpost chat`` while they wait, ``agentpost replies`` later. Reading a reply
acknowledges it, like any channel's delivery. While the agent works, its steps (``agent_progress`` events) and
notes ("still working", "trying again in 8 s") are shown as they come.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.queue import QueuedResponse
from shared.runtime import Runtime

CLI_CHANNEL = "cli"
#: Reply kinds that are an answer (or the explanation of why there is none), as opposed to a passing note.
NOTE_KINDS = frozenset({"progress"})
ERROR_KINDS = frozenset({"dead_notice", "failed", "budget_notice"})


@dataclass
class Followed:
    """How a followed message ended, and the replies read for it (already acknowledged)."""

    status: str  # "completed", "dead" or "waiting" (the wait ran out first)
    replies: list[QueuedResponse] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status == "dead" or any(
            (r.metadata or {}).get("kind") in ERROR_KINDS for r in self.replies
        )


def read_replies(
    rt: Runtime, conversation: str, show: Callable[[QueuedResponse], None], *, notes: bool = True
) -> list[QueuedResponse]:
    """Show and acknowledge the replies waiting in a CLI chat, oldest first; notes only when ``notes``."""
    shown = []
    for response in rt.queue.chat_responses(CLI_CHANNEL, conversation):
        if notes or (response.metadata or {}).get("kind") not in NOTE_KINDS:
            show(response)
        rt.queue.ack_response(response.id)
        shown.append(response)
    return shown


def follow_message(
    rt: Runtime,
    message_id: str,
    conversation: str,
    *,
    after_cursor: str,
    timeout: float,
    on_step: Callable[[str], None],
    on_reply: Callable[[QueuedResponse], None],
) -> Followed:
    """Wait until ``message_id`` is completed or dead and its replies in the CLI chat are read.

    ``after_cursor`` is the event log's cursor from before the message was queued, so no step is missed.
    Steps and notes go to ``on_step``, replies to ``on_reply``. Returns ``status = "waiting"`` when
    ``timeout`` seconds pass first (the reply then waits for ``agentpost replies``).
    """
    deadline = time.monotonic() + timeout
    cursor = after_cursor
    outcome = Followed("waiting")
    while True:
        generation = rt.waker.generation
        # The status first: a reply is committed with the completion, so once the status says done, the
        # reply is visible to the read below.
        message = rt.queue.get_message(message_id)
        for entry in rt.events.read("progress", after=cursor, limit=500):
            cursor = entry.cursor
            if message_id in (entry.payload.get("message_ids") or []) and entry.payload.get("text"):
                on_step(str(entry.payload["text"]))
        for response in rt.queue.chat_responses(CLI_CHANNEL, conversation):
            if (response.metadata or {}).get("kind") in NOTE_KINDS:
                on_step(response.message)
            else:
                on_reply(response)
                outcome.replies.append(response)
            rt.queue.ack_response(response.id)
        if message is None or message.status in ("completed", "dead"):
            # Its reply is written in the same transaction that completes it: it was read above.
            outcome.status = "completed" if message is None else message.status
            return outcome
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return outcome
        rt.waker.wait(generation, min(remaining, 1.0))
