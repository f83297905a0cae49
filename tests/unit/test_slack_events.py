"""What the Slack channel reads and writes without I/O (adapters/slack_events.py), and when `agentpost up`
starts it: conversation ids, which events are a person's message to the bot, slash commands, mrkdwn, which
errors are for good, and the variables it needs."""

from __future__ import annotations

from pathlib import Path

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.slack_response import SlackResponse

from adapters.slack_events import (
    classify_send_error,
    ephemeral,
    parse_event,
    parse_slash,
    slash_text,
    split_conversation,
    to_mrkdwn,
)
from scheduler.process_plan import plan_processes
from shared.settings.model import load_settings

pytestmark = pytest.mark.unit

BOT = "UBOT"


def _event(**fields: object) -> dict[str, object]:
    return {
        "type": "message",
        "channel": "D1",
        "user": "UANN",
        "text": "hi",
        "ts": "1700000000.000100",
        **fields,
    }


def test_conversations_are_channel_thread_and_private_recipient() -> None:
    assert split_conversation("C1") == ("C1", None, None)
    assert split_conversation("C1:1700000000.000100") == ("C1", "1700000000.000100", None)
    assert split_conversation(ephemeral("C1:1700000000.000100", "UANN")) == (
        "C1",
        "1700000000.000100",
        "UANN",
    )
    assert split_conversation("C1:not-a-ts") == ("C1", None, None)


def test_direct_messages_are_taken_channel_messages_only_when_they_mention_the_bot() -> None:
    dm = parse_event(_event(channel_type="im", text="a &lt;b&gt; &amp; c"), BOT)
    assert dm is not None and dm.inbound.text == "a <b> & c" and dm.inbound.conversation == "D1"
    assert dm.inbound.external_id == "D1:1700000000.000100" and dm.inbound.sent_at == 1700000000000
    room = {"channel": "C1", "channel_type": "channel"}
    assert parse_event(_event(**room, text="no mention"), BOT) is None
    threaded = parse_event(_event(**room, text="<@UBOT> go", thread_ts="1699999999.000001"), BOT)
    assert threaded is not None and threaded.inbound.text == "go"
    assert threaded.inbound.conversation == "C1:1699999999.000001"
    mention = parse_event(_event(type="app_mention", channel="C1", text="<@UBOT|agentpost> go"), BOT)
    assert mention is not None and mention.inbound.external_id == "C1:1700000000.000100"


@pytest.mark.parametrize(
    "fields",
    [
        {"user": BOT},
        {"bot_id": "B2", "user": "U2"},
        {"subtype": "message_changed"},
        {"subtype": "message_deleted"},
        {"subtype": "channel_join"},
        {"user": ""},
        {"type": "reaction_added"},
    ],
)
def test_what_is_not_a_persons_message_is_ignored(fields: dict[str, object]) -> None:
    assert parse_event(_event(channel_type="im", **fields), BOT) is None


def test_files_and_broadcasts_are_a_persons_message() -> None:
    shared = parse_event(_event(channel_type="im", subtype="file_share", files=[{"id": "F1"}]), BOT)
    assert shared is not None and shared.files == [{"id": "F1"}]
    assert parse_event(_event(channel_type="im", subtype="thread_broadcast"), BOT) is not None


def test_slash_commands_are_chat_commands() -> None:
    assert slash_text("/agentpost", "status") == "/status"
    assert slash_text("/agentpost", "  ") == "/help"
    assert slash_text("/agentpost", "/stop") == "/stop"
    assert slash_text("/queue", "collect") == "/queue collect"
    assert slash_text("/ap", "reset", own="/ap") == "/reset"
    inbound = parse_slash({"command": "/agentpost", "text": "status", "channel_id": "C1", "user_id": "U1"})
    assert inbound is not None and inbound.conversation == "C1" and inbound.text == "/status"
    assert parse_slash({"command": "/agentpost", "text": "status"}) is None


def test_markdown_becomes_mrkdwn_and_code_is_only_escaped() -> None:
    assert (
        to_mrkdwn("# Title\n**bold** and [docs](https://x.test/a)")
        == "*Title*\n*bold* and <https://x.test/a|docs>"
    )
    assert to_mrkdwn("a < b & c") == "a &lt; b &amp; c"
    assert to_mrkdwn("*italic* and **bold**\n* item\n2 * 3 * 4") == "_italic_ and *bold*\n* item\n2 * 3 * 4"
    assert to_mrkdwn("`**x**` and\n```\n**y** <z>\n```") == "`**x**` and\n```\n**y** &lt;z&gt;\n```"


def _error(status: int, error: str, headers: dict[str, str] | None = None) -> SlackApiError:
    response = SlackResponse(
        client=None,
        http_verb="POST",
        api_url="https://slack.test/api/chat.postMessage",
        req_args={},
        data={"ok": False, "error": error},
        headers=headers or {},
        status_code=status,
    )
    return SlackApiError("refused", response)


def test_rate_limits_wait_their_retry_after_and_lost_channels_fail_for_good() -> None:
    limited = classify_send_error(_error(429, "ratelimited", {"Retry-After": "7"}))
    assert not limited.permanent and limited.retry_after_seconds == 7.0
    for error in ("channel_not_found", "not_in_channel", "is_archived", "account_inactive"):
        failure = classify_send_error(_error(200, error))
        assert failure.permanent and error in failure.reason and failure.explanation, error
    assert not classify_send_error(_error(503, "service_unavailable")).permanent
    assert not classify_send_error(_error(200, "internal_error")).permanent
    assert not classify_send_error(ConnectionResetError("reset")).permanent


def test_up_starts_slack_with_its_token_and_one_way_to_receive(tmp_path: Path) -> None:
    (tmp_path / "settings.toml").write_text("")
    settings = load_settings(tmp_path, env={})

    def planned(env: dict[str, str]) -> tuple[list[str], list[str]]:
        plan = plan_processes(settings, env)
        return plan.names, [m for m in plan.missing if m.startswith("slack")]

    names, missing = planned({"SLACK_BOT_TOKEN": "xoxb-1"})
    assert "slack" not in names and "SLACK_APP_TOKEN or SLACK_SIGNING_SECRET" in missing[0]
    for way in ("SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"):
        names, missing = planned({"SLACK_BOT_TOKEN": "xoxb-1", way: "x"})
        assert "slack" in names and missing == [], way
    names, missing = planned({"SLACK_APP_TOKEN": "xapp-1"})
    assert "slack" not in names and "SLACK_BOT_TOKEN" in missing[0]
