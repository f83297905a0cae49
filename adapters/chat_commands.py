"""The chat commands every channel understands, and a chat's sticky default agent.

- ``/agent NAME``, ``/team NAME``: this chat's messages go to NAME by default (``@agent`` alone does the
  same; ``@default`` goes back to normal routing). Kept in :mod:`shared.chat.sticky_agents`.
- ``@nosuch …`` (a leading mention of no agent or team) is refused by the queue
  (:class:`shared.queue.core.UnknownMention`) and answered with the agents and teams there are; nothing is queued.
- ``/reset [@agent]``: a fresh conversation, by clearing the agent's session row.
- ``/status``: what the agent does for this chat (running since, last step, waiting messages, a pause), read
  from the database with :mod:`shared.reads.conversation_status`.
- ``/stop``: a stop request in the agent's lease row (:meth:`shared.queue.control.Control.request_stop`) for each agent
  with work for this chat; the processor stops the run and completes its messages with a short reply.
- ``/queue [collect|followup|interrupt|default]``: the chat's busy policy (:mod:`shared.chat.prefs`).
- ``/usage``: what the sender's messages have cost today and this month, against their ``[budgets]``
  limits (:mod:`shared.reads.usage`); in the channel's ``operator_chat``, also each agent's spend and who is over
  a limit (:mod:`shared.reads.budget_status`).
- ``/allow`` (``/allow chat``: for the rest of this chat), ``/deny``: answer the oldest question an agent asks
  here before a tool runs, where the platform shows no buttons (:mod:`adapters.approval_prompts`).
- ``/retry``: the chat's last message that could not be answered goes back to the queue (within the
  manual-retry budget an operator's ``agentpost dead retry`` shares).

Every command reaches the processor only through the database; the answer is queued like any reply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from adapters.approval_prompts import answer_in_words
from shared.chat import sticky_agents, voice_heard
from shared.chat.address import ChatAddress
from shared.chat.prefs import get_busy_policy, set_busy_policy
from shared.chat.sessions import AGENT_SCOPE_KEY, clear_sessions
from shared.clock import now_ms
from shared.queue import approvals
from shared.queue.core import InvalidInput, NotFound, RetryBudgetExhausted, UnknownMention
from shared.queue.presence import warm_state
from shared.reads.budget_status import agents_usage_text
from shared.reads.conversation_status import conversation_status, format_status, format_time
from shared.reads.usage import sender_usage_text
from shared.runtime import Runtime
from shared.settings.busy_policy import BUSY_POLICIES, parse_busy_policy
from shared.settings.routing import AGENT_NAME_RE

if TYPE_CHECKING:
    from adapters.platform import Inbound
    from shared.settings.channels import ChannelSettings
    from shared.settings.model import Settings
    from shared.storage.db import Tx

#: The commands :meth:`ChatCommands.run_command` answers (``/start`` is Telegram's greeting: the help).
COMMANDS = frozenset(
    {"agent", "team", "reset", "help", "start", "status", "stop", "queue", "retry", "usage", "allow", "deny"}
)
#: Commands whose effect is written in the transaction that queues their answer (and marks the update seen),
#: through :meth:`ChatCommands.run_command_in`: run a second time after a crash they would do something else
#: (a second ``/retry`` finds the message no longer failed, or an older one). The others can run again.
IN_TRANSACTION = frozenset({"retry"})

HELP_TEXT = """Commands:
/agent NAME - send this chat's messages to agent NAME by default
/team NAME - send this chat's messages to team NAME by default
/reset [@agent] - start a fresh conversation with the agent
/status - what the agent is doing for this chat
/stop - stop the agent's current run for this chat
/retry - try again the last message here that could not be answered
/usage - what your messages have cost today and this month
/allow, /allow chat, /deny - answer an agent that asks before it runs a tool
/queue [collect|followup|interrupt|steer] - what happens to messages sent while the agent is busy
/help - this help
@agent alone switches this chat's default agent; @default goes back to normal routing.
Start a message with @agent or @team to address one agent just once."""

_POLICY_HELP = {
    "collect": "messages sent while the agent is busy are answered together in one follow-up run",
    "followup": "messages sent while the agent is busy each get their own run, in order",
    "interrupt": "a new message stops the running reply and is answered together with the earlier ones",
    "steer": "a new message is handed to the agent while it works, and its reply answers that message too "
    "(Claude agents; others answer it together in one follow-up run)",
}


class ChatCommands:
    """The chat commands of one channel, and its chats' sticky default agent (a part of the channel runner,
    :mod:`adapters.runner`; the intake asks it about every message it takes in)."""

    def __init__(self, runtime: Runtime, channel: str, config: ChannelSettings) -> None:
        self.rt = runtime
        #: The channel name (the ``channel`` column).
        self.name = channel
        self.config = config

    @property
    def settings(self) -> Settings:
        """The settings in force now (agents and teams are picked up without a restart)."""
        return self.rt.settings

    # -- names and the sticky agent ---------------------------------------------------------------------
    def _known(self, name: str) -> Literal["agent", "team", ""]:
        if name in self.settings.agents:
            return "agent"
        if name in self.settings.teams:
            return "team"
        return ""

    def _names(self, kind: str) -> str:
        names = sorted(self.settings.agents) if kind == "agent" else sorted(self.settings.teams)
        return ", ".join(names) or "none"

    def sticky_for(self, chat: ChatAddress, text: str) -> str | None:
        """The chat's sticky agent for a plain message ``text`` (None: route it normally)."""
        sticky = sticky_agents.sticky_agent(self.rt.db, chat)
        if not sticky or not self._known(sticky):
            return None
        routes = self.rt.queue.directory.routes  # the table the queue routes with, built once
        if routes.unknown_mention(text) is not None:
            return None  # "@nosuch ..." addresses nobody we know: the queue refuses it, the chat is told
        return None if routes.resolve(text).explicit else sticky  # "@other ..." still addresses other, once

    def unknown_mention_reply(self, message: Inbound, exc: UnknownMention) -> str:
        """The answer to ``@nosuch …``: nothing was sent, who can be addressed, and how."""
        agents = ", ".join(f"@{a}" for a in exc.agents) or "none"
        lines = [
            f"There is no agent or team called @{exc.name} here, so I did not send your message.",
            f"Agents: {agents}.",
        ]
        if exc.teams:
            lines.append("Teams: " + ", ".join(f"@{t}" for t in exc.teams) + ".")
        usual = self.chat_agent(message.address_on(self.name))
        example = exc.agents[0] if exc.agents else usual
        lines.append(
            f"Start your message with one of them (like “@{example} …”), or send it without the @name "
            f"to reach @{usual}."
        )
        return "\n".join(lines)

    def switch(self, message: Inbound, name: str) -> str | None:
        """``@name`` alone: make it the chat's default (``@default``: undo); the answer, or None when
        ``name`` is nobody we know (the text then goes to the agent like any message)."""
        db = self.rt.db
        if name == "default":
            sticky_agents.clear_sticky_agent(db, message.address_on(self.name))
            return (
                f"This chat is back to normal routing (default agent @{self.settings.queue.default_agent})."
            )
        kind = self._known(name)
        if not kind:
            return None  # not a name we know: the text goes to the agent like any message
        sticky_agents.set_sticky_agent(db, message.address_on(self.name), name)
        return f"Messages in this chat now go to {kind} @{name}. Send @default to undo."

    def chat_agent(self, chat: ChatAddress) -> str:
        """The agent a plain message of this chat goes to: the sticky agent (a team's leader), else the
        default agent."""
        target = sticky_agents.sticky_agent(self.rt.db, chat) or ""
        if self._known(target) == "team":
            return self.settings.teams[target].leader
        if self._known(target) == "agent":
            return target
        return self.settings.queue.default_agent

    # -- commands ---------------------------------------------------------------------------------------
    def run_command(self, message: Inbound, name: str, args: str) -> str:
        """Run one chat command (a name in :data:`COMMANDS`) and return the answer."""
        if name in ("help", "start"):
            return HELP_TEXT
        if name in ("agent", "team"):
            return self._cmd_agent(message, name, args)
        if name == "status":
            return self._cmd_status(message)
        if name in ("allow", "deny"):
            return answer_in_words(self.rt, message.address_on(self.name), name, args)
        if name == "stop":
            return self._cmd_stop(message)
        if name == "queue":
            return self._cmd_queue(message, args)
        if name in IN_TRANSACTION:
            with self.rt.db.transaction() as tx:
                return self.run_command_in(tx, message, name, args)
        if name == "usage":
            return self._cmd_usage(message)
        return self._cmd_reset(message, args)

    def _cmd_usage(self, message: Inbound) -> str:
        # The key the processor records runs under: ids are per platform. The sender's limits are those for
        # the agent this chat talks to ([budgets.agents.<name>] may override them).
        budgets = self.settings.budgets
        sender = f"{self.name}:{message.sender_id}"
        limits = budgets.for_agent(self.chat_agent(message.address_on(self.name)))
        now = now_ms()
        text = sender_usage_text(
            self.rt.db,
            sender,
            limits.sender_daily_usd,
            limits.sender_monthly_usd,
            now,
            exempt=sender in budgets.exempt_senders,
        )
        # The operator's chat ([channels.<name>] operator_chat) also sees what each agent spends.
        if self.config.operator_chat and message.conversation == self.config.operator_chat:
            text += "\n\n" + agents_usage_text(self.rt.db, budgets, self.settings.agents, now)
        return text

    def run_command_in(self, tx: Tx, message: Inbound, name: str, args: str) -> str:
        """Run one command of :data:`IN_TRANSACTION`, its effect written in ``tx``; the caller queues the
        answer returned in the same transaction."""
        if name == "retry":
            return self._cmd_retry(tx, message)
        raise ValueError(f"/{name} {args} is not run inside a transaction")

    def _cmd_retry(self, tx: Tx, message: Inbound) -> str:
        try:
            retried = self.rt.queue.admin.retry_last_failed_in(tx, message.address_on(self.name))
        except NotFound:
            return "There is no failed message in this chat to try again."
        except RetryBudgetExhausted:
            return (
                "That message was already tried again as often as allowed. Send it again as a new message, "
                "or type /reset first if the conversation seems stuck."
            )
        return f"Trying your message again with @{retried.agent} (ref {retried.message_id})."

    def _cmd_agent(self, message: Inbound, name: str, args: str) -> str:
        db = self.rt.db
        target = args.removeprefix("@").strip().lower()
        if not target:
            current = sticky_agents.sticky_agent(db, message.address_on(self.name))
            shown = f"@{current}" if current else f"normal routing (@{self.settings.queue.default_agent})"
            return f"This chat's default is {shown}. Known {name}s: {self._names(name)}."
        if target == "default":
            answer = self.switch(message, "default")
            assert answer is not None
            return answer
        if self._known(target) != name:
            return f"Unknown {name} {target!r}. Known {name}s: {self._names(name)}."
        sticky_agents.set_sticky_agent(db, message.address_on(self.name), target)
        return f"Messages in this chat now go to {name} @{target}. Send @default to undo."

    def _cmd_reset(self, message: Inbound, args: str) -> str:
        target = args.removeprefix("@").strip().lower()
        if not target:
            target = sticky_agents.sticky_agent(self.rt.db, message.address_on(self.name)) or ""
            target = target or self.settings.queue.default_agent
        kind = self._known(target)
        if not kind:
            return f"Unknown agent {target!r}. Known agents: {self._names('agent')}."
        agents = [target] if kind == "agent" else list(self.settings.teams[target].agents)
        for agent in agents:
            reset_conversation(self.rt, agent, message.address_on(self.name))
        shown = ", ".join(f"@{a}" for a in agents)
        return f"Started a fresh conversation with {shown}."

    def _cmd_status(self, message: Inbound) -> str:
        db = self.rt.db
        chat = message.address_on(self.name)
        status = conversation_status(db, None, chat)
        if not status["running"] and not status["waiting"]:
            # Nothing queued: still say whether the chat's agent is paused (a rate limit, say).
            status = conversation_status(db, self.chat_agent(chat), chat)
        extra = [line for line in (self._warm_line(chat), self._heard_line(chat)) if line]
        return "\n".join([format_status(status), *extra])

    def _heard_line(self, chat: ChatAddress) -> str | None:
        """What the chat's last voice note was heard as (adapters/voice.py), so its sender can check the
        words the agent worked from; None when it sent none lately."""
        heard = voice_heard.last_heard(self.rt.db, self.name, chat.conversation or "")
        if heard is None:
            return None
        words, at = heard
        shown = words if len(words) <= 1500 else words[:1500] + "…"
        return f'Your last voice note ({format_time(at)}) was heard as: "{shown}"'

    def _warm_line(self, chat: ChatAddress) -> str | None:
        """Whether the chat's agent is kept running for its next message (warm sessions), and if not, why;
        None where warm sessions are off or the agent's CLI cannot stay running."""
        if self.settings.processor.session_idle_seconds <= 0:
            return None
        agent = self.chat_agent(chat)
        config = self.settings.agents.get(agent)
        if config is None or config.provider != "claude":
            return None
        key = AGENT_SCOPE_KEY if config.session_scope == "agent" else chat.row_key
        kept, state = warm_state(self.rt.db, agent, key)
        in_all = f"{kept} kept ready in all"
        if state == "kept":
            return f"@{agent} is kept ready for this chat's next message ({in_all})."
        if state:
            return f"@{agent} starts afresh for this chat's next message: {state} ({in_all})."
        return None

    def _cmd_stop(self, message: Inbound) -> str:
        if not self.rt.queue.control.stop_chat(message.address_on(self.name)):
            return "Nothing is running for this chat."
        return "Stopping…"

    def _default_policy(self) -> str:
        own = getattr(self.config, "busy_policy", None)
        if own:
            return str(own)
        raw = self.settings.file.processor.get("busy_policy")
        try:
            return parse_busy_policy(str(raw)) if raw else "collect"
        except ValueError:
            return "collect"

    def _cmd_queue(self, message: Inbound, args: str) -> str:
        db = self.rt.db
        mode = args.strip().lower()
        choices = "|".join(BUSY_POLICIES)
        if not mode:
            own = get_busy_policy(db, message.address_on(self.name))
            current = own or self._default_policy()
            source = "" if own else " (the default)"
            return f"This chat's busy policy is {current}{source}: {_POLICY_HELP[current]}. Change it with /queue {choices}."
        try:
            stored = set_busy_policy(db, message.address_on(self.name), mode)
        except ValueError:
            return f"Unknown busy policy {mode!r}. Use /queue {choices} (or /queue default)."
        if stored is None:
            default = self._default_policy()
            return f"This chat is back to the default busy policy, {default}: {_POLICY_HELP[default]}."
        return f"Busy policy set to {stored}: {_POLICY_HELP[stored]}."


def reset_conversation(runtime: Runtime, agent: str, chat: ChatAddress) -> int:
    """Make ``agent`` start a fresh conversation for this chat, through the ``sessions`` table.

    The processor keys sessions by ``""`` (``session_scope = "agent"``) or the chat's
    :attr:`ChatAddress.row_key` (``"conversation"``), so the key cleared follows the agent's setting. Returns
    sessions cleared.
    """
    if not AGENT_NAME_RE.match(agent):
        raise InvalidInput(f"bad agent name {agent!r}")
    config = runtime.settings.agents.get(agent)
    scope = config.session_scope if config is not None else "agent"
    key = AGENT_SCOPE_KEY if scope == "agent" else chat.row_key
    approvals.forget_chat_rules(runtime.db, agent, chat)  # "allow for this chat" lasts until a /reset
    return clear_sessions(runtime.db, agent, key, reason=f"/reset in {chat.channel}")
