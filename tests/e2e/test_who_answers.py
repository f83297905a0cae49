"""Who is answering, with real processes (``agentpost run telegram`` and ``agentpost run processor`` with the
scripted agent): ``@nosuch hi`` gets the list of agents and teams and nothing is queued; a team's replies
name the agent that wrote them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.channel_support import (
    HoldingTelegram,
    Proc,
    channel_home,
    count,
    open_home,
    telegram_env,
    wait_for,
)
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

CHANNELS = {"telegram": {"allowlist": ["42"], "poll_timeout_seconds": 1, "typing": False}}


def test_unknown_mention_gets_the_list_and_a_team_reply_names_its_agent(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    home = channel_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        CHANNELS,
        agents=("alpha", "beta", "gamma"),
        teams={"dev": {"agents": ["beta", "gamma"], "leader": "beta"}},
    )
    adapter = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    rt = open_home(home)
    try:
        fake.push_text(42, "@nosuch hi")
        wait_for(lambda: fake.texts(42), 20, "the answer to @nosuch")
        assert count(rt, "SELECT COUNT(*) FROM messages") == 0
        fake.push_text(42, "@dev please [@gamma: check this]")
        wait_for(lambda: len(fake.texts(42)) == 3, 40, "the leader's and the teammate's replies")
    finally:
        adapter.stop()
        processor.stop()
        rt.close()
    unknown, leader, teammate = fake.texts(42)
    assert unknown.startswith(
        "There is no agent or team called @nosuch here, so I did not send your message."
    )
    assert "Agents: @alpha, @beta, @gamma." in unknown and "Teams: @dev." in unknown
    assert leader.startswith("*beta:* beta got:") and leader.endswith("→ @gamma: check this")
    assert teammate.startswith("*gamma:* gamma got:") and teammate.endswith("check this")
