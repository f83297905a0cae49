"""Fault injection on chat commands: the real ``agentpost run telegram`` against the fake Bot API, SIGKILLed
while it records a command's update as seen, then restarted; the command must be answered exactly once.

A command is not a queued message, yet it must be taken in exactly like one: its answer, the "seen" mark of
its platform id (:mod:`shared.chat.dedupe`) and the Telegram offset commit together, or a crash between
them makes Telegram hand the update over again to an adapter that does not know it answered already.

The kill point is a PostgreSQL trigger on the write of the seen mark (as in :mod:`tests.fault_support`): the
adapter waits there, inside its real transaction, until the test kills it. No code of ours is changed for
it. Each chat-answered path of the channel base is covered: a command, ``@agent`` alone (a switch of the
chat's agent) and ``@nosuch …`` (refused with the names there are).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.runtime import Runtime
from tests.channel_support import HoldingTelegram, Proc, channel_home, telegram_env
from tests.fault_support import KillPoints, fresh_pg_database
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)
from tests.homes import open_home
from tests.probes import count, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(120)]

CHAT = 42
CHANNELS = {"telegram": {"allowlist": [str(CHAT)], "poll_timeout_seconds": 1, "typing": False}}
#: The advisory lock the kill point waits on (apart from tests.fault_support's).
SEEN_POINT = 7_311
_SEEN_TRIGGER = f"""
DROP TRIGGER IF EXISTS agentpost_test_hold_seen ON kv;
CREATE TRIGGER agentpost_test_hold_seen BEFORE INSERT ON kv FOR EACH ROW
  WHEN (NEW.scope = 'seen:telegram') EXECUTE FUNCTION agentpost_test_hold('{SEEN_POINT}');
"""


class SeenPoint:
    """The kill point "the adapter is writing the seen mark of an update" of one database."""

    def __init__(self, url: str) -> None:
        self.points = KillPoints(url)  # creates the waiting function the trigger calls
        self.conn = self.points.conn
        self.conn.execute(_SEEN_TRIGGER.encode())
        self.armed = False

    def arm(self) -> None:
        self.conn.execute("SELECT pg_advisory_lock(%s)", (SEEN_POINT,))
        self.armed = True

    def disarm(self) -> None:
        if self.armed:
            self.conn.execute("SELECT pg_advisory_unlock(%s)", (SEEN_POINT,))
            self.armed = False

    def waiting(self) -> int:
        row = self.conn.execute(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND ((classid::bigint << 32) | objid::bigint) = %s",
            (SEEN_POINT,),
        ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.disarm()
        self.points.close()


def _settled(rt: Runtime, fake: HoldingTelegram, offset: int) -> bool:
    """The update is confirmed to Telegram and every reply the adapter queued has been delivered."""
    return (
        fake.confirmed_offset >= offset
        and count(rt, "SELECT COUNT(*) FROM responses") > 0
        and count(rt, "SELECT COUNT(*) FROM responses WHERE status <> 'acked'") == 0
    )


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("/help", "Commands:"),
        ("@beta", "now go to agent @beta"),
        ("@nosuch hello", "There is no agent or team called @nosuch"),
    ],
    ids=["command", "agent-switch", "unknown-mention"],
)
def test_killed_while_marking_a_command_seen_answers_it_once(
    tmp_path: Path, fake: HoldingTelegram, text: str, answer: str
) -> None:
    with fresh_pg_database() as url:
        home = channel_home(tmp_path, url, CHANNELS)
        point = SeenPoint(url)
        rt = open_home(home)
        log = tmp_path / "telegram.log"
        try:
            point.arm()
            adapter = Proc("telegram", home, telegram_env(fake), log)
            try:
                update = fake.push_text(CHAT, text)
                wait_for(point.waiting, 30, "the adapter writing the update's seen mark")
            finally:
                adapter.kill()
            point.disarm()  # the killed adapter's transaction, if one waited there, now rolls back
            wait_for(lambda: point.waiting() == 0, 10, "the killed adapter's transaction to end")
            assert fake.confirmed_offset <= update["update_id"]  # Telegram hands the update over again
            restarted = Proc("telegram", home, telegram_env(fake), log)
            try:
                wait_for(lambda: _settled(rt, fake, update["update_id"] + 1), 30, "the answer delivered")
            finally:
                restarted.stop()
            answers = [t for t in fake.texts(CHAT) if answer in t]
            seen = count(rt, "SELECT COUNT(*) FROM kv WHERE scope = 'seen:telegram'")
        finally:
            rt.close()
            point.close()
    assert len(answers) == 1, f"the command was answered {len(answers)} times: {fake.texts(CHAT)}"
    assert seen == 1
