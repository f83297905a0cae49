"""A real OS process that plays producer or consumer against the queue, for multi-process tests.

    python tests/queue_actor.py producer URL --count N --agents a,b --tag P0
    python tests/queue_actor.py consumer URL --agents a,b --worker W --log FILE [--stop-file F] [--hold-seconds S]

The consumer claims per agent, records each held batch as one JSON line (agent, ids, start, end on the
system-wide monotonic clock) and completes it; tests read the log to check order and exclusivity.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from shared.chat.address import ChatAddress
from shared.events.wake import Waker
from shared.queue.core import Directory, Queue
from shared.settings.model import QueueSettings
from shared.storage.schema import open_database


def producer(args: argparse.Namespace) -> int:
    agents = args.agents.split(",")
    db = open_database(args.url, create=False)
    queue = Queue(db, QueueSettings(), Directory.single(*agents))
    for i in range(args.count):
        agent = agents[i % len(agents)]
        queue.intake.enqueue_message(
            ChatAddress("cli", args.tag, conversation=f"{args.tag}-{agent}"),
            f"{args.tag}:{i:06d} " + "x" * 80,
            agent=agent,
        )
    db.close()
    return 0


def consumer(args: argparse.Namespace) -> int:
    agents = args.agents.split(",")
    db = open_database(args.url, create=False)
    queue = Queue(db, QueueSettings(lease_seconds=int(args.lease_ms) / 1000), Directory.single(*agents))
    waker = Waker(db, interval_ms=5).start()
    log = Path(args.log).open("a", buffering=1)  # noqa: SIM115 - open for the life of the process
    stop_file = Path(args.stop_file) if args.stop_file else None
    idle_since = time.monotonic()
    while True:
        gen = waker.generation
        worked = False
        queue.failures.recover_stale_messages()
        for agent in agents:
            claimed = queue.messages.claim_all_pending_messages(agent, args.worker)
            if not claimed:
                continue
            worked = True
            start = time.monotonic()
            ids = [m.message_id for m in claimed]
            log.write(
                json.dumps({"event": "claimed", "agent": agent, "ids": ids, "worker": args.worker}) + "\n"
            )
            if args.hold_seconds:
                time.sleep(args.hold_seconds)  # simulates an agent run while holding the claim
            end = time.monotonic()
            queue.messages.complete_messages(ids, args.worker, f"done {len(ids)}")
            queue.leases.release_agent(agent, args.worker)
            log.write(
                json.dumps(
                    {
                        "event": "completed",
                        "agent": agent,
                        "ids": ids,
                        "start": start,
                        "end": end,
                        "worker": args.worker,
                        "texts": [m.message.split(" ")[0] for m in claimed],
                    }
                )
                + "\n"
            )
        if worked:
            idle_since = time.monotonic()
            continue
        if stop_file is not None and stop_file.exists() and time.monotonic() - idle_since > 0.5:
            break
        waker.wait(gen, 0.2)
    waker.stop()
    db.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=["producer", "consumer"])
    parser.add_argument("url")
    parser.add_argument("--agents", required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--tag", default="p")
    parser.add_argument("--worker", default=f"w{os.getpid()}")
    parser.add_argument("--log", default=os.devnull)
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--hold-seconds", type=float, default=0.0)
    parser.add_argument("--lease-ms", type=float, default=30_000)
    args = parser.parse_args()
    return producer(args) if args.role == "producer" else consumer(args)


if __name__ == "__main__":
    sys.exit(main())
