"""Warm claude sessions (issue 28): from a message's enqueue to the API request its run makes, for a chat's
first message (a cold CLI start) and its 2nd..Nth (written to the kept process), and the memory of one
kept process; and the ``steer`` hand-over: a message sent while its chat's reply streams, under ``collect``
(a follow-up run) and ``steer`` (written to the running CLI).

    .venv/bin/python bench/warm_sessions.py [--messages 10] [--chats 3] [--steer-rounds 10]

One processor runs in this process (as ``agentpost run processor`` does, with the test timings of
tests/homes.py), the real pinned Claude Code CLI (node_modules/.bin/claude) answers through the fake Messages
API of tests/fakes/anthropic_api.py, which records when each request arrived. Each chat sends its messages
one after another (the next once the previous was answered), first with ``session_idle_seconds = 0`` (a
process per run, the default), then with warm sessions on. The latency is the fake's arrival time minus the
enqueue time, both ``time.monotonic()`` in this process. The RSS is that of the kept process tree (the
``workers/launch.py`` guard and the CLI) right after a warm turn.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared.aio import call  # noqa: E402
from shared.chat.address import ChatAddress  # noqa: E402
from tests.fakes.anthropic_api import Chunked, Computed, FakeAnthropic, Reply, last_user_text  # noqa: E402
from tests.fakes.claude_env import claude_env  # noqa: E402
from tests.homes import build_home, open_home  # noqa: E402
from workers.processor import Processor  # noqa: E402


def _rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants, in KiB."""
    total = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        todo += [int(c) for c in children]
    return total


def measure(tmp: Path, idle: float, messages: int, chats: int) -> tuple[list[float], list[float], int]:
    """(first-message latencies, later-message latencies, RSS of one kept process in KiB) for one setting."""
    home = build_home(
        tmp,
        f"sqlite:///{tmp / 'agentpost.db'}",
        {"coder": {"provider": "claude", "timeout_seconds": 60}},
        processor={"session_idle_seconds": idle},
    )
    user_home = tmp / "user-home"
    user_home.mkdir()
    first: list[float] = []
    later: list[float] = []
    rss: list[int] = []
    with FakeAnthropic() as api, open_home(home) as rt:
        api.add_rule(None, Computed(lambda body: "ok"))
        env = claude_env(api.base_url, user_home, max_retries=0)
        processor = Processor(rt, env=env)

        async def one(text: str, chat: str) -> float:
            sent = time.monotonic()
            queued = await call(
                rt.queue.intake.enqueue_message, ChatAddress("telegram", "bench", conversation=chat), text
            )
            while (message := await call(rt.queue.admin.get_message, queued.message_id)) is None or (
                message.status not in ("completed", "dead")
            ):
                await anyio.sleep(0.01)
            request = next(r for r in api.main_requests() if r.last_user_text == text)
            return request.at - sent

        async def steps() -> None:
            for chat in range(chats):
                for number in range(messages):
                    latency = await one(f"chat {chat} message {number}", f"bench-{chat}")
                    (first if number == 0 else later).append(latency)
                    if idle and number > 0:
                        rss.extend(_rss_kib(pid) for pid in processor.warm.pids())

        async def go() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(processor.serve)
                try:
                    await steps()
                finally:
                    processor.stop()

        anyio.run(go)
    return first, later, int(statistics.median(rss)) if rss else 0


def measure_steer(tmp: Path, policy: str, rounds: int) -> tuple[list[float], list[float], int]:
    """(B's request after A's reply ended, B's enqueue to its request, CLI starts) for ``rounds`` rounds of:
    message A whose reply streams for 1.5 s, and message B to the same chat once A's request arrived."""
    home = build_home(
        tmp,
        f"sqlite:///{tmp / 'agentpost.db'}",
        {"coder": {"provider": "claude", "timeout_seconds": 60}},
        processor={"busy_policy": policy},
    )
    user_home = tmp / "user-home"
    user_home.mkdir()
    after_turn: list[float] = []
    enqueue_to_request: list[float] = []

    def reply(body: dict[str, object]) -> Reply | str:
        text = last_user_text(body)
        if text.startswith("first "):
            tag = text.split()[1]
            return Chunked([f"{tag}-part " for _ in range(5)] + [f"{tag}-end"], interval=0.25)
        return "ok"

    with FakeAnthropic() as api, open_home(home) as rt:
        api.add_rule(None, Computed(reply))
        env = claude_env(api.base_url, user_home, max_retries=0)
        processor = Processor(rt, env=env)

        async def until(condition: object) -> None:
            while not await call(condition):  # type: ignore[arg-type]
                await anyio.sleep(0.005)

        async def steps() -> None:
            for number in range(rounds):
                chat = ChatAddress("telegram", "bench", conversation=f"steer-{number}")
                await call(rt.queue.intake.enqueue_message, chat, f"first r{number}")
                await until(
                    lambda n=number: any(r.last_user_text == f"first r{n}" for r in api.main_requests())
                )
                sent = time.monotonic()
                second = await call(rt.queue.intake.enqueue_message, chat, f"second r{number}")

                def answered(mid: str = second.message_id) -> bool:
                    message = rt.queue.admin.get_message(mid)
                    return message is not None and message.status in ("completed", "dead")

                await until(answered)
                request = next(r for r in api.main_requests() if f"second r{number}" in r.last_user_text)
                ended = max(at for at, text in api.deltas if text == f"r{number}-end")
                after_turn.append(request.at - ended)
                enqueue_to_request.append(request.at - sent)

        async def go() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(processor.serve)
                try:
                    await steps()
                finally:
                    processor.stop()

        anyio.run(go)
        starts = processor.stats.invocations
    return after_turn, enqueue_to_request, starts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=10, help="messages per chat (the first is cold)")
    parser.add_argument("--chats", type=int, default=3)
    parser.add_argument(
        "--steer-rounds", type=int, default=10, help="rounds of the steer hand-over (0: skip)"
    )
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.chats} chats x {args.messages} messages")
    print(
        "| setting | 1st message (cold), median | 2nd..Nth, median | 2nd..Nth p90 | ratio | RSS of one kept CLI |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for idle in (0.0, 60.0):
        with tempfile.TemporaryDirectory(prefix="warm-bench-") as folder:
            first, later, rss = measure(Path(folder), idle, args.messages, args.chats)
        p90 = sorted(later)[min(len(later) - 1, int(0.9 * len(later)))]
        ratio = statistics.median(later) / statistics.median(first)
        setting = f"session_idle_seconds = {idle:g}"
        memory = f"{rss / 1024:.0f} MiB" if rss else "-"
        print(
            f"| {setting} | {statistics.median(first) * 1000:.0f} ms | {statistics.median(later) * 1000:.0f} ms | "
            f"{p90 * 1000:.0f} ms | {ratio:.2f}x | {memory} |"
        )
    if args.steer_rounds:
        print()
        print(f"A message sent while its chat's reply streams ({args.steer_rounds} rounds, one chat each):")
        print(
            "| busy policy | B's request after A's reply ended, median | max | B's enqueue to its request, median | CLI runs |"
        )
        print("|---|---:|---:|---:|---:|")
        for policy in ("collect", "steer"):
            with tempfile.TemporaryDirectory(prefix="steer-bench-") as folder:
                after, total, starts = measure_steer(Path(folder), policy, args.steer_rounds)
            print(
                f"| {policy} | {statistics.median(after) * 1000:.0f} ms | {max(after) * 1000:.0f} ms | "
                f"{statistics.median(total) * 1000:.0f} ms | {starts} |"
            )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
