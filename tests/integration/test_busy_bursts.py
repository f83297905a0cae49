"""Bursts while an agent works, as people send them: a reply streaming for about 5 s and two more messages
0.5 s apart, under each busy policy, with warm sessions off and on — the real Claude Code CLI against the
fake API. Every sender gets an answer soon after the last message, and no message gets two finals."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.fakes.anthropic_api import Chunked, FakeAnthropic, Text
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env, of_kind, payloads, run_with, serving
from tests.probes import wait_for
from tests.processor_support import open_home

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CHAT = ChatAddress("telegram", "ann", sender_id="7", conversation="c1")
#: What a chat channel's enqueue waits for a burst to settle (queue.debounce_ms's default).
DEBOUNCE = 1_200
#: About 5 s of streaming: twelve deltas 0.4 s apart.
SLOW_PARTS = tuple(f"part{n} " for n in range(12))


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        fake.add_rule(re.compile(r"^first"), Chunked(SLOW_PARTS, interval=0.4))
        fake.add_rule(re.compile(r"second|third"), Text("later answer"))
        yield fake


@pytest.mark.parametrize("warm", [0, 60], ids=["cold", "warm"])
@pytest.mark.parametrize("policy", ["steer", "collect", "followup", "interrupt"])
def test_two_more_messages_while_a_reply_streams(
    tmp_path: Path, db_url: str, api: FakeAnthropic, policy: str, warm: int
) -> None:
    home = claude_home(
        tmp_path,
        db_url,
        processor={"busy_policy": policy, "session_idle_seconds": warm},
    )
    sent_last: list[float] = []
    with open_home(home) as rt:
        ids = [rt.queue.intake.enqueue_message(CHAT, "first: write the parser").message_id]

        def burst() -> None:
            api.wait_for_main_requests(1, 30)
            time.sleep(1.0)  # the stream is under way: the burst lands mid-reply, as a person's would
            ids.append(
                rt.queue.intake.enqueue_message(
                    CHAT, "second: and add tests", debounce_ms=DEBOUNCE
                ).message_id
            )
            time.sleep(0.5)
            ids.append(
                rt.queue.intake.enqueue_message(CHAT, "third: and docs", debounce_ms=DEBOUNCE).message_id
            )
            sent_last.append(time.monotonic())

        run_with(rt, cli_env(api, tmp_path), burst, timeout=60)
        done = time.monotonic()
        for mid in ids:
            msg = rt.queue.admin.get_message(mid)
            assert msg is not None and msg.status == "completed", (policy, msg)
        finals = of_kind(rt, "final")
        covered = [mid for f in finals for mid in _covers(rt, f)]
        assert set(covered) == set(ids), (finals, ids)
        assert len(covered) == len(set(covered)), f"a message got two finals: {covered}"
        assert done - sent_last[0] < 30, done - sent_last[0]
        if policy == "steer":
            # Both handed to the running CLI while the reply streamed: one run, and the next request (both
            # messages, taken together as its next turn) right after the streamed turn's last delta.
            assert len(payloads(rt, "chain_step_start")) == 1, payloads(rt, "chain_step_start")
            later = [r for r in api.main_requests() if "second" in r.last_user_text]
            assert len(later) == 1 and "third" in later[0].last_user_text, [r.last_user_text for r in later]
            last_delta = max(at for at, text in api.deltas if text == SLOW_PARTS[-1])
            assert 0 <= later[0].at - last_delta < 1.5, later[0].at - last_delta
        steps = payloads(rt, "chain_step_done")
        failed = [s for s in steps if not s["ok"] and s.get("stopped_by") != "interrupt"]
        assert not failed, steps


def _covers(rt: Runtime, final: dict[str, object]) -> list[str]:
    """The messages one final reply answers: the group of the successful run that wrote it."""
    for done in payloads(rt, "chain_step_done"):
        if done["ok"] and final["message_id"] in done["message_ids"]:
            return list(done["message_ids"])
    return [str(final["message_id"])]


def test_steer_hands_a_message_to_a_kept_process_mid_reply(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    """Warm sessions on: the chat's process is kept from an earlier message; a message sent 1 s into the
    next streamed reply goes to that process while the reply streams, not to a run of its own."""
    api.add_rule(re.compile(r"^hello"), Text("hi"))
    home = claude_home(
        tmp_path,
        db_url,
        processor={"busy_policy": "steer", "session_idle_seconds": 60},
        queue={"debounce_ms": 0},
    )
    with open_home(home) as rt, serving(rt, cli_env(api, tmp_path)):
        ids = [rt.queue.intake.enqueue_message(CHAT, "hello").message_id]
        wait_for(lambda: of_kind(rt, "final"), 30, "the first answer")
        ids.append(rt.queue.intake.enqueue_message(CHAT, "first: write the parser").message_id)
        api.wait_for_main_requests(2, 30)
        time.sleep(1.0)  # a second into the streamed reply
        ids.append(rt.queue.intake.enqueue_message(CHAT, "second: and add tests").message_id)
        wait_for(lambda: len(of_kind(rt, "final")) == 2, 30, "the second answer")
        starts = payloads(rt, "chain_step_start")
        assert len(starts) == 2, starts  # the hello, then one run for the streamed reply and the steered one
        done = payloads(rt, "chain_step_done")
        assert [d["message_ids"] for d in done] == [ids[:1], ids[1:]], done
        pids = {d["pid"] for d in done}
        assert len(pids) == 1, done  # one kept process for all three
    second = next(r for r in api.main_requests() if "second" in r.last_user_text)
    last_delta = max(at for at, text in api.deltas if text == SLOW_PARTS[-1])
    assert 0 <= second.at - last_delta < 1.5, second.at - last_delta
