"""Asking before a tool runs (``permission_mode = "ask"``) with the real Claude Code CLI against the fake API,
which asks for Bash: the request waits in the database, and an answer (the person who sent the message, or an
operator) lets the command run, keeps it from running, or — nobody answering — times out as a denial."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.chat import previews
from shared.chat.address import ChatAddress
from shared.queue import approvals
from shared.reads.trace import timeline_lines, trace_message
from shared.runtime import Runtime
from shared.storage.statuses import ApprovalStatus
from tests.approval_support import asking_model, command_runs
from tests.fakes.anthropic_api import (
    Computed,
    FakeAnthropic,
)
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env, of_kind, payloads, run_with
from tests.processor_support import open_home

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CHAT = ChatAddress("telegram", "ann", sender_id="7", conversation="c1")
STRANGER = ChatAddress("telegram", "bob", sender_id="99", conversation="c1")


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        fake.add_rule(None, Computed(asking_model))
        yield fake


def _home(tmp_path: Path, db_url: str, **processor: Any) -> Path:
    return claude_home(tmp_path, db_url, agent={"permission_mode": "ask"}, processor=processor)


def _wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _waiting_one(rt: Runtime) -> approvals.Approval:
    found = _wait_for("a waiting request", lambda: approvals.waiting(rt.db))
    assert len(found) == 1, found
    return found[0]


def _final(rt: Runtime, message_id: str) -> str:
    (final,) = [r for r in of_kind(rt, "final") if r["message_id"] == message_id]
    return str(final["message"])


def _closed_texts(rt: Runtime) -> list[str]:
    return [str(r["message"]) for r in of_kind(rt, "approval_closed")]


def test_an_allowed_command_runs_once_the_sender_answers(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    with open_home(_home(tmp_path, db_url)) as rt:
        mid = rt.queue.intake.enqueue_message(CHAT, "please write marker-1").message_id
        seen: list[approvals.Approval] = []

        def answer() -> None:
            request = _waiting_one(rt)
            seen.append(request)
            # Someone else in the group presses Allow: nothing changes, and they are told why.
            other = approvals.answer(
                rt.db, rt.queue.responses, request.id, "allow", by="bob", via="chat", asker=STRANGER
            )
            assert other.outcome == "not_yours" and "ann" in other.text
            assert approvals.get(rt.db, request.id).status == ApprovalStatus.PENDING  # type: ignore[union-attr]
            assert command_runs(tmp_path, 1) == 0  # the CLI waits: the command has not run
            mine = approvals.answer(
                rt.db, rt.queue.responses, request.id, "allow", by="ann", via="chat", asker=CHAT
            )
            assert mine.outcome == "applied"
            again = approvals.answer(
                rt.db, rt.queue.responses, request.id, "deny", by="ann", via="chat", asker=CHAT
            )
            assert again.outcome == "over" and "already answered" in again.text

        run_with(rt, cli_env(api, tmp_path), answer)
        (request,) = seen
        assert request.tool == "Bash" and request.agent == "coder" and request.message_id == mid
        assert request.as_dict()["command"] == "echo ran >> marker-1.txt"
        assert request.chat == CHAT
        assert command_runs(tmp_path, 1) == 1
        assert _final(rt, mid).startswith("TOOL RAN")
        # The chat got the question, then saw it answered.
        (question,) = of_kind(rt, "approval")
        assert (
            "coder asks to use Bash" in question["message"]
            and "echo ran >> marker-1.txt" in question["message"]
        )
        assert question["metadata"]["approval_id"] == request.id
        assert _closed_texts(rt) == ["✅ Allowed by ann — Bash: echo ran >> marker-1.txt"]
        types = [p["status"] for p in payloads(rt, "approval_answered")]
        assert types == ["allowed"] and len(payloads(rt, "approval_requested")) == 1


def test_a_denied_command_does_not_run_and_the_reply_says_so(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    with open_home(_home(tmp_path, db_url)) as rt:
        mid = rt.queue.intake.enqueue_message(CHAT, "please write marker-2").message_id

        def deny() -> None:
            request = _waiting_one(rt)
            done = approvals.answer(rt.db, rt.queue.responses, request.id, "deny", by="operator", via="cli")
            assert done.outcome == "applied"

        run_with(rt, cli_env(api, tmp_path), deny)
        assert command_runs(tmp_path, 2) == 0
        final = _final(rt, mid)
        assert final.startswith("TOOL FAILED") and "denied" in final
        assert final.endswith("Not run: Bash: echo ran >> marker-2.txt (Write the marker) (denied).")
        assert _closed_texts(rt) == ["🚫 Denied by operator — not run: Bash: echo ran >> marker-2.txt"]


def test_silence_past_the_timeout_is_a_denial_the_chat_is_told(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    # An idle timeout shorter than the wait: the run waiting for a person is not taken for a stuck one.
    home = _home(tmp_path, db_url, approval_timeout_seconds=12, idle_timeout_seconds=8.0)
    with open_home(home) as rt:
        mid = rt.queue.intake.enqueue_message(CHAT, "please write marker-3").message_id
        started = time.monotonic()
        run_with(rt, cli_env(api, tmp_path), lambda: None)
        assert time.monotonic() - started >= 12
        assert command_runs(tmp_path, 3) == 0
        (request,) = approvals.recent(rt.db)
        assert request.status == ApprovalStatus.TIMED_OUT and request.decided_via == "timeout"
        assert _closed_texts(rt) == ["⌛ No answer within 12 s — not run: Bash: echo ran >> marker-3.txt"]
        final = _final(rt, mid)
        assert final.startswith("TOOL FAILED") and "(no answer within 12 s)" in final
        # The wait is not the agent's work: the run's duration (and its usage row) leaves it out.
        (done,) = payloads(rt, "chain_step_done")
        assert done["waited_ms"] >= 11_500 and done["duration_ms"] < done["waited_ms"], done
        (usage,) = rt.db.read("SELECT duration_ms FROM run_usage")
        assert usage["duration_ms"] == done["duration_ms"]
        late = approvals.answer(
            rt.db, rt.queue.responses, request.id, "allow", by="ann", via="chat", asker=CHAT
        )
        assert late.outcome == "over" and late.text == "This request has expired."


def test_allow_for_this_chat_is_not_asked_again_until_reset(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    with open_home(_home(tmp_path, db_url)) as rt:
        first = rt.queue.intake.enqueue_message(CHAT, "please write marker-4").message_id

        def allow_for_chat() -> None:
            request = _waiting_one(rt)
            done = approvals.answer(
                rt.db, rt.queue.responses, request.id, "chat", by="ann", via="chat", asker=CHAT
            )
            assert done.outcome == "applied" and "for the rest of this chat" in done.text

        run_with(rt, cli_env(api, tmp_path), allow_for_chat)
        assert _final(rt, first).startswith("TOOL RAN")
        # The CLI's own suggested rule: this command with any arguments.
        assert approvals.chat_rules(rt.db, "coder", CHAT) == [("Bash", "echo ran *")]
        assert not approvals.allowed_by_rule([("Bash", "echo ran *")], "Bash", "rm -rf /")
        # The same command again: allowed without a question.
        second = rt.queue.intake.enqueue_message(CHAT, "please write marker-4 again").message_id
        run_with(rt, cli_env(api, tmp_path), lambda: None)
        assert _final(rt, second).startswith("TOOL RAN")
        assert len(approvals.recent(rt.db)) == 1
        assert approvals.forget_chat_rules(rt.db, "coder", CHAT) == 1
        assert approvals.chat_rules(rt.db, "coder", CHAT) == []


def test_the_preview_and_status_say_the_run_waits_and_stop_cancels_the_request(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    with open_home(_home(tmp_path, db_url)) as rt:
        mid = rt.queue.intake.enqueue_message(CHAT, "please write marker-5").message_id
        seen: dict[str, Any] = {}

        def look_then_stop() -> None:
            request = _waiting_one(rt)
            seen["preview"] = _wait_for(
                "the preview to say it waits",
                lambda: [p.text for p in previews.partials(rt.db, "telegram") if "approval" in p.text],
            )
            seen["trace"] = trace_message(rt.db, mid).verdict
            seen["request"] = request.id
            rt.queue.control.request_stop("coder", CHAT.row_key)

        run_with(rt, cli_env(api, tmp_path), look_then_stop)
        assert seen["preview"] == [
            "⏳ Waiting for your approval: Bash: echo ran >> marker-5.txt (Write the marker)"
        ]
        assert f"waiting for an answer to {seen['request']} (Bash: echo ran >> marker-5.txt" in seen["trace"]
        assert command_runs(tmp_path, 5) == 0
        stopped = approvals.get(rt.db, seen["request"])
        assert stopped is not None and stopped.status == ApprovalStatus.CANCELLED
        assert _closed_texts(rt) == [
            "⏹ The run stopped before an answer — not run: Bash: echo ran >> marker-5.txt"
        ]
        assert rt.queue.admin.get_message(mid).status == "completed"  # type: ignore[union-attr]
        assert of_kind(rt, "stopped"), "the chat was not told the run stopped"
        # The trace tells the request's story.
        timeline = "\n".join(timeline_lines(trace_message(rt.db, mid)))
        assert "approval_requested" in timeline and "status=cancelled" in timeline


@pytest.mark.parametrize("policy", ["steer", "collect"])
def test_a_message_sent_while_a_request_waits_is_answered_after_it(
    tmp_path: Path, db_url: str, api: FakeAnthropic, policy: str
) -> None:
    home = claude_home(tmp_path, db_url, agent={"permission_mode": "ask"}, processor={"busy_policy": policy})
    with open_home(home) as rt:
        first = rt.queue.intake.enqueue_message(CHAT, "please write marker-6").message_id
        later: list[str] = []

        def send_then_allow() -> None:
            request = _waiting_one(rt)
            later.append(rt.queue.intake.enqueue_message(CHAT, "and then say hello").message_id)
            if policy == "steer":  # taken into the waiting run
                _wait_for(
                    "the message steered in", lambda: payloads(rt, "message_claimed")[-1].get("steered")
                )
            approvals.answer(rt.db, rt.queue.responses, request.id, "allow", by="ann", via="chat", asker=CHAT)

        run_with(rt, cli_env(api, tmp_path), send_then_allow)
        assert command_runs(tmp_path, 6) == 1
        for mid in (first, *later):
            assert rt.queue.admin.get_message(mid).status == "completed"  # type: ignore[union-attr]
        finals = of_kind(rt, "final")
        assert finals[0]["message_id"] == first and "TOOL RAN" in finals[0]["message"]
        # One final reply per run: the steered message shares the waiting run's, collect gets its own run.
        assert len(finals) == (1 if policy == "steer" else 2), [f["message"] for f in finals]
        assert len(approvals.recent(rt.db)) == 1
