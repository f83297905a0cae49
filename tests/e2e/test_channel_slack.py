"""The Slack adapter as a real process (``agentpost run slack``) against the fake Slack, with a real
processor running a scripted agent: over Socket Mode and over the Events API a stranger is paired and then
answered in the channel and thread they wrote in; forged and old requests are refused and queue nothing;
kill -9 mid-delivery and between receiving and committing loses nothing and repeats at most the chunk in
flight."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adapters.chunking import split_message
from adapters.slack import SlackChannel
from shared.chat.address import ChatAddress
from tests.channel_support import (
    Proc,
    channel_home,
    count,
    free_port,
    open_home,
    run_cli,
    slack_env,
    wait_for,
)
from tests.fakes.slack_api import FakeSlack, event_callback, message_event, new_ts, post_signed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

SECRET = "slack-signing-secret"
ANN, STRANGER = "UANN", "USTRANGER"
DM, ROOM = "D0ANN", "C0ROOM"
CHANNELS = {"slack": {"allowlist": [ANN], "typing": False}}
APPROVED = "You're approved — answering your message now."


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    with FakeSlack() as server:
        server.add_user(ANN, "Ann")
        server.add_user(STRANGER, "Stranger")
        yield server


def _home(tmp_path: Path) -> Path:
    return channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", CHANNELS)


def _pair_and_approve(home: Path, fake: FakeSlack, top: str) -> None:
    """The stranger's code came privately in the thread; the operator approves it."""
    code_message = fake.wait_sent(lambda s: s.kind == "ephemeral" and s.user == STRANGER)
    assert code_message.channel == ROOM and code_message.thread_ts == top
    code = re.search(r"pairing code is (\w{8})", code_message.text)
    assert code is not None, code_message.text
    approved = run_cli(home, "pairing", "approve", code.group(1))
    assert approved.returncode == 0, approved.stderr


def _answered_in_thread(fake: FakeSlack, top: str, asked: str) -> list[str]:
    wait_for(lambda: any(asked in t for t in fake.texts(ROOM, top)), 40, "the answer in the thread")
    return fake.texts(ROOM, top)


def test_socket_mode_pairs_a_stranger_then_answers_in_the_thread(tmp_path: Path, fake: FakeSlack) -> None:
    home = _home(tmp_path)
    adapter = Proc("slack", home, slack_env(fake), tmp_path / "slack.log")
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    top = new_ts()
    try:
        adapter.wait_output("Socket Mode connected")
        asked = message_event(
            ROOM, STRANGER, "<@UBOT> what is in the box", thread_ts=top, channel_type="channel"
        )
        fake.wait_ack(fake.push_event(asked))
        _pair_and_approve(home, fake, top)
        texts = _answered_in_thread(fake, top, "alpha got: what is in the box")
        fake.wait_ack(fake.push_event(message_event(DM, ANN, "send me file=notes.txt")))
        shared = fake.wait_sent(lambda s: s.kind == "file" and s.channel == DM)
    finally:
        adapter.stop()
        processor.stop()
    assert texts.index(APPROVED) < next(i for i, t in enumerate(texts) if "what is in the box" in t)
    assert sum("alpha got: what is in the box" in t for t in texts) == 1  # one final reply
    assert fake.texts(ROOM) == []  # nothing at the channel's top level: all of it in the thread
    assert (shared.filename, shared.data) == ("notes.txt", b"file notes.txt made by alpha\n")


def test_events_api_refuses_forgeries_pairs_a_stranger_and_answers_in_the_thread(
    tmp_path: Path, fake: FakeSlack
) -> None:
    home = _home(tmp_path)
    port = free_port()
    adapter = Proc("slack", home, slack_env(fake, secret=SECRET, port=port), tmp_path / "slack.log")
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    url = f"http://127.0.0.1:{port}/slack/events"
    top = new_ts()
    rt = open_home(home)
    try:
        adapter.wait_output("Slack events listening")
        forged = event_callback(message_event(DM, ANN, "forged long=20"))
        assert post_signed(url, "not-the-secret", forged).status_code == 401
        assert post_signed(url, SECRET, forged, timestamp=int(time.time()) - 301).status_code == 401
        assert httpx.post(url, json=forged).status_code == 401
        assert count(rt, "SELECT COUNT(*) FROM messages") == 0
        event = message_event(
            ROOM, STRANGER, "<@UBOT> what is in the box", thread_ts=top, channel_type="channel"
        )
        payload = event_callback(event)
        assert post_signed(url, SECRET, payload).status_code == 200
        assert post_signed(url, SECRET, payload, retry_num=1).status_code == 200  # Slack's retry: the same
        _pair_and_approve(home, fake, top)
        texts = _answered_in_thread(fake, top, "alpha got: what is in the box")
        stored = rt.db.read("SELECT message, conversation FROM messages")
    finally:
        rt.close()
        adapter.stop()
        processor.stop()
    assert stored == [{"message": "what is in the box", "conversation": f"{ROOM}:{top}"}]
    assert sum("alpha got: what is in the box" in t for t in texts) == 1
    assert all("forged" not in s.text for s in fake.sent)


