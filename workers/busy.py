"""Busy conversations: what becomes of messages that arrive while a chat's run goes on, and the prompts.

The processor holds, per agent, a list of *work groups* (claimed messages not yet run, one chat each).
After every run it claims what arrived and merges it in with :func:`merge_arrivals`, by the chat's policy
(:func:`resolve_policy`: the chat's ``/queue`` choice, else ``[channels.<channel>] busy_policy``, else
``[processor] busy_policy``):

- ``collect`` (default): everything waiting for a chat is one group, so what arrived during a run becomes
  one follow-up run.
- ``followup``: each message is its own group, run in arrival order.
- ``interrupt``: like ``collect``, and in addition a message arriving for a chat whose run is going stops
  that run (see :mod:`workers.liveness`); the interrupted messages go back to the front, merged with the new
  ones, and the next run is told which ones it had already started on. They cost no attempt.

A cap, ``[processor] max_waiting``, bounds the messages waiting per chat: past it, the *oldest* waiting
messages are completed at once with one short reply that quotes what was dropped (:func:`apply_cap`), so
the newest — the user's current intent — are the ones answered, and nothing disappears silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from shared.chat.address import ChatAddress
from shared.chat.prefs import get_busy_policy
from shared.queue.core import QueuedMessage, group_by_conversation
from shared.settings.busy_policy import BusyPolicy, parse_busy_policy
from shared.settings.model import Settings
from shared.storage.db import Database
from workers.files import describe_inbound

#: The note a re-run gets when its previous attempt was cut off (crash, lost lease, forced shutdown).
INTERRUPTED_NOTE = (
    "[Note from agentpost: your previous attempt at this was interrupted before it finished (the worker "
    "stopped mid-run). Check your workspace for work already done before redoing it.]"
)


def was_interrupted(message: QueuedMessage) -> bool:
    """Whether the message's last run was cut off rather than failed by the agent: a crashed worker
    (``interrupted: the lease ... expired``) or a shutdown past its grace period."""
    error = message.last_error or ""
    return error.startswith("interrupted") or error.startswith("released: processor stopping")


@dataclass
class WorkGroup:
    """Claimed messages of one chat that will be one run; ``carried`` counts the leading messages an
    interrupted run had already started on."""

    messages: list[QueuedMessage]
    policy: BusyPolicy
    carried: int = 0

    @property
    def key(self) -> tuple[str, str]:
        """The chat: (channel, conversation key)."""
        return self.messages[0].conversation_key

    @property
    def chat(self) -> str:
        """``<channel>:<conversation>``, the form of ``/stop`` requests and per-chat settings."""
        return "{}:{}".format(*self.key)

    @property
    def ids(self) -> list[str]:
        return [m.message_id for m in self.messages]


def channel_policy(settings: Settings, channel: str) -> BusyPolicy | None:
    """``[channels.<channel>] busy_policy`` when set and valid."""
    section = settings.file.channels.get(channel)
    value = section.get("busy_policy") if isinstance(section, Mapping) else None
    if not isinstance(value, str):
        return None
    try:
        return parse_busy_policy(value)
    except ValueError:
        return None


def busy_notice_on(settings: Settings, channel: str) -> bool:
    """``[channels.<channel>] busy_notice``: whether a message waiting behind a run gets a note (default
    yes)."""
    section = settings.file.channels.get(channel)
    value = section.get("busy_notice", True) if isinstance(section, Mapping) else True
    return value is not False


def resolve_policy(db: Database, settings: Settings, default: BusyPolicy, chat: ChatAddress) -> BusyPolicy:
    """The busy policy of ``chat``: its own (``/queue``, read as the channel stored it), else its channel's,
    else ``default``."""
    return get_busy_policy(db, chat) or channel_policy(settings, chat.channel) or default


def merge_arrivals(
    groups: list[WorkGroup],
    arrivals: Sequence[QueuedMessage],
    policy_of: Callable[[tuple[str, str]], BusyPolicy],
) -> None:
    """Add newly claimed messages to the waiting groups, in place, by each chat's policy."""
    for batch in group_by_conversation(arrivals):
        key = batch[0].conversation_key
        policy = policy_of(key)
        if policy == "followup":
            groups.extend(WorkGroup([m], policy) for m in batch)
            continue
        existing = next((g for g in groups if g.key == key), None)
        if existing is None:
            groups.append(WorkGroup(list(batch), policy))
        else:
            existing.messages = sorted([*existing.messages, *batch], key=lambda m: m.id)
            existing.policy = policy


