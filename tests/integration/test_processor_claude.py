"""The processor with the real Claude Code CLI (``node_modules/.bin/claude``) against the fake Messages API.

Each test writes a home folder (SQLite file or PostgreSQL), enqueues messages through the queue, runs a
processor until the queue is idle, and checks the rows and events it left, and what the fake API received.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.chat.sessions import clear_sessions, get_session
from shared.file_access import chat_upload_dir
from shared.runtime import Runtime
from tests.fakes.anthropic_api import ApiError, Computed, FakeAnthropic, RateLimited, Text, last_user_text
from tests.fakes.claude_env import claude_binary, claude_env
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import group_gone
from tests.processor_support import count, event_types, make_home, open_home, run_idle, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _env(api: FakeAnthropic, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "user-home"
    home.mkdir(exist_ok=True)
    # The processor finds the CLI in the project's node_modules; PATH deliberately does not have it.
    return claude_env(api.base_url, home, max_retries=0)


def _home(tmp_path: Path, db_url: str, **agents: dict[str, object]) -> Path:
    agents = agents or {"coder": {}}
    return make_home(
        tmp_path, db_url, {n: {"provider": "claude", "timeout_seconds": 30, **a} for n, a in agents.items()}
    )


def _responses(rt: Runtime) -> list[dict[str, object]]:
    return [dict(r) for r in rt.db.read("SELECT * FROM responses ORDER BY id")]


def test_reply_reaches_responses_with_events_and_history(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("what is 2+2", Text("It is 4."))
    home = _home(tmp_path, db_url, coder={"model": "claude-test-model", "system_prompt": "Be terse."})
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="chat-7"), "what is 2+2"
        )
        stats = run_idle(rt, env=_env(api, tmp_path))
        assert stats.invocations == 1
        (resp,) = _responses(rt)
        assert resp["message"] == "It is 4."
        assert (resp["channel"], resp["sender_id"], resp["conversation"]) == ("telegram", "42", "chat-7")
        assert resp["message_id"] == sent.message_id
        assert rt.queue.admin.get_message(sent.message_id).status == "completed"  # type: ignore[union-attr]
        types = event_types(rt, sent.message_id)
        for expected in (
            "message_received",
            "message_claimed",
            "chain_step_start",
            "agent_progress",
            "chain_step_done",
            "response_ready",
        ):
            assert expected in types, (expected, types)
        assert (
            types.index("chain_step_start") < types.index("agent_progress") < types.index("chain_step_done")
        )
        # The run's end event times the first text the real CLI streamed (/metrics' time to first text).
        (done,) = rt.db.read("SELECT payload FROM events WHERE type = 'chain_step_done'")
        end = json.loads(str(done["payload"]))
        assert 0 < end["first_text_ms"] <= end["duration_ms"] + 5_000
        turns = rt.db.read("SELECT role, content FROM agent_messages WHERE agent_id = 'coder' ORDER BY id")
        assert [(t["role"], t["content"]) for t in turns] == [
            ("user", "what is 2+2"),
            ("assistant", "It is 4."),
        ]
        workspace = rt.settings.workspace("coder")
        assert (workspace / "AGENTS.md").exists() and (workspace / "heartbeat.md").exists()
    (request,) = api.main_requests()
    assert request.body["model"] == "claude-test-model"
    assert "Be terse." in str(request.body.get("system"))
    assert request.last_user_text == "what is 2+2"


def test_continue_then_reset_starts_a_new_conversation(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule(
        None, Computed(lambda body: f"turns={sum(1 for m in body['messages'] if m['role'] == 'user')}")
    )
    home = _home(tmp_path, sqlite_url, coder={"session_scope": "agent"})  # one shared conversation
    env = _env(api, tmp_path)
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "first")
        run_idle(rt, env=env)
        assert get_session(rt.db, "coder") is not None
        rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "second")
        run_idle(rt, env=env)
        clear_sessions(rt.db, "coder")
        assert get_session(rt.db, "coder") is None
        rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "third")
        run_idle(rt, env=env)
        replies = [r["message"] for r in _responses(rt)]
    turns = [r.user_turns for r in api.main_requests()]
    assert turns == [1, 2, 1], (
        turns
    )  # the resume carried the first turn into the second; the reset dropped both
    assert replies[2] == "turns=1"


def test_conversation_scope_resumes_per_chat(tmp_path: Path, sqlite_url: str, api: FakeAnthropic) -> None:
    home = _home(tmp_path, sqlite_url, coder={"session_scope": "conversation"})
    env = _env(api, tmp_path)
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(ChatAddress("discord", "a", conversation="A"), "hello from A")
        rt.queue.intake.enqueue_message(ChatAddress("discord", "b", conversation="B"), "hello from B")
        run_idle(rt, env=env)
        rt.queue.intake.enqueue_message(ChatAddress("discord", "a", conversation="A"), "again from A")
        run_idle(rt, env=env)
        assert get_session(rt.db, "coder", "discord:A") != get_session(rt.db, "coder", "discord:B")
    by_text = {r.last_user_text: r.user_turns for r in api.main_requests()}
    assert by_text == {"hello from A": 1, "hello from B": 1, "again from A": 2}


def test_handoff_reaches_teammate_and_answer_goes_to_the_user(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("build the thing", Text("On it. [@reviewer: please review the plan]"))
    api.add_rule("please review the plan", Text("Reviewed: looks good."))
    home = make_home(
        tmp_path,
        sqlite_url,
        {"lead": {"provider": "claude"}, "reviewer": {"provider": "claude"}},
        teams={"dev": {"agents": ["lead", "reviewer"], "leader": "lead"}},
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), "@dev build the thing"
        )
        assert sent.agent == "lead"
        stats = run_idle(rt, env=_env(api, tmp_path))
        assert stats.invocations == 2
        responses = _responses(rt)
        # Both are named: the leader's reply hands work on, and the teammate is not the agent addressed.
        assert [r["message"] for r in responses] == [
            "*lead:* On it. → @reviewer: please review the plan",
            "*reviewer:* Reviewed: looks good.",
        ]
        assert all(
            (r["channel"], r["sender_id"], r["conversation"]) == ("telegram", "42", "c1") for r in responses
        )
        internal = rt.db.read("SELECT * FROM messages WHERE channel = 'internal'")
        assert len(internal) == 1 and internal[0]["agent"] == "reviewer" and internal[0]["hops"] == 1
        assert internal[0]["from_agent"] == "lead" and internal[0]["status"] == "completed"
        assert "chain_handoff" in event_types(rt, sent.message_id)
    reviewer_request = next(r for r in api.main_requests() if "please review" in r.last_user_text)
    assert "@lead" in reviewer_request.last_user_text and "On it." in reviewer_request.last_user_text


def test_a_teammates_failure_is_told_in_the_chat_the_chain_started_from(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    # The reviewer's request is refused for good: the user, who saw the leader hand it on, is told so, once.
    api.add_rule("build the thing", Text("On it. [@reviewer: please review the plan]"))
    api.add_rule("please review the plan", ApiError("this request is not acceptable"))
    home = make_home(
        tmp_path,
        db_url,
        {"lead": {"provider": "claude"}, "reviewer": {"provider": "claude"}},
        teams={"dev": {"agents": ["lead", "reviewer"], "leader": "lead"}},
    )
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), "@dev build the thing"
        )
        stats = run_idle(rt, env=_env(api, tmp_path), include_delayed=True)
        (internal,) = rt.db.read("SELECT * FROM messages WHERE channel = 'internal'")
        responses = _responses(rt)
    assert stats.invocations == 2 and internal["status"] == "dead"
    assert [r["message"] for r in responses] == [
        "*lead:* On it. → @reviewer: please review the plan",
        "Sorry — “reviewer” could not do its part of your request that “lead” handed to it: the AI service "
        "refused this request (it said: “this request is not acceptable”). The other agents' answers do not "
        "include it. Trying it again would fail the same way; ask in other words, or ask the operator to look "
        f"it up. (ref {internal['message_id']})",
    ]
    assert all(
        (r["channel"], r["sender_id"], r["conversation"]) == ("telegram", "42", "c1") for r in responses
    )
    assert json.loads(str(responses[1]["metadata"]))["kind"] == "dead_notice"


def test_handoff_loop_stops_at_the_hop_limit(tmp_path: Path, sqlite_url: str, api: FakeAnthropic) -> None:
    # Each agent hands straight back to the other: ping -> pong -> ping -> (refused).
    api.add_rule(
        None,
        Computed(
            lambda body: "[@ping: ping]" if "teammate @ping" in last_user_text(body) else "[@pong: ping]"
        ),
    )
    home = make_home(
        tmp_path,
        sqlite_url,
        {"ping": {"provider": "claude"}, "pong": {"provider": "claude"}},
        teams={"table": {"agents": ["ping", "pong"], "leader": "ping"}},
        queue={"max_hops": 2},
    )
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "ping")
        stats = run_idle(rt, env=_env(api, tmp_path))
        hops = sorted(int(r["hops"]) for r in rt.db.read("SELECT hops FROM messages"))
        assert hops == [0, 1, 2]  # the third handoff (hops 3) was refused
        assert stats.invocations == 3
        assert count(rt, "SELECT COUNT(*) FROM events WHERE type = 'chain_handoff_refused'") == 1
        assert count(rt, "SELECT COUNT(*) FROM messages WHERE status <> 'completed'") == 0


def test_a_transient_api_error_retries_with_one_edited_note_then_one_plain_notice(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule(
        "explode", ApiError("scripted failure", status=500, error_type="api_error", should_retry=False)
    )
    home = _home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("whatsapp", "bo", sender_id="555"), "explode")
        started = time.monotonic()
        stats = run_idle(rt, env=_env(api, tmp_path), include_delayed=True)
        assert time.monotonic() - started < 30
        assert stats.invocations == 3  # max_retries = 3 in the test settings
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "dead" and msg.retry_count == 3
        assert "scripted failure" in (msg.last_error or "")
        *notes, notice = _responses(rt)
        # While it was retried the chat saw one note (edited in place: one edit key) saying so.
        assert len(notes) == 2 and all('"progress"' in str(n["metadata"]) for n in notes)
        assert len({str(n["metadata"]).split("edit_key")[1] for n in notes}) == 1
        assert "trying again in" in str(notes[0]["message"]) and "attempt 2 of 3" in str(notes[0]["message"])
        text = str(notice["message"])
        assert "dead_notice" in str(notice["metadata"]) and notice["sender_id"] == "555"
        assert "temporary problem" in text and "/retry" in text and sent.message_id in text
        for internal in ("API Error", "api_error", "dead letter", "operator to retry", "500"):
            assert internal not in text, internal
        failed = rt.db.read("SELECT payload FROM events WHERE type = 'message_failed' ORDER BY id")
        assert len(failed) == 2
        assert count(rt, "SELECT COUNT(*) FROM events WHERE type = 'chain_step_start'") == 3


def test_a_reply_after_a_retry_closes_the_trying_again_note(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("flaky", ApiError("hiccup", status=500, error_type="api_error", should_retry=False), times=1)
    api.add_rule("flaky", Text("fine now"))
    home = _home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c"), "flaky"
        )
        stats = run_idle(rt, env=_env(api, tmp_path), include_delayed=True)
        assert stats.invocations == 2
        note, final = _responses(rt)
        assert "trying again" in str(note["message"]) and final["message"] == "fine now"
        note_meta, final_meta = (json.loads(str(r["metadata"])) for r in (note, final))
        assert note_meta["kind"] == "progress" and final_meta["kind"] == "final"
        assert note_meta["edit_key"] == final_meta["edit_key"]  # the reply closes the note


@pytest.mark.parametrize("scope", ["agent", "conversation"])
def test_a_refused_message_fails_at_once_and_leaves_no_trace_in_the_conversation(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic, scope: str
) -> None:
    api.add_rule("first question", Text("first answer"))
    api.add_rule("poison", ApiError("this request is not acceptable"))
    api.add_rule("second question", Text("second answer"))
    home = _home(tmp_path, sqlite_url, coder={"session_scope": scope})
    env = _env(api, tmp_path)
    with open_home(home) as rt:

        def send(text: str) -> str:
            return rt.queue.intake.enqueue_message(
                ChatAddress("telegram", "ann", sender_id="42", conversation="chat-7"), text
            ).message_id

        send("first question")
        run_idle(rt, env=env)
        poison = send("poison")
        stats = run_idle(rt, env=env, include_delayed=True)
        assert stats.invocations == 1  # refused for good: no retries burnt
        dead = rt.queue.admin.get_message(poison)
        assert dead is not None and dead.status == "dead"
        # One CLI run (stats.invocations above). Within it the CLI itself re-sends a 400'd request a few
        # times, dropping one beta header each time (its fallback for proxies without betas): all of them
        # carry the same single user turn, so none of it comes from a retry of ours.
        refused = [r for r in api.main_requests() if r.last_user_text.endswith("poison")]
        assert refused and all(r.user_turns == refused[0].user_turns for r in refused)
        api.clear()
        send("second question")
        run_idle(rt, env=env)
        replies = [str(r["message"]) for r in _responses(rt)]
        assert replies[0] == "first answer" and replies[-1] == "second answer"
        (notice,) = replies[1:-1]  # exactly one explanation for the refused message
        assert "refused" in notice and "this request is not acceptable" in notice and poison in notice
        assert "api_error" not in notice and "invalid_request_error" not in notice
        # The next request continues the conversation as it was before the refused message.
        (request,) = api.main_requests()
        body = str(request.body)
        assert "first question" in body and "first answer" in body
        assert "poison" not in body


def test_timeout_kills_the_cli_and_its_process_group(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("slow", Text("too late", delay=60))
    home = _home(tmp_path, sqlite_url, coder={"timeout_seconds": 2})
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "slow please")
        started = time.monotonic()
        run_idle(rt, env=_env(api, tmp_path))
        assert time.monotonic() - started < 15
        done = rt.db.read("SELECT payload FROM events WHERE type = 'chain_step_done'")
        assert '"timed_out":true' in done[0]["payload"]
        pid = int(re.search(r'"pid":(\d+)', done[0]["payload"]).group(1))  # type: ignore[union-attr]
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "pending" and "timed out" in (msg.last_error or "")
        (note,) = _responses(rt)  # no answer: only the note that it is being tried again
        assert '"progress"' in str(note["metadata"]) and "time limit" in str(note["message"])
    wait_for(lambda: group_gone(pid), 5, f"process group {pid} to be gone")


def test_send_file_attaches_only_the_workspace_and_this_chats_uploads(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    home = _home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        workspace = rt.settings.workspace("coder")
        workspace.mkdir(parents=True)
        (workspace / "report.txt").write_text("numbers")
        mine = chat_upload_dir(rt.settings, ChatAddress("telegram", conversation="7"))
        theirs = chat_upload_dir(rt.settings, ChatAddress("telegram", conversation="8"))
        for folder in (mine, theirs):
            folder.mkdir(parents=True)
            (folder / "photo.jpg").write_bytes(b"jpeg")
        (workspace / "escape").symlink_to("/etc/passwd")
        attempts = [
            "report.txt",
            str(mine / "photo.jpg"),
            "/etc/passwd",
            "../../settings.toml",
            str(rt.settings.home / "agentpost.db"),
            "escape",
            str(theirs / "photo.jpg"),
            "/proc/self/environ",
        ]
        api.add_rule("report", Text("Here it is.\n" + "\n".join(f"[send_file: {a}]" for a in attempts)))
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="7"), "send the report"
        )
        run_idle(rt, env=_env(api, tmp_path))
        (resp,) = _responses(rt)
        # Each refused file is named in the reply, in plain words: the user is not left waiting for it.
        assert resp["message"] == "\n".join(
            [
                "Here it is.\n",
                "(I couldn't attach passwd: it is outside my workspace.)",
                "(I couldn't attach settings.toml: it is outside my workspace.)",
                "(I couldn't attach agentpost.db: it is outside my workspace.)",
                "(I couldn't attach escape: it is a link to a place outside my workspace.)",
                "(I couldn't attach photo.jpg: it is outside my workspace.)",
                "(I couldn't attach environ: it is outside my workspace.)",
            ]
        )
        assert json.loads(str(resp["files"])) == [
            str(workspace.resolve() / "report.txt"),
            str(mine.resolve() / "photo.jpg"),
        ]
        refused = [
            json.loads(r["payload"])["path"]
            for r in rt.db.read("SELECT payload FROM events WHERE type = 'send_file_refused' ORDER BY id")
        ]
        assert refused == attempts[2:]


def test_missing_cli_is_a_clear_failure(tmp_path: Path, sqlite_url: str, api: FakeAnthropic) -> None:
    home = _home(tmp_path, sqlite_url, coder={"command": [str(tmp_path / "no-such-claude")]})
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "hi")
        run_idle(rt, env=_env(api, tmp_path))
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "dead"  # it cannot work on a retry: no retries burnt
        assert "no-such-claude" in (msg.last_error or "") and "not an executable" in (msg.last_error or "")
        (notice,) = _responses(rt)
        assert "could not be started" in str(notice["message"]) and "agentpost doctor" in str(
            notice["message"]
        )
    assert os.path.exists(claude_binary())


def test_rate_limit_pauses_without_spending_an_attempt(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("busy", RateLimited(retry_after=1))
    home = make_home(
        tmp_path, sqlite_url, {"coder": {"provider": "claude"}}, processor={"rate_limit_pause_seconds": 30}
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "busy now?")
        before = int(time.time() * 1000)
        run_idle(rt, env=_env(api, tmp_path))
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "pending" and msg.retry_count == 0
        assert msg.available_at >= before + 29_000
        assert "429" in (msg.last_error or "")
        # No reply yet: only the one notice that the agent is paused (issue 8), no error as an answer.
        (notice,) = _responses(rt)
        assert '"kind":"paused"' in str(notice["metadata"]) and "429" not in str(notice["message"])
        assert int(rt.queue.control.agent_state("coder")["paused_until"]) >= before + 29_000


def test_two_senders_get_private_conversations_by_default(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("my secret plan", Text("noted, ann"))
    api.add_rule("what do you know", Text("nothing about anyone else"))
    home = _home(tmp_path, sqlite_url)  # no session_scope: the default
    env = _env(api, tmp_path)
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(
            ChatAddress("whatsapp", "ann", sender_id="111", conversation="111"), "my secret plan"
        )
        run_idle(rt, env=env)
        api.clear()
        rt.queue.intake.enqueue_message(
            ChatAddress("whatsapp", "bob", sender_id="222", conversation="222"), "what do you know"
        )
        run_idle(rt, env=env)
        assert get_session(rt.db, "coder", "whatsapp:111") and get_session(rt.db, "coder", "whatsapp:222")
    (request,) = api.main_requests()
    assert "what do you know" in str(request.body) and "secret plan" not in str(request.body)


def test_a_conversation_this_host_does_not_have_starts_afresh_at_once(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    """The chat's recorded conversation is not in this host's CLI home (another host ran it, issue 30; or the
    folder was removed): the CLI refuses ``--resume`` ("No conversation found"). The message is answered in a
    new conversation at once, uncharged, instead of failing on every retry into a dead letter."""
    api.add_rule("second question", Text("Second answer."))
    home = _home(tmp_path, sqlite_url)
    env = _env(api, tmp_path)
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c"), "first question"
        )
        run_idle(rt, env=env)
        before = get_session(rt.db, "coder", "telegram:c")
        assert before
        shutil.rmtree(tmp_path / "user-home" / ".claude" / "projects")  # the conversations are elsewhere
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c"), "second question"
        )
        stats = run_idle(rt, env=env)
        message = rt.queue.admin.get_message(sent.message_id)
        assert message is not None and (message.status, message.retry_count) == ("completed", 0)
        assert stats.invocations == 2 and stats.released == 1
        after = get_session(rt.db, "coder", "telegram:c")
        assert after and after != before
        assert [r["message"] for r in _responses(rt)][-1] == "Second answer."
        resets = [
            json.loads(r["payload"])
            for r in rt.db.read("SELECT payload FROM events WHERE type = 'agent_reset'")
        ]
        assert [r["reason"] for r in resets] == [
            "the conversation to continue is not on this host; starting a new one"
        ]
