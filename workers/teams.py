"""Teams: what a reply's tags turn into — handoffs, chat-room posts, and where the answer goes.

A reply may carry ``[@teammate: text]`` / ``[@a,b: text]`` (handoffs) and ``[#team: text]`` (a chat-room
post). :func:`plan_reply` turns one reply into everything the processor commits *in the same transaction*
as the completion (see :meth:`shared.queue.messages.Messages.complete_messages`):

- **Handoffs** become ``internal_`` messages to each named teammate with ``hops + 1``. The text outside the
  tags is the *shared context* and goes to every target, followed by the part directed at that target.
  Only agents that share a team with the sender are reachable; other names are ignored with a reason.
  The queue refuses drafts past ``max_hops`` and logs ``chain_handoff_refused``, telling the origin chat once
  per chain; a teammate's message that fails for good is told there too (:mod:`shared.queue.failures`).
- **Chat-room posts** are stored in ``chat_messages`` and delivered as one ``chat_`` message to every
  other member of the team (the sender must be a member).
- **Where a teammate's answer goes** (the decision): users must see the final answers, so every internal
  message carries the *origin* of the chain in its metadata (channel, sender, sender id, conversation and
  message id of the user's message that started it, copied unchanged along the chain). When an agent
  answers an internal or chat message that has an origin, its reply is sent to that original chat as a
  response addressed with the origin's routing fields (and ``metadata.from_agent``), so the user sees the
  leader's reply and then each teammate's answer. A chain without an origin (e.g. an internal message
  enqueued by hand) keeps its answer in the history only.
- Users never see raw tags: the reply text is shown through ``render_for_user`` (``→ @b: text``).
- Who is answering: a teammate's answer, a reply that hands work on, and every reply in a chat that more
  than one agent has answered start with the agent's name; a reply to several messages folded into one run
  starts with "(Answering your N messages together.)" (see :func:`plan_reply`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.chat.address import ChatAddress
from shared.queue.core import (
    INTERNAL_CHANNELS,
    AgentTurn,
    ChatPost,
    MessageDraft,
    QueuedMessage,
    ResponseDraft,
)
from shared.settings.model import Settings
from shared.settings.routing import HandoffTag, parse_handoff_tags, render_for_user

#: Channels whose messages come from another agent (their answers go to the chain's origin).
AGENT_CHANNELS = frozenset({"internal", "chat", "chatroom"})

EMPTY_REPLY = "(the agent finished without a reply)"

#: Channels whose Markdown makes ``*text*`` bold (elsewhere ``**text**``).
_SINGLE_STAR_BOLD = frozenset({"telegram", "whatsapp"})


@dataclass
class ReplyPlan:
    """Everything one reply becomes."""

    response: ResponseDraft | None
    followups: list[MessageDraft] = field(default_factory=list)
    chat_posts: list[ChatPost] = field(default_factory=list)
    history: list[AgentTurn] = field(default_factory=list)
    ignored: list[dict[str, str]] = field(default_factory=list)  # tags that went nowhere, with the reason


def origin_of(message: QueuedMessage) -> dict[str, Any] | None:
    """The user message a chain started from: the message itself, or the origin an internal one carries."""
    if message.channel in AGENT_CHANNELS:
        origin = message.metadata.get("origin")
        return dict(origin) if isinstance(origin, dict) and origin.get("channel") else None
    return {
        "channel": message.channel,
        "sender": message.sender,
        "sender_id": message.sender_id,
        "conversation": message.conversation,
        "message_id": message.message_id,
        "agent": message.agent,  # the agent the user addressed (a teammate's answer is named, not this one's)
    }


def _shared_context(reply: str, tags: Sequence[HandoffTag]) -> str:
    parts, pos = [], 0
    for tag in tags:
        parts.append(reply[pos : tag.start])
        pos = tag.end
    parts.append(reply[pos:])
    return "\n".join(line.rstrip() for line in "".join(parts).strip().splitlines()).strip()


def _chain_key(origin: dict[str, Any] | None, fallback: QueuedMessage) -> str:
    # Internal messages of one chat batch together (the queue groups by channel + conversation).
    if origin is None:
        return f"{fallback.channel}:{fallback.conversation or fallback.sender_id or fallback.sender}"
    return (
        f"{origin['channel']}:{origin.get('conversation') or origin.get('sender_id') or origin.get('sender')}"
    )


def speaker_label(agent: str, channel: str) -> str:
    """``**coder:**`` in the channel's bold (single asterisks on Telegram and WhatsApp)."""
    return f"*{agent}:*" if channel in _SINGLE_STAR_BOLD else f"**{agent}:**"


def folded_note(count: int) -> str:
    """The line that starts a reply answering several of the user's messages in one run."""
    return f"(Answering your {count} messages together.)"


def _handoff_draft(
    agent: str, target: str, text: str, shared: str, chain: str, metadata: dict[str, Any], hops: int
) -> MessageDraft:
    """An ``[@target: text]`` handoff as a message to ``target`` in the chain's internal conversation,
    led by the context the reply shares with every teammate it addresses (``shared``)."""
    body = f"[Message from teammate @{agent}]:\n"
    if shared:
        body += f"{shared}\n\n------\n\nDirected to you:\n"
    body += text
    return MessageDraft(
        channel="internal",
        prefix="internal",
        sender=agent,
        sender_id=agent,
        message=body,
        agent=target,
        from_agent=agent,
        conversation=chain,
        metadata=metadata,
        hops=hops,
    )


