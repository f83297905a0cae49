"""The Slack adapter in-process against the fake Slack (tests/fakes/slack_api.py), with slack_sdk's own
clients: Socket Mode envelopes acknowledged after the message is committed, signed Events API requests
(forged and old ones refused with 401, Slack's retries taken once), threads as conversations, slash
commands, files both ways, previews grown by chat.update, and Slack's refusals classified."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adapters import doctor
from adapters.slack import SlackChannel
from adapters.web.console import channel_rows
from shared.chat import previews
from shared.chat.address import ChatAddress
from shared.cli.doctor import Check
from shared.queue import approvals
from shared.runtime import Runtime
from shared.settings.model import load_settings
from tests.approval_support import ask_for_bash
from tests.channel_support import (
    RunningChannel,
    channel_home,
    count,
    free_port,
    open_home,
    slack_env,
    wait_for,
)
from tests.fakes.slack_api import (
    FakeSlack,
    block_actions,
    event_callback,
    message_event,
    new_ts,
    post_signed,
    signed_headers,
    slash_form,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SECRET = "slack-signing-secret"
ANN, STRANGER = "UANN", "USTRANGER"
DM, ROOM = "D0ANN", "C0ROOM"
SETTINGS = {"slack": {"allowlist": [ANN], "typing": False}}


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    with FakeSlack() as server:
        server.add_user(ANN, "Ann")
        yield server


def _home(tmp_path: Path, channels: dict[str, object] | None = None) -> Path:
    return channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels or SETTINGS)


def _rows(rt: Runtime) -> list[dict[str, object]]:
    return rt.db.read(
        "SELECT message, sender, sender_id, conversation, external_id FROM messages ORDER BY id"
    )


def test_socket_mode_takes_in_dms_and_mentions_in_threads_and_acks_after_commit(
    tmp_path: Path, fake: FakeSlack
) -> None:
    with open_home(_home(tmp_path)) as rt, RunningChannel(SlackChannel(rt, env=slack_env(fake))):
        fake.wait_connected()
        dm = fake.push_event(message_event(DM, ANN, "hello &amp; welcome"))
        fake.wait_ack(dm)
        # Acknowledged only once committed: the row is there when the ack is.
        assert count(rt, "SELECT COUNT(*) FROM messages") == 1
        top = new_ts()
        mention = message_event(ROOM, ANN, "<@UBOT> look at this", thread_ts=top, channel_type="channel")
        fake.wait_ack(fake.push_event(mention))
        # The same mention as an app_mention event is the same message.
        fake.wait_ack(fake.push_event({**mention, "type": "app_mention"}))
        # Not for us: no mention in a channel, the bot's own message, an edit, a join.
        for ignored in (
            message_event(ROOM, ANN, "just chatting", channel_type="channel"),
            message_event(DM, "UBOT", "my own echo"),
            message_event(DM, ANN, "edited", subtype="message_changed"),
            message_event(ROOM, ANN, "<@UBOT> joined", subtype="channel_join", channel_type="channel"),
            message_event(DM, "UOTHERBOT", "beep", bot_id="BOTHER"),
        ):
            fake.wait_ack(fake.push_event(ignored))
        rows = _rows(rt)
        rt.queue.responses.enqueue_response(
            ChatAddress("slack", "Ann", sender_id=ANN, conversation=f"{ROOM}:{top}"),
            "**done**: see <here>",
        )
        sent = fake.wait_sent(lambda s: s.kind == "post" and s.channel == ROOM)
        dashboard = {row["channel"]: row for row in channel_rows(rt.db)}  # GET /api/channels/health
    assert [(r["message"], r["conversation"], r["sender"]) for r in rows] == [
        ("hello & welcome", DM, "Ann"),
        ("look at this", f"{ROOM}:{top}", "Ann"),
    ]
    assert rows[1]["external_id"] == f"{ROOM}:{mention['ts']}"
    assert sent.thread_ts == top  # answered in the thread it came from
    assert sent.text == "*done*: see &lt;here&gt;"  # Slack's mrkdwn, escaped
    assert dashboard["slack"]["state"] == "up"  # the dashboard's channel health shows it connected


def test_slash_commands_over_socket_mode_and_http(tmp_path: Path, fake: FakeSlack) -> None:
    home, port = _home(tmp_path), free_port()
    with open_home(home) as rt:
        with RunningChannel(SlackChannel(rt, env=slack_env(fake))):
            fake.wait_connected()
            fake.wait_ack(fake.push_slash("/agentpost", "queue followup", channel=DM, user=ANN))
            by_socket = fake.wait_sent(lambda s: s.channel == DM)
        with RunningChannel(SlackChannel(rt, env=slack_env(fake, secret=SECRET, port=port))):
            url = f"http://127.0.0.1:{port}/slack/commands"
            wait_for(lambda: _answers(url), 10, "the events server")
            # A command the app registered under its own name.
            form = slash_form("/queue", "collect", channel=DM, user=ANN)
            assert post_signed(url, SECRET, form, form=True).status_code == 200
            by_http = fake.wait_sent(lambda s: s.channel == DM and s is not by_socket)
        queued = count(rt, "SELECT COUNT(*) FROM messages")
    assert queued == 0  # commands, not messages for the agent
    assert "followup" in by_socket.text and "collect" in by_http.text


def _answers(url: str) -> bool:
    try:
        return httpx.post(url, content=b"{}").status_code == 401
    except httpx.HTTPError:
        return False


def test_events_api_checks_signatures_and_takes_a_retry_once(tmp_path: Path, fake: FakeSlack) -> None:
    port = free_port()
    with (
        open_home(_home(tmp_path)) as rt,
        RunningChannel(SlackChannel(rt, env=slack_env(fake, secret=SECRET, port=port))),
    ):
        url = f"http://127.0.0.1:{port}/slack/events"
        wait_for(lambda: _answers(url), 10, "the events server")
        challenge = post_signed(url, SECRET, {"type": "url_verification", "challenge": "c-42"})
        assert challenge.json() == {"challenge": "c-42"}
        payload = event_callback(message_event(DM, ANN, "forged long=20"))
        assert post_signed(url, "not-the-secret", payload).status_code == 401
        old = int(time.time()) - 6 * 60
        assert post_signed(url, SECRET, payload, timestamp=old).status_code == 401
        unsigned = httpx.post(url, json=payload)
        assert unsigned.status_code == 401
        body = b'{"type": "event_callback"}'
        tampered = {**signed_headers(SECRET, body), "Content-Type": "application/json"}
        assert httpx.post(url, content=body + b" ", headers=tampered).status_code == 401
        assert count(rt, "SELECT COUNT(*) FROM messages") == 0  # nothing queued
        real = event_callback(message_event(DM, ANN, "the real one"))
        assert post_signed(url, SECRET, real).status_code == 200
        assert post_signed(url, SECRET, real, retry_num=1).status_code == 200  # Slack's retry
        rows = _rows(rt)
    assert [r["message"] for r in rows] == ["the real one"]


def test_files_in_are_downloaded_for_known_senders_only(tmp_path: Path, fake: FakeSlack) -> None:
    with open_home(_home(tmp_path)) as rt, RunningChannel(SlackChannel(rt, env=slack_env(fake))):
        fake.wait_connected()
        files = []
        for user, channel in ((ANN, DM), (STRANGER, "D0STRANGER")):
            shared = fake.add_file("notes.txt", b"ann's notes\n")
            files.append(shared["id"])
            fake.wait_ack(fake.push_event(message_event(channel, user, "read this", files=[shared])))
        message = rt.db.read_scalar("SELECT message FROM messages")
        code = fake.wait_sent(lambda s: s.channel == "D0STRANGER")
    assert message.startswith("read this\n[file: ")
    saved = Path(message.split("[file: ")[1].rstrip("]"))
    assert saved.read_bytes() == b"ann's notes\n" and saved.name.endswith("notes.txt")
    assert "pairing code is" in code.text
    assert fake.downloads == files[:1]  # Ann's file, with the bot token; the stranger's was never fetched


def test_a_file_that_cannot_be_fetched_leaves_the_message_taken_in_and_says_so(
    tmp_path: Path, fake: FakeSlack
) -> None:
    gone = {**fake.add_file("gone.txt", b"x"), "url_private_download": f"{fake.url}/files/F99999999/gone.txt"}
    foreign = {**fake.add_file("leak.txt", b"x"), "url_private_download": "http://127.0.0.2:9/leak.txt"}
    with open_home(_home(tmp_path)) as rt, RunningChannel(SlackChannel(rt, env=slack_env(fake))):
        fake.wait_connected()
        fake.wait_ack(fake.push_event(message_event(DM, ANN, "two files", files=[gone, foreign])))
        message = rt.db.read_scalar("SELECT message FROM messages")
    # Acknowledged and queued, not redelivered for ever; the token never went to another host.
    assert message == "two files\n(could not download: gone.txt, leak.txt)"
    assert fake.downloads == []


def test_a_stranger_in_a_channel_gets_the_code_privately(tmp_path: Path, fake: FakeSlack) -> None:
    with open_home(_home(tmp_path)) as rt, RunningChannel(SlackChannel(rt, env=slack_env(fake))):
        fake.wait_connected()
        top = new_ts()
        event = message_event(ROOM, STRANGER, "<@UBOT> hi", thread_ts=top, channel_type="channel")
        fake.wait_ack(fake.push_event(event))
        code = fake.wait_sent(lambda s: s.channel == ROOM)
    assert code.kind == "ephemeral" and code.user == STRANGER and code.thread_ts == top
    assert "pairing code is" in code.text
    assert fake.texts(ROOM, top) == []  # nothing public


def test_previews_grow_by_chat_update_and_end_as_the_final(tmp_path: Path, fake: FakeSlack) -> None:
    chat = ChatAddress("slack", "Ann", sender_id=ANN, conversation=DM)

    def stream(text: str) -> None:
        rt.db.run_transaction(
            lambda tx: previews.put_partial(tx, ChatAddress("slack", conversation=DM), "run-1", text, ["m1"])
        )

    with open_home(_home(tmp_path)) as rt, RunningChannel(SlackChannel(rt, env=slack_env(fake))):
        fake.wait_connected()
        stream("The answer is")
        first = fake.wait_sent(lambda s: s.kind == "post" and s.channel == DM)
        stream("The answer is forty")
        fake.wait_sent(lambda s: s.kind == "update" and s.text.startswith("The answer is forty"))

        def done(tx: object) -> None:
            previews.clear_partial_in(tx, ChatAddress("slack", conversation=DM), "run-1")  # type: ignore[arg-type]

        rt.queue.responses.enqueue_response(
            chat,
            "The answer is forty-two.",
            metadata={"kind": "final", "edit_key": "run-1"},
            message_id="m1",
            also=done,
        )
        wait_for(lambda: fake.shown(DM, first.ts) == "The answer is forty-two.", 10, "the final")
    posts = [s for s in fake.sent if s.channel == DM and s.kind == "post"]
    assert posts == [first]  # one message, edited in place: the preview became the final
    updates = [s.text for s in fake.sent if s.kind == "update"]
    assert updates[-1] == "The answer is forty-two." and len(updates) >= 2


def test_rate_limits_are_waited_out_and_refusals_fail_for_good(tmp_path: Path, fake: FakeSlack) -> None:
    fake.archived.add("C0ARCHIVED")
    with open_home(_home(tmp_path)) as rt, RunningChannel(SlackChannel(rt, env=slack_env(fake))):
        fake.wait_connected()
        fake.rate_limit_next("chat.postMessage", retry_after=1)
        began = time.monotonic()
        rt.queue.responses.enqueue_response(ChatAddress("slack", "Ann", ANN, DM), "after the limit")
        fake.wait_sent(lambda s: s.text == "after the limit")
        waited = time.monotonic() - began
        rt.queue.responses.enqueue_response(ChatAddress("slack", "Ann", ANN, "C0ARCHIVED"), "lost cause")
        wait_for(
            lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'failed'") == 1, 10, "failed"
        )
        error = rt.db.read_scalar("SELECT last_error FROM responses WHERE status = 'failed'")
    limited = [c for c in fake.calls if c.method == "chat.postMessage" and c.status == 429]
    assert len(limited) == 1 and waited >= 1.0  # the SDK waited Retry-After, then sent it again
    assert "is_archived" in error
    assert sum(1 for c in fake.calls if c.error == "is_archived") == 1  # not retried


def test_doctor_tries_the_token_and_names_missing_scopes(tmp_path: Path) -> None:
    home = _home(tmp_path)

    def slack_check(fake: FakeSlack, **env: str) -> Check:
        settings = load_settings(home, env={**slack_env(fake), **env})
        return next(c for c in doctor.checks(settings) if c.name == "slack")

    with FakeSlack() as full:
        good = slack_check(full)
        bad_token = slack_check(full, SLACK_BOT_TOKEN="xoxb-wrong")
        bad_app_token = slack_check(full, SLACK_APP_TOKEN="xapp-wrong")
        no_way_in = slack_check(full, SLACK_APP_TOKEN="")
    with FakeSlack(scopes="chat:write,im:history") as narrow:
        narrowed = slack_check(narrow)
    with FakeSlack(scopes="im:history") as mute:
        muted = slack_check(mute)
    assert good.level == "ok" and "Socket Mode" in good.detail
    assert (
        bad_token.level == "fail"
        and "SLACK_BOT_TOKEN" in bad_token.detail
        and "invalid_auth" in bad_token.detail
    )
    assert bad_app_token.level == "fail" and "SLACK_APP_TOKEN" in bad_app_token.detail
    assert no_way_in.level == "fail" and "SLACK_APP_TOKEN or SLACK_SIGNING_SECRET" in no_way_in.detail
    assert (
        narrowed.level == "warn" and "files:write" in narrowed.detail and "chat:write" not in narrowed.detail
    )
    assert muted.level == "fail" and "chat:write" in muted.detail


def _ask(rt: Runtime, conversation: str) -> str:
    """An agent's question before a tool runs, asked in ``conversation`` (as the processor asks it)."""
    chat = ChatAddress("slack", "Ann", sender_id=ANN, conversation=conversation)
    return ask_for_bash(
        rt, chat, "slack_question1", command="make deploy", run_id="run-1", timeout_ms=60_000
    ).id


