"""Fault injection on what a chat message changes besides its own answer: the real ``agentpost run telegram``
against the fake Bot API, SIGKILLed inside the transaction that takes the message in, then restarted.

- ``/retry`` puts the chat's dead letter back *and* answers "Trying your message again". Both, with the
  update's seen mark, must commit together: a crash between them left a retried message whose chat was never
  told, and the redelivered ``/retry`` then answered "There is no failed message" (or retried an older one).
- A user whose earlier reply could not be delivered is told so when they write again. The notice record is
  removed and the note queued in one transaction: a crash between them lost the note for good.

The kill point is a PostgreSQL trigger (as in :mod:`tests.e2e.test_faults_chat_commands`): the adapter waits
on it inside its real transaction until the test kills it. No code of ours is changed for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from shared.worker_identity import new_worker_id
from tests.channel_support import HoldingTelegram, Proc, channel_home, telegram_env
from tests.fault_support import KillPoints, fresh_pg_database
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)
from tests.homes import open_home
from tests.probes import count, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(120)]

CHAT = 42
CHANNELS = {"telegram": {"allowlist": [str(CHAT)], "poll_timeout_seconds": 1, "typing": False}}
#: The advisory lock the kill points wait on (apart from tests.fault_support's and the seen point's).
HOLD_POINT = 7_312
#: The adapter writing the seen mark of an update: the last write of a command's transaction.
SEEN_TRIGGER = f"""
DROP TRIGGER IF EXISTS agentpost_test_hold_effect ON kv;
CREATE TRIGGER agentpost_test_hold_effect BEFORE INSERT ON kv FOR EACH ROW
  WHEN (NEW.scope = 'seen:telegram') EXECUTE FUNCTION agentpost_test_hold('{HOLD_POINT}');
"""
#: The adapter queueing the note about an undelivered reply.
NOTE_TRIGGER = f"""
DROP TRIGGER IF EXISTS agentpost_test_hold_effect ON responses;
CREATE TRIGGER agentpost_test_hold_effect BEFORE INSERT ON responses FOR EACH ROW
  WHEN (NEW.metadata LIKE '%undelivered_notice%') EXECUTE FUNCTION agentpost_test_hold('{HOLD_POINT}');
"""
RETRIED = "Trying your message again"
NOTE = "could not be delivered"


class HoldPoint:
    """One kill point of a database: the write its trigger names waits while the point is armed."""

    def __init__(self, url: str, trigger: str) -> None:
        self.points = KillPoints(url)  # creates the waiting function the trigger calls
        self.conn = self.points.conn
        self.conn.execute(trigger.encode())
        self.armed = False

    def arm(self) -> None:
        self.conn.execute("SELECT pg_advisory_lock(%s)", (HOLD_POINT,))
        self.armed = True

    def disarm(self) -> None:
        if self.armed:
            self.conn.execute("SELECT pg_advisory_unlock(%s)", (HOLD_POINT,))
            self.armed = False

    def waiting(self) -> int:
        row = self.conn.execute(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND ((classid::bigint << 32) | objid::bigint) = %s",
            (HOLD_POINT,),
        ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.disarm()
        self.points.close()


def _chat() -> ChatAddress:
    return ChatAddress("telegram", "ann", sender_id=str(CHAT), conversation=str(CHAT))


def _kill_inside(
    tmp_path: Path, home: Path, fake: HoldingTelegram, point: HoldPoint, text: str
) -> dict[str, int]:
    """Send ``text``, SIGKILL the adapter while it waits at ``point``, and start it again; returns the
    update (Telegram hands it over again: it was not confirmed)."""
    log = tmp_path / "telegram.log"
    point.arm()
    adapter = Proc("telegram", home, telegram_env(fake), log)
    try:
        update: dict[str, int] = fake.push_text(CHAT, text)
        wait_for(point.waiting, 30, "the adapter inside its transaction")
    finally:
        adapter.kill()
    point.disarm()  # the killed adapter's transaction, if one waited there, now rolls back
    wait_for(lambda: point.waiting() == 0, 10, "the killed adapter's transaction to end")
    assert fake.confirmed_offset <= update["update_id"]
    return update


def _settled(rt: Runtime, fake: HoldingTelegram, offset: int) -> bool:
    """The update is confirmed to Telegram and every reply still to send has been sent."""
    return (
        fake.confirmed_offset >= offset
        and count(rt, "SELECT COUNT(*) FROM responses WHERE status IN ('pending', 'delivering')") == 0
    )


def test_killed_between_a_retry_and_its_answer_retries_once_and_says_so(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    with fresh_pg_database() as url:
        home = channel_home(tmp_path, url, CHANNELS)
        point = HoldPoint(url, SEEN_TRIGGER)
        rt = open_home(home)
        try:
            # A message of this chat that failed for good (no processor runs here: a retried one stays
            # pending, so what the kill left is what the test sees).
            dead = rt.queue.intake.enqueue_message(_chat(), "please summarise", agent="alpha").message_id
            worker = new_worker_id()
            assert rt.queue.messages.claim_all_pending_messages("alpha", worker)
            rt.queue.failures.fail_messages([dead], worker, "refused", permanent=True, explanation="refused")
            rt.queue.leases.release_agent("alpha", worker)

            update = _kill_inside(tmp_path, home, fake, point, "/retry")
            restarted = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
            try:
                wait_for(lambda: _settled(rt, fake, update["update_id"] + 1), 30, "the answer delivered")
            finally:
                restarted.stop()
            message = rt.queue.admin.get_message(dead)
        finally:
            rt.close()
            point.close()
    texts = fake.texts(CHAT)
    assert message is not None
    # Before the fix: retried by the killed adapter, then "There is no failed message in this chat".
    assert [t for t in texts if RETRIED in t or "no failed message" in t] == [
        f"Trying your message again with @alpha (ref {dead})."
    ], texts
    assert (message.status, message.manual_retries) == ("pending", 1)


def test_killed_while_noting_an_undelivered_reply_notes_it_once(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    with fresh_pg_database() as url:
        home = channel_home(tmp_path, url, CHANNELS)
        point = HoldPoint(url, NOTE_TRIGGER)
        rt = open_home(home)
        try:
            # A reply the platform refused for good: the chat is owed a note the next time the user writes.
            lost = rt.queue.responses.enqueue_response(_chat(), "the answer that never arrived")
            worker = new_worker_id()
            assert [r.id for r in rt.queue.responses.claim_responses_for_channel("telegram", worker)] == [
                lost.id
            ]
            assert rt.queue.responses.fail_response(
                lost.id,
                "Forbidden: bot was blocked",
                worker=worker,
                explanation="Telegram: the bot was blocked",
            )

            update = _kill_inside(tmp_path, home, fake, point, "hello again")
            restarted = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
            try:
                wait_for(
                    lambda: (
                        _settled(rt, fake, update["update_id"] + 1)
                        and count(rt, "SELECT COUNT(*) FROM messages") == 1
                    ),
                    30,
                    "the message taken in and every note sent",
                )
            finally:
                restarted.stop()
        finally:
            rt.close()
            point.close()
    notes = [t for t in fake.texts(CHAT) if NOTE in t]
    # Before the fix: the notice was removed by the killed adapter and never queued (0 notes).
    assert len(notes) == 1, fake.texts(CHAT)
    assert "Telegram: the bot was blocked" in notes[0] and lost.message_id in notes[0]