def _room_drafts(
    members: Sequence[str], team: str, agent: str, text: str, base_meta: dict[str, Any], hops: int
) -> list[MessageDraft]:
    """A ``[#team: text]`` post as one message to every other member of ``team``."""
    return [
        MessageDraft(
            channel="chat",
            prefix="chat",
            sender=agent,
            sender_id=agent,
            message=f"[#{team} chat room, from @{agent}]:\n{text}",
            agent=member,
            from_agent=agent,
            conversation=f"#{team}",
            metadata={**base_meta, "team": team},
            hops=hops,
        )
        for member in members
        if member != agent
    ]


def _relayed_answer(
    agent: str,
    primary: QueuedMessage,
    origin: dict[str, Any] | None,
    shown: str,
    files: Sequence[str],
    meta: dict[str, Any],
) -> ResponseDraft | None:
    """A teammate's answer, sent to the user chat its chain started from (none without one, or when the
    answer shows nothing)."""
    if origin is None or not (shown or files):
        return None
    text = shown or "(file attached)"
    if origin.get("agent") != agent:
        text = f"{speaker_label(agent, str(origin['channel']))} {text}"
        meta["speaker"] = agent
    return ResponseDraft.to(
        ChatAddress.of(origin),
        text,
        files=list(files),
        metadata={**meta, "from_agent": agent, "via": primary.channel},
    )


def _chat_answer(
    agent: str,
    group: Sequence[QueuedMessage],
    shown: str,
    files: Sequence[str],
    meta: dict[str, Any],
    *,
    speaker: bool,
) -> ResponseDraft:
    """The answer to a user chat: labelled with the agent's name when ``speaker``, and led by a line
    saying so when it answers several of the user's messages at once."""
    text = shown or EMPTY_REPLY
    if speaker:
        text = f"{speaker_label(agent, group[0].channel)} {text}"
        meta["speaker"] = agent
    folded = sum(1 for m in group if m.channel not in INTERNAL_CHANNELS)  # the user's own messages
    if folded > 1:
        text = f"{folded_note(folded)}\n{text}"
        meta["folded"] = folded
    return ResponseDraft(message=text, files=list(files), metadata=meta)


def plan_reply(
    settings: Settings,
    agent: str,
    group: Sequence[QueuedMessage],
    reply: str,
    files: Sequence[str] = (),
    metadata: dict[str, Any] | None = None,
    *,
    chat_agents: Sequence[str] = (),
) -> ReplyPlan:
    """Turn ``agent``'s ``reply`` to ``group`` (primary first) into response, handoffs, posts and history.

    What the user sees says who is answering where it isn't obvious: the reply starts with the agent's name
    (:func:`speaker_label`) when a teammate answers (not the agent the chat addressed), when the reply hands
    work on to teammates (their answers follow in the chat), or when ``chat_agents`` (the agents that have
    answered this chat lately, :mod:`shared.chat.agents`) holds more than one. A reply to several of the
    user's messages folded into one run starts with one line saying so (:func:`folded_note`): the prompt
    tells the agent, and this line tells the user, whatever the agent writes.
    """
    primary = group[0]
    origin = origin_of(primary)
    hops = max(m.hops for m in group) + 1
    chain = _chain_key(origin, primary)
    member_of = {name: team for name, team in settings.teams.items() if agent in team.agents}
    reachable = {a: name for name, team in member_of.items() for a in team.agents if a != agent}
    tags = parse_handoff_tags(reply)
    shared = _shared_context(reply, tags)
    plan = ReplyPlan(response=None)
    base_meta = {"origin": origin, "chain_from": primary.message_id}

    for tag in tags:
        if not tag.text:
            plan.ignored.append({"tag": "".join(tag.targets), "reason": "empty tag"})
            continue
        if tag.kind == "team":
            team_name = tag.targets[0]
            if team_name not in member_of:
                reason = "unknown team" if team_name not in settings.teams else f"@{agent} is not a member"
                plan.ignored.append({"tag": f"#{team_name}", "reason": reason})
                continue
            plan.chat_posts.append(ChatPost(team_id=team_name, from_agent=agent, message=tag.text))
            plan.followups.extend(
                _room_drafts(settings.teams[team_name].agents, team_name, agent, tag.text, base_meta, hops)
            )
            continue
        for target in tag.targets:
            if target == agent:
                plan.ignored.append({"tag": f"@{target}", "reason": "an agent cannot hand off to itself"})
                continue
            if target not in reachable:
                reason = "unknown agent" if target not in settings.agents else "not a teammate"
                plan.ignored.append({"tag": f"@{target}", "reason": reason})
                continue
            to_team = {**base_meta, "team": reachable[target]}
            plan.followups.append(_handoff_draft(agent, target, tag.text, shared, chain, to_team, hops))

    meta = {"agent": agent, **(metadata or {})}
    shown = render_for_user(reply).strip()
    if primary.channel in AGENT_CHANNELS:
        plan.response = _relayed_answer(agent, primary, origin, shown, files, meta)
    else:
        hands_on = any(f.channel == "internal" for f in plan.followups)
        speaks = hands_on or len(set(chat_agents) | {agent}) > 1
        plan.response = _chat_answer(agent, group, shown, files, meta, speaker=speaks)

    for m in group:
        plan.history.append(AgentTurn(agent, "user", m.message, m.channel, m.sender, m.message_id))
    plan.history.append(AgentTurn(agent, "assistant", reply, primary.channel, agent, primary.message_id))
    return plan
