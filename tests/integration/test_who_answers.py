"""Who is answering: ``@nosuch hi`` is answered with the agents and teams and nothing is queued; replies
name their agent where it isn't obvious (a teammate answers, or the chat has talked to more than one
agent); messages folded into one run are acknowledged once at the top of the reply.

The Telegram adapter runs in-process against the fake Bot API, the processor runs the scripted command
agent (``tests.channel_support.AGENT_SCRIPT``) or the real Claude CLI against the fake Messages API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.telegram import TelegramChannel
from shared.chat.address import ChatAddress
from shared.queue.core import UnknownMention
from shared.runtime import Runtime
from shared.settings.routing import Team, unknown_mention
from tests.channel_support import HoldingTelegram, RunningChannel, channel_home, count, open_home, wait_for
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)
from tests.processor_support import run_idle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

TELEGRAM = {"telegram": {"allowlist": ["42", "43"], "poll_timeout_seconds": 1, "typing": False}}
TEAMS = {"dev": {"agents": ["beta", "gamma"], "leader": "beta"}}


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    home = channel_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        TELEGRAM,
        agents=("alpha", "beta", "gamma"),
        teams=TEAMS,
        queue={"debounce_ms": 0},
    )
    runtime = open_home(home)
    yield runtime
    runtime.close()


def _telegram(rt: Runtime, fake: HoldingTelegram) -> TelegramChannel:
    return TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})


def _say(fake: HoldingTelegram, chat: int, text: str) -> None:
    update = fake.push_text(chat, text)
    fake.wait_for_offset(update["update_id"] + 1, 10)


def test_unknown_mention_tells_apart_names_and_text() -> None:
    agents, teams = {"alpha", "beta"}, {"dev": Team("dev", ("beta",), "beta")}
    assert unknown_mention("@nosuch hi", agents, teams) == "nosuch"
    assert unknown_mention("  @NoSuch: hi", agents, teams) == "NoSuch"
    assert unknown_mention("@nosuch", agents, teams) == "nosuch"
    for known in ("@alpha hi", "@ALPHA hi", "@dev build", "@default", "@Default hi"):
        assert unknown_mention(known, agents, teams) is None, known
    for text in ("hi @nosuch", "@nosuch's idea", "email@nosuch", "@ 5pm", "@-x hi", "@" + "a" * 33, "plain"):
        assert unknown_mention(text, agents, teams) is None, text
    assert unknown_mention("@carol hi", agents, teams, known={"carol"}) is None


def test_queue_refuses_an_unknown_mention_and_keeps_other_paths(rt: Runtime) -> None:
    with pytest.raises(UnknownMention) as refused:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), "@nosuch hi")
    assert (refused.value.name, refused.value.agents, refused.value.teams) == (
        "nosuch",
        ["alpha", "beta", "gamma"],
        ["dev"],
    )
    assert "@nosuch is not an agent or team here" in str(refused.value)
    assert count(rt, "SELECT COUNT(*) FROM messages") == 0
    assert count(rt, "SELECT COUNT(*) FROM events WHERE type = 'message_received'") == 0
    # An agent chosen explicitly (API field), or an agent's own message, is not second-guessed.
    assert (
        rt.queue.intake.enqueue_message(ChatAddress("api", "ann"), "@john please review", agent="beta").agent
        == "beta"
    )
    assert rt.queue.intake.enqueue_message(
        ChatAddress("internal", "beta"), "@zed hi", from_agent="beta", agent="gamma"
    ).agent
    assert rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), "@Gamma hi").agent == "gamma"


def test_unknown_mention_on_telegram_gets_the_list_and_nothing_is_queued(
    rt: Runtime, fake: HoldingTelegram
) -> None:
    with RunningChannel(_telegram(rt, fake)):
        _say(fake, 42, "@nosuch hi there")
        _say(fake, 43, "/agent gamma")
        _say(fake, 43, "@ghost are you there?")  # a sticky agent does not swallow it either
        _say(fake, 43, "@beta hello")  # known names still route
        wait_for(lambda: len(fake.texts(42)) == 1 and len(fake.texts(43)) == 2, 10, "the answers")
    (answer,) = fake.texts(42)
    assert answer.startswith("There is no agent or team called @nosuch here, so I did not send your message.")
    assert "Agents: @alpha, @beta, @gamma." in answer and "Teams: @dev." in answer
    assert "to reach @alpha" in answer
    ghost = fake.texts(43)[1]
    assert "@ghost" in ghost and "to reach @gamma" in ghost  # the chat's sticky agent
    rows = rt.db.read("SELECT conversation, agent, message FROM messages ORDER BY id")
    assert [dict(r) for r in rows] == [{"conversation": "43", "agent": "beta", "message": "@beta hello"}]
    # Answered, so a redelivery of the update is not answered twice.
    assert count(rt, "SELECT COUNT(*) FROM responses WHERE conversation = '42'") == 1


def test_replies_name_their_agent_where_it_is_not_obvious(rt: Runtime, fake: HoldingTelegram) -> None:
    with RunningChannel(_telegram(rt, fake)):
        # One agent so far: its reply needs no name.
        _say(fake, 43, "hello")
        run_idle(rt)
        wait_for(lambda: len(fake.texts(43)) == 1, 10, "the first reply")
        # A second agent in the same chat: from now on every reply there is named.
        _say(fake, 43, "@beta hi")
        run_idle(rt)
        wait_for(lambda: len(fake.texts(43)) == 2, 10, "beta's reply")
        _say(fake, 43, "again")
        run_idle(rt)
        wait_for(lambda: len(fake.texts(43)) == 3, 10, "alpha's second reply")
        # A team: the leader hands work on (named), the teammate answers in the chat (named).
        _say(fake, 42, "@dev please [@gamma: check this]")
        run_idle(rt)
        wait_for(lambda: len(fake.texts(42)) == 2, 10, "the leader's and the teammate's replies")
    # (The scripted agent echoes the end of its prompt; a team member's prompt starts with team instructions.)
    first, second, third = fake.texts(43)
    assert first == "alpha got: hello"
    assert second.startswith("*beta:* beta got:") and second.endswith("@beta hi")
    assert third == "*alpha:* alpha got: again"
    leader, teammate = fake.texts(42)
    assert leader.startswith("*beta:* beta got:") and leader.endswith("@dev please → @gamma: check this")
    assert teammate.startswith("*gamma:* gamma got:") and teammate.endswith("check this")
    speakers = [
        json.loads(str(r["metadata"])).get("speaker")
        for r in rt.db.read("SELECT metadata FROM responses WHERE conversation = '42' ORDER BY id")
    ]
    assert speakers == ["beta", "gamma"]


def test_messages_folded_into_one_run_are_acknowledged_once(rt: Runtime, fake: HoldingTelegram) -> None:
    with RunningChannel(_telegram(rt, fake)):
        for text in ("first thought", "second thought", "third thought"):
            _say(fake, 42, text)  # all three wait: no processor runs yet
        stats = run_idle(rt)
        assert stats.invocations == 1
        _say(fake, 42, "a lone one")
        run_idle(rt)
        wait_for(lambda: len(fake.texts(42)) == 2, 10, "both replies")
    folded, lone = fake.texts(42)
    first_line, rest = folded.split("\n", 1)
    assert first_line == "(Answering your 3 messages together.)"
    assert rest.startswith("alpha got:") and "third thought" in rest
    assert lone == "alpha got: a lone one"  # one message: no note