def test_sigkill_mid_reply_resumes_without_duplicates_or_gaps(tmp_path: Path, fake: FakeSlack) -> None:
    home = _home(tmp_path)
    text = "\n\n".join(f"Section {i}: " + "word " * 300 for i in range(1, 7))
    expected = split_message(text.strip(), SlackChannel.limit)
    assert len(expected) == 3
    log = tmp_path / "slack.log"
    adapter = Proc("slack", home, slack_env(fake), log)
    rt = open_home(home)
    try:
        adapter.wait_output("Socket Mode connected")
        fake.hold_post(2)  # the second chunk hangs in flight ...
        rt.queue.responses.enqueue_response(ChatAddress("slack", "Ann", sender_id=ANN, conversation=DM), text)
        assert fake.held.wait(20), adapter.output()
        adapter.kill()  # ... and the adapter dies with it
        fake.release()
        assert fake.texts(DM) == expected[:1]
        assert count(rt, "SELECT delivered FROM responses") == 1
        restarted = Proc("slack", home, slack_env(fake), log)
        try:
            wait_for(
                lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'acked'") == 1, 30, "ack"
            )
        finally:
            restarted.stop()
    finally:
        rt.close()
    assert fake.texts(DM) == expected  # every chunk exactly once, in order


def test_killed_between_receiving_and_committing_the_envelope_comes_again(
    tmp_path: Path, fake: FakeSlack
) -> None:
    home = _home(tmp_path)
    log = tmp_path / "slack.log"
    adapter = Proc("slack", home, slack_env(fake, AGENTPOST_TEST_PAUSE_AFTER_FETCH="60"), log)
    rt = open_home(home)
    try:
        adapter.wait_output("Socket Mode connected")
        envelope = fake.push_event(message_event(DM, ANN, "do not lose me"))
        adapter.wait_output("test hook: paused")
        adapter.kill()
        assert count(rt, "SELECT COUNT(*) FROM messages") == 0
        assert envelope not in fake.acks  # Slack still holds it
        restarted = Proc("slack", home, slack_env(fake), log)
        try:
            fake.wait_ack(envelope)
            rows = rt.db.read("SELECT message, conversation FROM messages")
        finally:
            restarted.stop()
    finally:
        rt.close()
    assert rows == [{"message": "do not lose me", "conversation": DM}]
    assert fake.connections == 2


def test_http_killed_before_commit_is_unanswered_and_the_retry_is_taken(
    tmp_path: Path, fake: FakeSlack
) -> None:
    home = _home(tmp_path)
    port = free_port()
    log = tmp_path / "slack.log"
    env = slack_env(fake, secret=SECRET, port=port)
    adapter = Proc("slack", home, {**env, "AGENTPOST_TEST_PAUSE_AFTER_FETCH": "60"}, log)
    url = f"http://127.0.0.1:{port}/slack/events"
    payload = event_callback(message_event(DM, ANN, "keep me"))
    rt = open_home(home)
    try:
        adapter.wait_output("Slack events listening")
        outcome: list[object] = []

        def post() -> None:
            try:
                outcome.append(post_signed(url, SECRET, payload))
            except httpx.HTTPError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=post)
        thread.start()
        adapter.wait_output("test hook: paused")
        adapter.kill()
        thread.join(10)
        assert outcome and isinstance(outcome[0], httpx.HTTPError)  # never answered: Slack retries
        restarted = Proc("slack", home, env, log)
        try:
            wait_for(
                lambda: "Slack events listening" in restarted.output().split("test hook")[-1], 30, "restart"
            )
            assert post_signed(url, SECRET, payload, retry_num=1).status_code == 200
        finally:
            restarted.stop()
        assert count(rt, "SELECT COUNT(*) FROM messages") == 1
    finally:
        rt.close()


def test_missing_secrets_name_the_variables(tmp_path: Path) -> None:
    home = _home(tmp_path)
    no_token = run_cli(home, "run", "slack", env={"SLACK_BOT_TOKEN": "", "SLACK_APP_TOKEN": "xapp-1"})
    assert no_token.returncode == 2 and "SLACK_BOT_TOKEN" in no_token.stderr.replace("\n", " ")
    no_way_in = run_cli(
        home,
        "run",
        "slack",
        env={"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "", "SLACK_SIGNING_SECRET": ""},
    )
    said = no_way_in.stderr.replace("\n", " ")
    assert no_way_in.returncode == 2 and "SLACK_APP_TOKEN" in said and "SLACK_SIGNING_SECRET" in said
    assert "Traceback" not in no_token.stderr + no_way_in.stderr
