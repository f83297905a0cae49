"""Liveness of single runs with the real Claude Code CLI against the fake API: idle timeout by output,
progress notes and one final reply, /stop and /status, rate limits (pause and fallback model), the re-run
note after a crash, and silent heartbeats."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.reads.conversation_status import conversation_status, format_status
from tests.fakes.anthropic_api import JSON, Chunked, Computed, FakeAnthropic, RateLimited, Reply, Text
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env, group_gone, of_kind, payloads, responses, run_with
from tests.processor_support import open_home, run_idle, wait_for
from workers.busy import INTERRUPTED_NOTE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_streaming_run_outlives_idle_timeout_with_progress_notes_and_one_final_reply(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    # 7.5 s of streaming, a delta every 0.3 s; idle timeout 4 s (not less: a loaded machine can take a few
    # seconds to start the CLI, before its first line); a note every second.
    api.add_rule("long job", Chunked([f"part{n} " for n in range(25)], interval=0.3))
    home = claude_home(
        tmp_path, db_url, processor={"idle_timeout_seconds": 4.0, "progress_note_seconds": 1.0}
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "long job"
        )
        stats = run_idle(rt, env=cli_env(api, tmp_path))
        assert stats.invocations == 1 and stats.completed == 1
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "completed" and msg.retry_count == 0
        notes = of_kind(rt, "progress")
        (final,) = of_kind(rt, "final")
        assert len(notes) >= 2, notes
        assert final["message"].startswith("part0 part1") and "part24" in final["message"]
        assert {n["metadata"]["edit_key"] for n in notes} == {final["metadata"]["edit_key"]}
        assert all(n["message"].startswith("Still working — ") for n in notes)
        assert all((n["conversation"], n["sender_id"]) == ("c1", "7") for n in notes)
        assert responses(rt)[-1]["id"] == final["id"]  # no note after the final reply
        assert (final["metadata"]["edit_key"]).startswith("run_")


def test_silent_run_is_stopped_after_idle_timeout(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("hang", Text("too late", delay=30))
    home = claude_home(
        tmp_path, sqlite_url, processor={"idle_timeout_seconds": 1.5}, queue={"max_retries": 1}
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "hang please"
        )
        started = time.monotonic()
        run_idle(rt, env=cli_env(api, tmp_path))
        assert time.monotonic() - started < 12
        (done,) = payloads(rt, "chain_step_done")
        assert done["stopped_by"] == "idle" and done["timed_out"] is True
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "dead" and "no output for 1.5 s" in (msg.last_error or "")
        (notice,) = responses(rt)
        assert notice["metadata"]["kind"] == "dead_notice"
    wait_for(lambda: group_gone(int(done["pid"])), 5, "the idle CLI's process group to be gone")


def test_stop_ends_a_run_within_seconds_and_status_reports_it_while_running(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("endless", Chunked(["tick "] * 60, interval=0.5))  # 30 s unless stopped
    home = claude_home(tmp_path, db_url)
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "endless task"
        )
        seen: dict[str, object] = {}

        def act() -> None:
            api.wait_for_main_requests(1, 30)
            status = wait_for(
                lambda: (
                    (s := conversation_status(rt.db, "coder", ChatAddress("telegram", conversation="c1")))[
                        "running"
                    ]
                    and s
                ),
                10,
                "status to report the run",
            )
            seen["status"], seen["text"] = status, format_status(status)
            seen["other"] = conversation_status(
                rt.db, "coder", ChatAddress("telegram", conversation="elsewhere")
            )
            seen["asked"] = time.monotonic()
            rt.queue.control.request_stop("coder", "telegram:c1")

        stats = run_with(rt, cli_env(api, tmp_path), act)
        stopped_after = time.monotonic() - float(seen["asked"])  # type: ignore[arg-type]
        assert stopped_after < 5, f"the run ended {stopped_after:.1f} s after /stop"
        assert stats.stopped == 1
        status = seen["status"]
        assert isinstance(status, dict) and status["message_ids"] == [sent.message_id]
        assert status["running_since"] > 0 and status["waiting"] == 0
        assert "Working on it since" in str(seen["text"])
        assert seen["other"]["running"] is False  # type: ignore[index]
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "completed"
        (reply,) = responses(rt)
        assert reply["metadata"]["kind"] == "stopped" and reply["message"].startswith("Stopped.")
        (done,) = payloads(rt, "chain_step_done")
        assert done["stopped_by"] == "stop" and reply["metadata"]["edit_key"] == done["run_id"]
        assert (
            conversation_status(rt.db, "coder", ChatAddress("telegram", conversation="c1"))["running"]
            is False
        )
    wait_for(lambda: group_gone(int(done["pid"])), 5, "the stopped CLI to be gone")


def test_rate_limit_pauses_the_agent_tells_each_chat_once_and_resumes_without_spending_retries(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    limited = api.add_rule("from chat one", RateLimited(retry_after=1), times=1)
    home = claude_home(tmp_path, sqlite_url, queue={"max_retries": 1})  # one counted failure = dead
    with open_home(home) as rt:
        a = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "hello from chat one"
        )
        b = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "bo", sender_id="8", conversation="c2"), "hello from chat two"
        )
        started = time.monotonic()
        stats = run_idle(rt, env=cli_env(api, tmp_path), include_delayed=True, timeout=40)
        elapsed = time.monotonic() - started
        assert limited.hits == 1 and stats.rate_limited == 1
        assert elapsed >= 1.4, "the agent should have waited out the pause"
        for mid in (a.message_id, b.message_id):
            msg = rt.queue.admin.get_message(mid)
            assert msg is not None and msg.status == "completed" and msg.retry_count == 0
        paused = of_kind(rt, "paused")
        assert sorted(p["conversation"] for p in paused) == ["c1", "c2"]  # each waiting chat, once
        assert all("resumes at" in p["message"] for p in paused)
        assert len(of_kind(rt, "final")) == 2 and not of_kind(rt, "dead_notice")
        (pause,) = payloads(rt, "agent_paused")
        assert pause["agent"] == "coder" and "rate limited" in pause["reason"]
        failed = payloads(rt, "message_failed")
        assert failed and all(f["counted"] is False for f in failed)


def test_rate_limit_moves_to_the_fallback_model_instead_of_waiting(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    def by_model(body: JSON) -> Reply:
        return RateLimited(retry_after=1) if body.get("model") == "main-model" else Text("from the fallback")

    api.add_rule(None, Computed(by_model))
    home = claude_home(
        tmp_path,
        sqlite_url,
        agent={"model": "main-model", "fallback_model": "spare-model"},
        processor={"rate_limit_pause_seconds": 30},
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "hi there"
        )
        started = time.monotonic()
        run_idle(rt, env=cli_env(api, tmp_path), timeout=30)
        assert time.monotonic() - started < 15, "no 30 s pause: the fallback model ran at once"
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "completed" and msg.retry_count == 0
        assert [r["message"] for r in responses(rt)] == ["from the fallback"]  # no "paused" notice
        (switch,) = payloads(rt, "model_fallback")
        assert switch["model"] == "spare-model" and switch["until"] > int(time.time() * 1000) + 20_000
        assert rt.queue.control.agent_state("coder")["paused_until"] == 0
        # Later runs stay on the fallback until the reset time.
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "and again"
        )
        run_idle(rt, env=cli_env(api, tmp_path), timeout=30)
        assert [r["message"] for r in responses(rt)][-1] == "from the fallback"
    models = [r.body["model"] for r in api.main_requests()]
    assert models[0] == "main-model" and set(models[1:]) == {"spare-model"}, models


def test_a_message_whose_run_was_interrupted_by_a_crash_is_rerun_with_a_note(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    home = claude_home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "refactor the module"
        )
        # A worker claims it, starts its run and dies (no renewal): its lease lapses and the processor
        # recovers it, charging one interrupted run.
        assert rt.queue.messages.claim_all_pending_messages("coder", "dead-worker", lease_ms=300)
        rt.queue.messages.mark_run_started([sent.message_id], "dead-worker")
        time.sleep(0.4)
        run_idle(rt, env=cli_env(api, tmp_path), include_delayed=True)
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "completed" and msg.retry_count == 0
        assert msg.interruptions == 1 and (msg.last_error or "").startswith("interrupted")
    (request,) = api.main_requests()
    assert request.last_user_text.startswith(INTERRUPTED_NOTE)
    assert request.last_user_text.endswith("refactor the module")


def test_heartbeat_answered_with_the_silent_token_is_recorded_but_sent_to_no_one(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("check in", Text("  HEARTBEAT_OK \n"))
    api.add_rule("report", Text("Something needs attention."))
    home = claude_home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        quiet = rt.queue.intake.enqueue_message(
            ChatAddress("heartbeat", "scheduler", conversation="hb"), "check in"
        )
        loud = rt.queue.intake.enqueue_message(
            ChatAddress("heartbeat", "scheduler", conversation="hb2"), "report"
        )
        stats = run_idle(rt, env=cli_env(api, tmp_path))
        assert stats.silent == 1
        for mid in (quiet.message_id, loud.message_id):
            msg = rt.queue.admin.get_message(mid)
            assert msg is not None and msg.status == "completed"
        (reply,) = responses(rt)
        assert reply["message_id"] == loud.message_id and reply["message"] == "Something needs attention."
        (silent,) = payloads(rt, "heartbeat_silent")
        assert silent["message_ids"] == [quiet.message_id]
        turns = rt.db.read(
            "SELECT role, content FROM agent_messages WHERE message_id = :m ORDER BY id",
            {"m": quiet.message_id},
        )
        assert [t["role"] for t in turns] == ["user", "assistant"]
        assert re.sub(r"\s", "", str(turns[1]["content"])) == "HEARTBEAT_OK"
