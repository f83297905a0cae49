"""One key rule for the rows kept per chat: what a channel writes for a chat (``/queue``, ``/agent``) is what
the processor and the channel read back for it — also for a chat with no conversation of its own, which the
queue names by its sender id — and rows an earlier release wrote under the conversation alone are still
found in a database written that way."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.platform import Inbound
from shared.chat import agents, sticky_agents
from shared.chat.address import ChatAddress
from shared.chat.prefs import get_busy_policy, set_busy_policy
from shared.storage import kv
from shared.storage.kv import Scope, scoped
from tests.liveness_support import claude_home
from tests.processor_support import open_home
from workers.busy import resolve_policy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

#: A chat the platform gives no conversation id: the queue names it by the sender id ("u7").
NO_CONVERSATION = Inbound(
    conversation="", sender_id="u7", sender="ann", text="/queue interrupt", external_id=""
)


def test_a_policy_set_from_a_chat_is_the_one_its_runs_follow(tmp_path: Path, sqlite_url: str) -> None:
    home = claude_home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        chat = NO_CONVERSATION.address_on("web")
        # What the channel's /queue command stores for the chat it came from...
        assert set_busy_policy(rt.db, chat, "interrupt") == "interrupt"
        rt.queue.intake.enqueue_message(ChatAddress("web", "ann", sender_id="u7"), "work", agent="coder")
        (claimed,) = rt.queue.messages.claim_all_pending_messages("coder", "w1")
        # ...is what the processor reads for the chat of the message it claimed.
        assert resolve_policy(rt.db, rt.settings, "collect", claimed.address) == "interrupt"
        # Another sender without a conversation is another chat: the default applies there.
        other = ChatAddress("web", "bob", "u8")
        assert resolve_policy(rt.db, rt.settings, "collect", other) == "collect"
        # The processor's record of who answered is the chat the channel asks about.
        agents.record_answer(rt.db, claimed.address, "coder")
        assert agents.answered_by(rt.db, chat) == ["coder"]


def test_rows_written_under_the_earlier_rule_are_still_found(tmp_path: Path, sqlite_url: str) -> None:
    home = claude_home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        # Rows as earlier releases wrote them for a chat without a conversation: keyed by the empty
        # conversation, not the sender id.
        with rt.db.transaction() as tx:
            kv.put(tx, Scope.BUSY_POLICY, "web:", "followup")
            kv.put(tx, scoped(Scope.CHAT_AGENT, "web"), "", "beta")
            kv.put(tx, Scope.CHAT_AGENTS, "web:|alpha", "alpha")
            # A chat with a conversation was keyed the same under both rules.
            kv.put(tx, Scope.BUSY_POLICY, "telegram:42", "interrupt")
            kv.put(tx, scoped(Scope.CHAT_AGENT, "telegram"), "42", "gamma")
        chat = NO_CONVERSATION.address_on("web")
        assert get_busy_policy(rt.db, chat) == "followup"
        # The processor reads it too (before, only the channel's /queue did).
        assert resolve_policy(rt.db, rt.settings, "collect", chat) == "followup"
        assert sticky_agents.sticky_agent(rt.db, chat) == "beta"
        assert agents.answered_by(rt.db, chat) == ["alpha"]
        group = Inbound(conversation="42", sender_id="7", sender="bob", text="", external_id="")
        telegram = group.address_on("telegram")
        assert get_busy_policy(rt.db, telegram) == "interrupt"
        assert resolve_policy(rt.db, rt.settings, "collect", telegram) == "interrupt"
        assert sticky_agents.sticky_agent(rt.db, telegram) == "gamma"

        # Changing the chat's choice writes under the one rule and retires the earlier row, so the new
        # choice is what both sides read.
        assert set_busy_policy(rt.db, chat, "default") is None
        assert get_busy_policy(rt.db, chat) is None
        assert kv.get(rt.db, Scope.BUSY_POLICY, "web:") is None
        assert sticky_agents.clear_sticky_agent(rt.db, chat) is True
        assert sticky_agents.sticky_agent(rt.db, chat) is None
        sticky_agents.set_sticky_agent(rt.db, chat, "alpha")
        assert kv.get(rt.db, scoped(Scope.CHAT_AGENT, "web"), "u7") == "alpha"
