"""A chain's failure reaches the chat it started from (issue 39, item 3).

A user asks the team's leader; the leader hands part of the work to ``mate`` (``[@mate: …]``), whose run fails
for good. The user's chat gets one notice naming mate, with mate's message id as the ref, in the transaction
that buries mate's message; the leader's answers arrive once each. The real processor runs scripted agent
CLIs (the ``command`` provider) over SQLite and PostgreSQL; the user's chat is the CLI channel here, Telegram
and the dashboard's history in the second half.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from adapters.telegram import TelegramChannel
from shared.chat.address import ChatAddress
from shared.reads.conversations import conversation_history
from shared.runtime import Runtime
from tests.channel_support import HoldingTelegram, Proc, RunningChannel, run_cli
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)
from tests.processor_support import count, make_home, open_home, run_idle, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: The team's CLIs, by agent. The lead hands "check the numbers" to mate and "draw the chart" to helper,
#: and answers helper's report when it comes back; mate does what the file ``mate_mode`` beside the script
#: says: ``permanent`` (an error no retry cures), ``transient`` (exit 3), ``sleep`` (hang), else answer.
TEAM_SCRIPT = r"""
import os, sys, time
prompt = sys.stdin.read()
me = os.environ["AGENTPOST_AGENT"]
here = os.path.dirname(os.path.abspath(__file__))
if me == "lead":
    if "teammate @helper" in prompt:
        print("All done: the chart is ready.")
    elif "mate" in prompt.split():
        print("I will ask mate. [@mate: check the numbers]")
    else:
        print("I will ask mate and helper. [@mate: check the numbers] [@helper: draw the chart]")
elif me == "helper":
    print("Chart drawn. [@lead: the chart is ready]")
else:
    with open(os.path.join(here, "mate_runs.log"), "a") as log:
        log.write(f"{os.getpid()}\n")
    mode = open(os.path.join(here, "mate_mode")).read().strip()
    if mode == "permanent":
        print("error: the model was not found", file=sys.stderr)
        sys.exit(1)
    if mode == "transient":
        print("something broke", file=sys.stderr)
        sys.exit(3)
    if mode == "sleep":
        time.sleep(60)
    print("The numbers add up.")
