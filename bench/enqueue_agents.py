"""Enqueue with many agents: agentpost's enqueue rate with a directory of 256 agents vs one of 8 (SQLite).

Issue 17's target "enqueue with 256 agents >= 0.9x enqueue with 8": routing must not cost more as the
directory grows. In one process, per run: a fresh SQLite file, a Queue whose directory is
``Directory.single(agent-0 .. agent-{K-1})`` (K = --small or --large), then --n calls of the public
``Queue.intake.enqueue_message`` routed by a leading "@agent-N " mention (no ``agent=`` argument, so routing
reads the text) to the first 8 agents in turn, each its own transaction. Timed: the enqueues only.
Runs alternate small and large so drifting machine load hits both alike; the figure is the ratio of the
medians of --runs runs. Each run checks that every agent got its share (the mention was routed).

    bench/.venv/bin/python bench/enqueue_agents.py --n 5000 --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shared.chat.address import ChatAddress

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import make_body
from measure import alternate, medians, ratio, say, scratch_dir, write_json
from systems_agentpost import CHANNEL, AgentpostSqlite

#: Messages go to the first ROUTED agents of either directory, so both runs write the same rows.
ROUTED = 8


def one_run(agents: int, workdir: Path, *, n: int) -> float:
    """Fresh database with a directory of `agents` agents; returns enqueues per second."""
    from shared.queue.core import Directory, Queue
    from shared.settings.model import QueueSettings
    from shared.storage.schema import open_database

    folder = Path(tempfile.mkdtemp(prefix=f"agents-{agents}-", dir=workdir))
    target = str(folder / "queue.db")
    names = [f"agent-{i}" for i in range(agents)]
    directory = Directory.single(*names)
    # The route table is built once per directory (when the settings load); build it before the clock.
    _ = directory.routes
    db = open_database(f"sqlite:///{target}", create=True)
    queue = Queue(db, QueueSettings(lease_seconds=AgentpostSqlite.lease_ms / 1000), directory)
    texts = [f"@agent-{i % ROUTED} " + make_body(i, f"agent-{i % ROUTED}", 120) for i in range(n)]
    try:
        db.connection()  # connect before the clock
        t = time.perf_counter()
        for i, text in enumerate(texts):
            queue.intake.enqueue_message(
                ChatAddress(CHANNEL, "bench-user", conversation=f"chat-{i % ROUTED}"), text
            )
        spent = time.perf_counter() - t
        counts = {
            r["agent"]: int(r["n"])
            for r in db.read("SELECT agent, COUNT(*) AS n FROM messages GROUP BY agent")
        }
    finally:
        db.close()
        shutil.rmtree(folder, ignore_errors=True)
    want = {f"agent-{a}": len(range(a, n, ROUTED)) for a in range(min(ROUTED, n))}
    if counts != want:
        raise RuntimeError(f"{agents} agents: routed {counts}, expected {want}")
    return n / spent


def measure(*, n: int, runs: int, small: int, large: int) -> dict[str, Any]:
    if min(small, large) < ROUTED:
        raise ValueError(f"both directories need at least {ROUTED} agents")
    with scratch_dir("agentpost-enqueue-agents-") as workdir:
        rates = alternate(
            runs,
            (small, large),
            lambda agents, k: one_run(agents, workdir, n=n),
            lambda agents, k, rate: f"enqueue-agents {agents:>4} agents run {k + 1}: {rate:8,.0f} enqueues/s",
        )
    med = medians(rates)
    return {
        "backend": "sqlite",
        "n": n,
        "runs": runs,
        "small_agents": small,
        "large_agents": large,
        "small": rates[small],
        "large": rates[large],
        "small_median": med[small],
        "large_median": med[large],
        "ratio": ratio(med[large], med[small]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=5_000, help="enqueues per run (default 5000)")
    p.add_argument("--runs", type=int, default=3, help="runs of each directory, alternating (default 3)")
    p.add_argument("--small", type=int, default=8, help="agents in the small directory (default 8)")
    p.add_argument("--large", type=int, default=256, help="agents in the large directory (default 256)")
    p.add_argument("--json", default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    r = measure(n=args.n, runs=args.runs, small=args.small, large=args.large)
    say(
        f"enqueue-agents: {r['small_agents']} agents {r['small_median']:,.0f}/s, {r['large_agents']} agents"
        f" {r['large_median']:,.0f}/s, ratio {r['ratio']:.2f}"
    )
    write_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
