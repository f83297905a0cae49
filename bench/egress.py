"""What the egress proxy costs a run (issue 37): from a message's enqueue to the first API request its claude
run makes, with each run in a network namespace of its own whose only way out is the proxy (what agentpost
does now), and in the same sandbox sharing the host's network (what it did before), alternated round by round.

    .venv/bin/python bench/egress.py [--messages 20]

One processor runs in this process with ``[processor] sandbox = "namespaces"`` (as root: the CLI runs as the
sandbox user), the real pinned Claude Code CLI answers through the fake Messages API of
tests/fakes/anthropic_api.py, which records when each request arrived. Every message goes to a chat of its
own, so every run is a cold CLI start (the case the proxy's set-up is paid in). The figure is the fake's
arrival time minus the enqueue time, both ``time.monotonic()`` in this process.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from tests.fakes.anthropic_api import Computed, FakeAnthropic  # noqa: E402
from tests.fakes.claude_env import claude_env  # noqa: E402
from tests.homes import build_home, open_home  # noqa: E402
from workers.processor import Processor  # noqa: E402


def measure(tmp: Path, messages: int) -> dict[str, list[float]]:
    home = build_home(
        tmp,
        f"sqlite:///{tmp / 'agentpost.db'}",
        {"coder": {"provider": "claude", "timeout_seconds": 60}},
        processor={"sandbox": "namespaces"},
    )
    user_home = tmp / "user-home"
    user_home.mkdir()
    found: dict[str, list[float]] = {"proxy": [], "host network": []}
    with FakeAnthropic() as api, open_home(home) as rt:
        api.add_rule(None, Computed(lambda body: "ok"))
        env = claude_env(api.base_url, user_home, max_retries=0)
        processor = Processor(rt, env=env)
        confined = processor.sandbox_plan()
        assert confined.kind == "namespaces" and confined.network, confined
        shared_network = dataclasses.replace(confined, network=False)

        async def one(number: int, mode: str) -> float:
            # The plan the processor chose, with or without the network namespace (and so the proxy).
            processor._sandbox._chosen = ("namespaces", confined if mode == "proxy" else shared_network)
            text = f"message {number} {mode}"
            sent = time.monotonic()
            queued = await call(
                rt.queue.intake.enqueue_message,
                ChatAddress("telegram", "bench", conversation=f"c{number}"),
                text,
            )
            while (message := await call(rt.queue.admin.get_message, queued.message_id)) is None or (
                message.status not in ("completed", "dead")
            ):
                await anyio.sleep(0.01)
            assert message.status == "completed", message
            request = next(r for r in api.main_requests() if r.last_user_text == text)
            return request.at - sent

        async def go() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(processor.serve)
                try:
                    for number in range(messages):
                        for mode in ("proxy", "host network") if number % 2 else ("host network", "proxy"):
                            found[mode].append(await one(number, mode))
                finally:
                    processor.stop()

        anyio.run(go)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20, help="messages per mode (default 20)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentpost-bench-egress-") as folder:
        found = measure(Path(folder), args.messages)
    print("| each run's network | enqueue → first API request, median | p90 | runs |")
    print("|---|---:|---:|---:|")
    for mode, values in found.items():
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
        print(
            f"| {mode} | {statistics.median(values) * 1000:,.0f} ms | {p90 * 1000:,.0f} ms | {len(values)} |"
        )
    ratio = statistics.median(found["proxy"]) / statistics.median(found["host network"])
    print(f"\nproxy / host network: {ratio:.2f}x")


if __name__ == "__main__":
    main()
