"""Warm claude sessions (``[processor] session_idle_seconds``): the real Claude Code CLI against the fake
Messages API, with one processor serving while the test sends a chat's messages one after another."""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import tomlkit

from adapters.platform import Inbound
from adapters.runner import ChannelRunner
from adapters.telegram import TelegramChannel
from shared.aio import call
from shared.chat.address import ChatAddress
from shared.chat.sessions import get_session, set_session
from shared.runtime import Runtime
from tests.fakes.anthropic_api import ApiError, Chunked, Computed, FakeAnthropic, RecordedRequest
from tests.fakes.claude_env import claude_env
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.processor_support import make_home, open_home
from workers.doctor import checks
from workers.processor import Processor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _env(api: FakeAnthropic, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "user-home"
    home.mkdir(exist_ok=True)
    return claude_env(
        api.base_url, home, max_retries=0, extra={"CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1"}
    )


def _home(tmp_path: Path, db_url: str, idle: float, timeout: float = 30) -> Path:
    return make_home(
        tmp_path,
        db_url,
        {"coder": {"provider": "claude", "timeout_seconds": timeout}},
        processor={"session_idle_seconds": idle},
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` (in a worker thread: it may read the database) until truthy, or fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = await call(condition)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await anyio.sleep(0.05)


def _done(rt: Runtime, message_id: str) -> dict[str, Any] | None:
    """The ``chain_step_done`` payload of the last run of ``message_id`` once its message is done."""
    state = rt.db.read("SELECT status FROM messages WHERE message_id = :m", {"m": message_id})
    if not state or state[0]["status"] not in ("completed", "dead"):
        return None
    rows = rt.db.read("SELECT payload FROM events WHERE type = 'chain_step_done' ORDER BY id", {})
    payloads = [json.loads(r["payload"]) for r in rows]
    mine = [p for p in payloads if message_id in p.get("message_ids", [])]
    return mine[-1] if mine else None


def _serve(rt: Runtime, env: dict[str, str], steps: Callable[[Processor], Awaitable[None]]) -> Processor:
    processor = Processor(rt, env=env)

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(processor.serve)
            try:
                await steps(processor)
            finally:
                processor.stop()

    anyio.run(go)
    return processor


def _main_for(api: FakeAnthropic, text: str) -> RecordedRequest:
    return next(r for r in api.main_requests() if r.last_user_text == text)


def test_second_message_reuses_the_warm_process_and_reaches_the_api_sooner(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    api.add_rule(None, Computed(lambda body: "ok"))
    with open_home(_home(tmp_path, db_url, idle=60)) as rt:
        done: list[dict[str, Any]] = []
        sent_at: list[float] = []

        async def steps(processor: Processor) -> None:
            for text in ("first", "second", "third"):
                sent_at.append(time.monotonic())
                mid = (
                    await call(
                        rt.queue.intake.enqueue_message,
                        ChatAddress("telegram", "ann", conversation="c1"),
                        text,
                    )
                ).message_id
                done.append(await _until(lambda mid=mid: _done(rt, mid), 60, f"the run of {text!r}"))
            assert processor.warm.pids() == [done[0]["pid"]]

        processor = _serve(rt, _env(api, tmp_path), steps)
        session = get_session(rt.db, "coder", "telegram:c1")
    assert [d["ok"] for d in done] == [True, True, True]
    assert done[0]["pid"] == done[1]["pid"] == done[2]["pid"]
    assert (processor.warm.started, processor.warm.reused) == (1, 2)
    assert not _alive(done[0]["pid"])  # the processor's end closed it
    assert session is not None and "@" in session  # recorded with the point to resume at
    latencies = [_main_for(api, t).at - s for t, s in zip(("first", "second", "third"), sent_at, strict=True)]
    assert latencies[1] < latencies[0] and latencies[2] < latencies[0], latencies
    assert _main_for(api, "third").user_turns == 3  # one conversation


def test_idle_warm_process_exits_after_session_idle_seconds(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    api.add_rule(None, Computed(lambda body: "ok"))
    with open_home(_home(tmp_path, db_url, idle=0.5)) as rt:

        async def steps(processor: Processor) -> None:
            mid = (
                await call(
                    rt.queue.intake.enqueue_message,
                    ChatAddress("telegram", "ann", conversation="c1"),
                    "hello",
                )
            ).message_id
            run = await _until(lambda: _done(rt, mid), 60, "the run")
            kept_at = time.monotonic()
            await _until(lambda: not processor.warm.pids(), 10, "the idle process to be closed")
            assert time.monotonic() - kept_at >= 0.4
            await _until(lambda: not _alive(run["pid"]), 5, "the CLI to exit")

        _serve(rt, _env(api, tmp_path), steps)


def test_refused_turn_does_not_poison_the_next_message(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("POISON", ApiError("this request is refused"), times=1)
    api.add_rule(None, Computed(lambda body: "ok"))
    with open_home(_home(tmp_path, db_url, idle=60)) as rt:
        runs: dict[str, dict[str, Any]] = {}

        async def steps(processor: Processor) -> None:
            for text in ("one", "POISON two", "three"):
                mid = (
                    await call(
                        rt.queue.intake.enqueue_message,
                        ChatAddress("telegram", "ann", conversation="c1"),
                        text,
                    )
                ).message_id
                runs[text] = await _until(lambda mid=mid: _done(rt, mid), 60, f"the run of {text!r}")

        _serve(rt, _env(api, tmp_path), steps)
    # A 400 is the request's fault: the message ends with its notice, and the next one is answered.
    assert [runs[t]["ok"] for t in ("one", "POISON two", "three")] == [True, False, True]
    assert len([r for r in api.main_requests() if r.status == 400]) == 1
    # The refused turn's process was dropped: "three" started a new one from the last good point, which
    # does not hold the refused turn.
    assert runs["POISON two"]["pid"] == runs["one"]["pid"] != runs["three"]["pid"]
    three = _main_for(api, "three")
    assert "POISON" not in json.dumps(three.body["messages"]), three.body["messages"]
    assert three.user_turns == 2  # "one" and "three": the conversation went on


def test_settings_change_restarts_the_warm_process(tmp_path: Path, db_url: str, api: FakeAnthropic) -> None:
    api.add_rule(None, Computed(lambda body: "ok"))
    home = _home(tmp_path, db_url, idle=60)
    with open_home(home) as rt:
        runs: list[dict[str, Any]] = []

        async def steps(processor: Processor) -> None:
            mid = (
                await call(
                    rt.queue.intake.enqueue_message,
                    ChatAddress("telegram", "ann", conversation="c1"),
                    "before",
                )
            ).message_id
            runs.append(await _until(lambda: _done(rt, mid), 60, "the first run"))
            # The operator edits settings.toml (the runtime would notice within a second; now, to be quick).
            path = home / "settings.toml"
            data = tomlkit.parse(path.read_text(encoding="utf-8"))
            data["agents"]["coder"]["model"] = "claude-other-model"  # type: ignore[index]
            path.write_text(tomlkit.dumps(data), encoding="utf-8")
            assert await call(functools.partial(rt.refresh_settings, force=True))
            mid = (
                await call(
                    rt.queue.intake.enqueue_message,
                    ChatAddress("telegram", "ann", conversation="c1"),
                    "after",
                )
            ).message_id
            runs.append(await _until(lambda: _done(rt, mid), 60, "the second run"))

        _serve(rt, _env(api, tmp_path), steps)
    assert runs[0]["pid"] != runs[1]["pid"] and not _alive(runs[0]["pid"])
    after = _main_for(api, "after")
    assert _main_for(api, "before").body["model"] != "claude-other-model"
    assert after.body["model"] == "claude-other-model"
    assert after.user_turns == 2  # the conversation went on in the new process


def _send(rt: Runtime, text: str) -> str:
    return rt.queue.intake.enqueue_message(ChatAddress("telegram", "ann", conversation="c1"), text).message_id


@pytest.mark.parametrize("how", ["stop", "timeout"])
def test_a_stopped_or_timed_out_turn_ends_the_warm_process_and_leaves_no_trace(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic, how: str
) -> None:
    api.add_rule("endless", Chunked(["tick "] * 60, interval=0.5))  # 30 s unless cut short
    api.add_rule(None, Computed(lambda body: "ok"))
    with open_home(_home(tmp_path, sqlite_url, idle=60, timeout=4 if how == "timeout" else 30)) as rt:
        runs: dict[str, dict[str, Any]] = {}

        async def steps(processor: Processor) -> None:
            mid = await call(_send, rt, "one")
            runs["one"] = await _until(lambda: _done(rt, mid), 60, "the first run")
            mid = await call(_send, rt, "endless task")
            await _until(
                lambda: any(r.last_user_text == "endless task" for r in api.main_requests()), 30, "it"
            )
            if how == "stop":
                await call(rt.queue.control.request_stop, "coder", "telegram:c1")
            # Stopped: completed with a "Stopped." reply; timed out: back to pending (then retried, again
            # timing out): either way the first of its runs must end the kept process.
            await _until(lambda: not _alive(runs["one"]["pid"]), 20, "the warm process to be killed")
            assert not processor.warm.pids()
            if how == "timeout":
                await call(rt.queue.control.request_stop, "coder", "*")  # end its retries
                await _until(lambda: _done(rt, mid), 60, "the endless message to end")
            mid = await call(_send, rt, "three")
            runs["three"] = await _until(lambda: _done(rt, mid), 60, "the run after it")

        _serve(rt, _env(api, tmp_path), steps)
    assert runs["three"]["ok"] and runs["three"]["pid"] != runs["one"]["pid"]
    three = _main_for(api, "three")
    assert "endless" not in json.dumps(three.body["messages"]), three.body["messages"]
    assert three.user_turns == 2  # "one" and "three": resumed at the last good turn


def test_a_lost_resume_point_continues_the_conversation_from_its_end(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    """The recorded point to resume at is not in the session file (a write a full disk refused): the CLI
    refuses every resume there ("No message found with message.uuid"), so the message is run again at once
    from the session's end — the conversation kept, no attempt counted — instead of failing for good."""
    api.add_rule(None, Computed(lambda body: "ok"))
    with open_home(_home(tmp_path, db_url, idle=0)) as rt:
        chat = ChatAddress("telegram", "ann", conversation="c1")
        runs: dict[str, dict[str, Any]] = {}

        async def steps(processor: Processor) -> None:
            first = (await call(rt.queue.intake.enqueue_message, chat, "remember 42")).message_id
            runs["first"] = await _until(lambda: _done(rt, first), 60, "the first run")
            recorded = await call(get_session, rt.db, "coder", "telegram:c1")
            assert recorded is not None
            lost = f"{recorded.partition('@')[0]}@00000000-0000-4000-8000-000000000000"
            await call(set_session, rt.db, "coder", "telegram:c1", lost)
            second = (await call(rt.queue.intake.enqueue_message, chat, "what number?")).message_id
            runs["second"] = await _until(lambda: _done(rt, second), 60, "the second message's answer")
            message = await call(rt.queue.admin.get_message, second)
            assert message is not None and message.status == "completed" and message.retry_count == 0

        _serve(rt, _env(api, tmp_path), steps)
        session = get_session(rt.db, "coder", "telegram:c1")
    assert runs["second"]["ok"] is True
    assert session is not None and "00000000-0000-4000" not in session
    # The conversation went on: the answered request carried the first exchange.
    assert _main_for(api, "what number?").user_turns == 2


def test_status_says_whether_the_chats_agent_is_kept_ready_and_why_not(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    """/status (read by the channel process from the processor's presence row) says the chat's CLI is kept
    for its next message, then, once it was closed for being idle, that the next message starts afresh and
    why; another chat of the same agent is not told this chat's state."""
    api.add_rule(None, Computed(lambda body: "ok"))
    home = make_home(
        tmp_path,
        db_url,
        {"coder": {"provider": "claude", "timeout_seconds": 30, "session_scope": "conversation"}},
        processor={"session_idle_seconds": 1.5},
        channels={"telegram": {"allowlist": ["42", "43"]}},
    )
    with open_home(home) as rt:
        commands = ChannelRunner(
            TelegramChannel(
                rt, env={"TELEGRAM_BOT_TOKEN": "1:x", "TELEGRAM_API_BASE_URL": "http://127.0.0.1:9"}
            )
        ).commands

        def status(chat: str) -> str:
            inbound = Inbound(conversation=chat, sender_id=chat, sender="ann", text="/status", external_id="")
            return commands.run_command(inbound, "status", "")

        def saying(chat: str, words: str) -> str | None:
            text = status(chat)
            return text if words in text else None

        def doctor_says() -> str:
            return next(c.detail for c in checks(rt.settings) if c.name == "warm sessions")

        seen: dict[str, str] = {}

        async def steps(processor: Processor) -> None:
            seen["before"] = await call(status, "42")
            mid = (
                await call(rt.queue.intake.enqueue_message, ChatAddress("telegram", "42"), "hello")
            ).message_id
            await _until(lambda: _done(rt, mid), 60, "the run")
            seen["kept"] = await _until(lambda: saying("42", "kept ready for"), 10, "/status to say kept")
            seen["doctor kept"] = await call(doctor_says)
            seen["other"] = await call(status, "43")
            seen["closed"] = await _until(lambda: saying("42", "afresh"), 10, "/status to say closed")
            seen["doctor closed"] = await call(doctor_says)

        _serve(rt, _env(api, tmp_path), steps)
    assert "kept" not in seen["before"] and "afresh" not in seen["before"]
    assert "@coder is kept ready for this chat's next message (1 kept ready in all)." in seen["kept"]
    assert "kept ready for" not in seen["other"] and "afresh" not in seen["other"]
    assert seen["doctor kept"].endswith("; 1 kept now"), seen["doctor kept"]
    assert seen["doctor closed"].endswith("; 0 kept now (the last one closed: idle for 1.5 s, closed)")
    assert (
        "starts afresh for this chat's next message: idle for 1.5 s, closed (0 kept ready in all)"
        in seen["closed"]
    )