def test_a_question_has_buttons_only_the_asker_can_press_and_ends_as_its_answer(
    tmp_path: Path, fake: FakeSlack
) -> None:
    top = new_ts()
    with open_home(_home(tmp_path)) as rt, RunningChannel(SlackChannel(rt, env=slack_env(fake))):
        fake.wait_connected()
        approval_id = _ask(rt, f"{ROOM}:{top}")
        question = fake.wait_sent(lambda s: s.kind == "post" and bool(s.buttons))
        labels = [b["text"]["text"] for b in question.buttons]
        allow = next(b for b in question.buttons if b["text"]["text"] == "Allow")
        fake.wait_ack(fake.push_press(question, allow, user=STRANGER))
        refused = fake.wait_sent(lambda s: s.kind == "ephemeral" and s.user == STRANGER)
        still = approvals.get(rt.db, approval_id)
        fake.wait_ack(fake.push_press(question, allow, user=ANN))
        told = fake.wait_sent(lambda s: s.kind == "ephemeral" and s.user == ANN)
        closed = fake.wait_sent(lambda s: s.kind == "update" and s.ts == question.ts)
        decided = approvals.get(rt.db, approval_id)
    assert question.channel == ROOM and question.thread_ts == top  # asked in the thread
    assert labels == ["Allow", "Deny", "Allow for this chat"]
    assert still is not None and still.status == "pending" and "Ann" in refused.text
    assert decided is not None and decided.status == "allowed" and refused.thread_ts == told.thread_ts == top
    assert closed.buttons == [] and closed.text  # the question became its answer, buttons gone