"""

CLI_CHAT = ChatAddress("cli", "me")


def team_home(tmp: Path, db_url: str, mode: str, **queue: Any) -> Path:
    script = tmp / "team.py"
    script.write_text(TEAM_SCRIPT, encoding="utf-8")
    (tmp / "mate_mode").write_text(mode)
    agent = {"provider": "command", "command": [sys.executable, str(script)]}
    return make_home(
        tmp,
        db_url,
        {"lead": agent, "mate": agent, "helper": agent},
        teams={"crew": {"agents": ["lead", "mate", "helper"], "leader": "lead"}},
        queue=queue,
    )


def mate_message(rt: Runtime) -> dict[str, Any]:
    (row,) = rt.db.read("SELECT * FROM messages WHERE channel = 'internal' AND agent = 'mate'")
    return dict(row)


def chat_replies(rt: Runtime, chat: ChatAddress) -> list[dict[str, Any]]:
    rows = rt.db.read(
        "SELECT * FROM responses WHERE channel = :c AND conversation = :v ORDER BY id",
        {"c": chat.channel, "v": chat.conversation},
    )
    return [{**r, "metadata": json.loads(r["metadata"] or "{}")} for r in rows]


def notices(replies: list[dict[str, Any]]) -> list[str]:
    return [r["message"] for r in replies if r["metadata"].get("kind") == "dead_notice"]


def test_a_teammates_failure_is_told_once_in_the_chat_the_chain_started_from(
    tmp_path: Path, db_url: str
) -> None:
    home = team_home(tmp_path, db_url, "permanent")
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(CLI_CHAT, "@crew make the report")
        run_idle(rt, include_delayed=True)
        mate = mate_message(rt)
        replies = chat_replies(rt, CLI_CHAT)
        left = count(rt, "SELECT COUNT(*) FROM messages WHERE status NOT IN ('completed', 'dead')")
    tries = len((tmp_path / "mate_runs.log").read_text().split())
    assert mate["status"] == "dead" and tries == 1  # permanent: no retries
    texts = sorted(r["message"] for r in replies)
    (notice,) = notices(replies)
    # Everything else the chain said arrives once: the leader's reply, helper's, the leader's later answer.
    assert texts == sorted(
        [
            "**lead:** I will ask mate and helper. → @mate: check the numbers → @helper: draw the chart",
            "**helper:** Chart drawn. → @lead: the chart is ready",
            "All done: the chart is ready.",
            notice,
        ]
    )
    assert notice.startswith("Sorry — “mate” could not do its part of your request that “lead” handed to it")
    assert "the agent's program could not be started on the server" in notice
    assert notice.endswith(f"(ref {mate['message_id']})")
    words = notice.rsplit("(ref ", 1)[0]
    for internal in ("dead letter", "exited with code", "internal", "not found", "handoff"):
        assert internal not in words, internal
    assert left == 0
    # The ref is one `agentpost trace` tells the story of, saying where the notice went; and the CLI chat
    # shows the notice as the user reads it.
    trace = run_cli(home, "trace", mate["message_id"])
    assert trace.returncode == 0, trace.stderr
    assert "the chat its chain started from (cli:) was told" in " ".join(trace.stdout.split())
    shown = run_cli(home, "replies")
    assert shown.returncode == 0 and "“mate” could not do its part" in " ".join(shown.stdout.split())


def test_a_transient_failure_retried_to_dead_is_told_once_not_once_a_try(tmp_path: Path, db_url: str) -> None:
    home = team_home(tmp_path, db_url, "transient")
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(CLI_CHAT, "@crew ask mate")
        run_idle(rt, include_delayed=True)
        mate = mate_message(rt)
        replies = chat_replies(rt, CLI_CHAT)
    tries = len((tmp_path / "mate_runs.log").read_text().split())
    assert mate["status"] == "dead" and tries == 3  # max_retries = 3 in the test settings
    assert [r["message"] for r in replies if r["metadata"].get("kind") != "dead_notice"] == [
        "**lead:** I will ask mate. → @mate: check the numbers"
    ]
    (notice,) = notices(replies)
    assert "“mate” could not do its part of your request that “lead” handed to it after 3 tries" in notice
    assert "Type /retry" in notice and notice.endswith(f"(ref {mate['message_id']})")


def test_a_teammate_retried_by_hand_that_then_answers_is_not_told_again(
    tmp_path: Path, sqlite_url: str
) -> None:
    home = team_home(tmp_path, sqlite_url, "permanent")
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(CLI_CHAT, "@crew ask mate")
        run_idle(rt)
        ref = mate_message(rt)["message_id"]
        assert len(notices(chat_replies(rt, CLI_CHAT))) == 1
        (tmp_path / "mate_mode").write_text("answer")
        retried = run_cli(home, "dead", "retry", ref)
        assert retried.returncode == 0, retried.stderr
        run_idle(rt)
        replies = chat_replies(rt, CLI_CHAT)
        assert mate_message(rt)["status"] == "completed"
    assert [r["message"] for r in replies] == [
        "**lead:** I will ask mate. → @mate: check the numbers",
        replies[1]["message"],
        "**mate:** The numbers add up.",
    ]
    assert replies[1]["metadata"]["kind"] == "dead_notice"


def test_retry_in_the_chat_reaches_the_teammates_failed_part(tmp_path: Path, sqlite_url: str) -> None:
    # The notice says "Type /retry": in the chat the chain started from, that finds mate's message.
    home = team_home(tmp_path, sqlite_url, "transient")
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(CLI_CHAT, "@crew ask mate")
        run_idle(rt, include_delayed=True)
        ref = mate_message(rt)["message_id"]
        (tmp_path / "mate_mode").write_text("answer")
        again = rt.queue.admin.retry_last_failed(ChatAddress("cli", "me", "", ""))
        assert again.message_id == ref
        run_idle(rt)
        replies = chat_replies(rt, CLI_CHAT)
    assert replies[-1]["message"] == "**mate:** The numbers add up."
    assert len(notices(replies)) == 1


# Three teammates each hand the work on to both others: every branch reaches the hop limit.
HAND_ON = """
import os
me = os.environ["AGENTPOST_AGENT"]
others = [a for a in ("ann", "bob", "cat") if a != me]
print(f"{me} did a bit. " + " ".join(f"[@{o}: your turn]" for o in others))
"""


def test_handoffs_past_the_hop_limit_are_told_once_per_chain(tmp_path: Path, db_url: str) -> None:
    script = tmp_path / "hand_on.py"
    script.write_text(HAND_ON)
    agent = {"provider": "command", "command": [sys.executable, str(script)]}
    home = make_home(
        tmp_path,
        db_url,
        {"ann": agent, "bob": agent, "cat": agent},
        teams={"crew": {"agents": ["ann", "bob", "cat"], "leader": "ann"}},
        queue={"max_hops": 1, "max_chain_runs": 50},
    )
    chat = ChatAddress("telegram", "zoe", sender_id="9", conversation="c9")
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(chat, "@crew build it")
        run_idle(rt, timeout=60)
        refused = count(rt, "SELECT COUNT(*) FROM events WHERE type = 'chain_handoff_refused'")
        replies = chat_replies(rt, chat)
        refs = {
            r["message_id"] for r in rt.db.read("SELECT message_id FROM messages WHERE channel = 'internal'")
        }
    told = [r for r in replies if r["metadata"].get("kind") == "refused_notice"]
    assert refused == 4  # bob and cat each tried to hand on to two teammates
    assert len(told) == 1 and len(replies) == 4  # three answers, one notice
    text, ref = told[0]["message"].rsplit(" (ref ", 1)
    assert re.fullmatch(
        "“(bob|cat)” wanted to hand your request on to “(ann|bob)” and “(bob|cat)”, but it has already been "
        "handed from agent to agent once, which is as far as one request may go, so that part was not passed "
        "on. The answers so far are above; send a new message to carry on.",
        text,
    )
    assert ref.rstrip(")") in refs  # the teammate whose reply asked for the handoff


# -- Telegram and the dashboard -------------------------------------------------------------------------------
@contextmanager
def telegram_team(tmp_path: Path, fake: HoldingTelegram, mode: str) -> Iterator[Runtime]:
    """The Telegram adapter in-process and a processor process over one SQLite home running the team."""
    script = tmp_path / "team.py"
    script.write_text(TEAM_SCRIPT, encoding="utf-8")
    (tmp_path / "mate_mode").write_text(mode)
    agent = {"provider": "command", "command": [sys.executable, str(script)]}
    home = make_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        {"lead": agent, "mate": agent, "helper": agent},
        teams={"crew": {"agents": ["lead", "mate", "helper"], "leader": "lead"}},
        channels={"telegram": {"allowlist": ["42"], "poll_timeout_seconds": 1, "typing": False}},
        processor={"control_interval_seconds": 0.2},
    )
    rt = open_home(home)
    channel = TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    try:
        with RunningChannel(channel):
            yield rt
    finally:
        processor.stop()
        rt.close()


def test_a_teammates_failure_reaches_the_telegram_chat_and_the_dashboard_once(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    with telegram_team(tmp_path, fake, "permanent") as rt:
        fake.push_text(42, "@crew ask mate")
        wait_for(
            lambda: (
                count(rt, "SELECT COUNT(*) FROM messages WHERE status IN ('pending', 'processing')") == 0
                and count(rt, "SELECT COUNT(*) FROM messages WHERE status = 'dead'") == 1
                and count(rt, "SELECT COUNT(*) FROM responses WHERE status <> 'acked'") == 0
            ),
            40,
            "mate's failure told and every reply sent",
        )
        ref = mate_message(rt)["message_id"]
        history = conversation_history(rt.db, ChatAddress("telegram", conversation="42"))
        texts = fake.texts(42)
    assert texts[0] == "*lead:* I will ask mate. → @mate: check the numbers"
    assert len(texts) == 2, texts
    assert texts[1].startswith(
        "Sorry — “mate” could not do its part of your request that “lead” handed to it"
    )
    assert texts[1].endswith(f"(ref {ref})")
    # The dashboard's history of that chat shows the same notice, as a failure.
    shown = [i for i in history["items"] if i["kind"] == "reply"]
    assert [i["note"] for i in shown] == ["final", "dead_notice"]
    assert shown[1]["text"] == texts[1]