def apply_cap(groups: list[WorkGroup], max_waiting: int) -> list[list[QueuedMessage]]:
    """Drop the oldest waiting messages of any chat with more than ``max_waiting``; returns the dropped
    messages per chat (to be completed with a notice) and removes them (and emptied groups) in place."""
    by_chat: dict[tuple[str, str], list[QueuedMessage]] = {}
    for group in groups:
        by_chat.setdefault(group.key, []).extend(group.messages)
    dropped: list[list[QueuedMessage]] = []
    for messages in by_chat.values():
        excess = len(messages) - max_waiting
        if excess <= 0:
            continue
        ordered = sorted(messages, key=lambda m: m.id)
        gone = {m.message_id for m in ordered[:excess]}
        dropped.append(ordered[:excess])
        for group in groups:
            if group.key == messages[0].conversation_key:
                before = len(group.messages)
                group.messages = [m for m in group.messages if m.message_id not in gone]
                group.carried = max(0, group.carried - (before - len(group.messages)))
    groups[:] = [g for g in groups if g.messages]
    return dropped


def dropped_notice(dropped: Sequence[QueuedMessage], max_waiting: int) -> str:
    """The reply that completes messages dropped by the cap: which ones, and what to do."""
    lines = [
        f"Too many messages were waiting in this chat (the limit is {max_waiting}), so I dropped "
        f"the {'oldest' if len(dropped) > 1 else 'oldest one'} without answering "
        f"{'them' if len(dropped) > 1 else 'it'}:"
    ]
    for m in dropped[:10]:
        text = " ".join(m.message.split())
        lines.append(f"- “{text[:60]}{'…' if len(text) > 60 else ''}”")
    if len(dropped) > 10:
        lines.append(f"- … and {len(dropped) - 10} more")
    lines.append("Send again whatever still matters.")
    return "\n".join(lines)


def build_prompt(group: Sequence[QueuedMessage], carried: int = 0) -> str:
    """The text an agent is given for one group: the message itself, or all of them, numbered.

    With ``carried`` (an interrupted run), the first ``carried`` messages are marked as the ones the
    stopped run had started on and the rest as the newer messages that stopped it. A message whose previous
    attempt was interrupted by a crash gets :data:`INTERRUPTED_NOTE` in front.
    """
    notes = [n for n in (describe_inbound(m.message) for m in group) if n]
    if carried and carried < len(group):
        lines = [
            f"Your previous run in this chat was stopped because {len(group) - carried} new "
            f"message{'s' if len(group) - carried > 1 else ''} arrived. What you were working on "
            "(for context; do not repeat finished work):"
        ]
        for number, m in enumerate(group[:carried], 1):
            lines.append(_numbered(number, m))
        lines.append("\nThe new messages (answer everything, taking them into account):")
        for number, m in enumerate(group[carried:], carried + 1):
            lines.append(_numbered(number, m))
        text = "\n".join(lines)
    elif len(group) == 1:
        text = group[0].message
    else:
        lines = [
            f"{len(group)} messages arrived in this chat while you were busy (oldest first); answer them together:"
        ]
        lines.extend(_numbered(number, m) for number, m in enumerate(group, 1))
        text = "\n".join(lines)
    if any(was_interrupted(m) for m in group):
        text = f"{INTERRUPTED_NOTE}\n\n{text}"
    return text + ("\n\n" + "\n".join(notes) if notes else "")


def _numbered(number: int, m: QueuedMessage) -> str:
    who = f" from {m.sender}" if m.sender else ""
    return f"\n[{number}]{who}:\n{m.message}"