def test_a_press_over_http_is_signed_and_answers_once(tmp_path: Path, fake: FakeSlack) -> None:
    port = free_port()
    env = slack_env(fake, secret=SECRET, port=port)
    with open_home(_home(tmp_path)) as rt, RunningChannel(SlackChannel(rt, env=env)):
        url = f"http://127.0.0.1:{port}/slack/events"
        wait_for(lambda: _answers(url), 10, "the events server")
        approval_id = _ask(rt, DM)
        question = fake.wait_sent(lambda s: s.kind == "post" and bool(s.buttons))
        deny = next(b for b in question.buttons if b["text"]["text"] == "Deny")
        form = {"payload": json.dumps(block_actions(DM, question.ts, deny, user=ANN))}
        assert post_signed(url, "not-the-secret", form, form=True).status_code == 401
        assert approvals.get(rt.db, approval_id).status == "pending"  # type: ignore[union-attr]
        assert post_signed(url, SECRET, form, form=True).status_code == 200
        assert post_signed(url, SECRET, form, form=True).status_code == 200  # pressed twice
        wait_for(lambda: len([s for s in fake.sent if s.kind == "ephemeral"]) == 2, 10, "both presses told")
        told = [s.text for s in fake.sent if s.kind == "ephemeral"]
        decided = approvals.get(rt.db, approval_id)
    assert decided is not None and decided.status == "denied"
    assert told[0] != told[1]  # the second press is told the request was already answered


def test_a_rate_limit_outlasting_the_sdks_retries_holds_the_reply_for_its_retry_after(
    tmp_path: Path, fake: FakeSlack
) -> None:
    settings = {
        "slack": {**SETTINGS["slack"], "rate_limit_retries": 0, "delivery_backoff_base_seconds": 0.05}
    }
    with open_home(_home(tmp_path, settings)) as rt, RunningChannel(SlackChannel(rt, env=slack_env(fake))):
        fake.wait_connected()
        fake.rate_limit_next("chat.postMessage", retry_after=2)
        rt.queue.responses.enqueue_response(ChatAddress("slack", "Ann", ANN, DM), "after the wait")
        fake.wait_sent(lambda s: s.text == "after the wait")
    posts = [c for c in fake.calls if c.method == "chat.postMessage"]
    assert [c.status for c in posts] == [429, 200]
    assert posts[1].at - posts[0].at >= 2.0  # not the 0.05 s backoff: Slack's Retry-After


def test_socket_mode_reconnects_when_slack_asks_and_nothing_is_lost(tmp_path: Path, fake: FakeSlack) -> None:
    with open_home(_home(tmp_path)) as rt, RunningChannel(SlackChannel(rt, env=slack_env(fake))):
        fake.wait_connected()
        fake.ask_to_reconnect()
        fake.wait_connected(2)
        fake.wait_ack(fake.push_event(message_event(DM, ANN, "after the refresh")))
        rows = _rows(rt)
    assert [r["message"] for r in rows] == ["after the refresh"]
    assert [c.method for c in fake.calls].count("apps.connections.open") == 2  # a fresh URL for the new one


def test_a_socket_that_stays_down_stops_the_adapter_and_its_health_says_why(
    tmp_path: Path, fake: FakeSlack
) -> None:
    settings = {"slack": {**SETTINGS["slack"], "socket_down_seconds": 1.0}}
    with open_home(_home(tmp_path, settings)) as rt:
        running = RunningChannel(SlackChannel(rt, env=slack_env(fake)))
        try:
            fake.wait_connected()
            fake.ask_to_reconnect()  # a brief drop is the SDK's to mend: the adapter goes on
            fake.wait_connected(2)
            fake.drop_socket()
            wait_for(lambda: channel_rows(rt.db)[0]["state"] == "stopped", 20, "the adapter to stop")
            row = channel_rows(rt.db)[0]
        finally:
            with pytest.raises(ConnectionError, match="Socket Mode connection has been down"):
                running.stop()
    assert "Socket Mode connection has been down" in row["error"]
