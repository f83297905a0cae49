"""Claim with messages waiting: drain 20 messages per agent, agentpost vs plain sqlite3 claim-all (SQLite).

Issue 17's target "with 20 messages waiting per agent >= 0.7x plain claim-all". In one process, for each
system: a fresh SQLite file; then --rounds rounds of (fill --per-agent messages for each of --agents agents,
untimed; drain them all, timed). Only the draining counts: messages drained / seconds spent draining.
Runs alternate the systems (agentpost, plain, agentpost, ...) so drifting machine load hits both alike;
the figure is the ratio of the medians of --runs runs.

* agentpost: the public Queue API exactly as bench/systems_agentpost.py's consumer uses it —
  agents_with_pending, then per agent claim_all_pending_messages, complete_messages (with the reply, so a
  response and its events are written too) and release_agent; passes until agents_with_pending is empty.
* plain: bench/systems_peers.py's SqliteClaimAgent, its SQL as its consumer runs it — one BEGIN IMMEDIATE
  UPDATE ... RETURNING claims every pending row of the oldest message's agent, then one autocommit UPDATE
  per message marks it done; claims until one comes back empty.

Each drain checks that it got exactly the messages of its round. The same round structure as
bench/profile_hot.py --group 20.

    bench/.venv/bin/python bench/claim_batch.py --rounds 50 --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shared.chat.address import ChatAddress

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Msg, make_messages, msg_id_of
from measure import alternate, medians, ratio, say, scratch_dir, write_json
from systems_agentpost import REPLY, AgentpostSqlite
from systems_peers import SqliteClaimAgent, _sqlite_connect

#: A round fills and drains these messages; the drain returns the ids it delivered.
Fill = Callable[[Sequence[Msg]], None]
Drain = Callable[[], list[int]]


def _agentpost(target: str) -> tuple[Fill, Drain, Callable[[], None]]:
    system = AgentpostSqlite()
    system.setup(target)
    queue = system.open_queue(target)
    worker = "bench-claim-batch"

    def fill(batch: Sequence[Msg]) -> None:
        for m in batch:
            queue.intake.enqueue_message(
                ChatAddress("bench", "bench-user", conversation=m.agent), m.body, agent=m.agent
            )

    def drain() -> list[int]:
        got: list[int] = []
        while True:
            agents = queue.messages.agents_with_pending()
            if not agents:
                return got
            for agent in agents:
                group = queue.messages.claim_all_pending_messages(agent, worker)
                if not group:
                    continue
                got.extend(msg_id_of(m.message) for m in group)
                outcome = queue.messages.complete_messages(
                    [m.message_id for m in group], worker, REPLY, release_when_idle=True
                )
                if not outcome.released:
                    queue.leases.release_agent(agent, worker)

    return fill, drain, queue.db.close


def _plain(target: str) -> tuple[Fill, Drain, Callable[[], None]]:
    peer = SqliteClaimAgent()
    peer.setup(target)
    conn: sqlite3.Connection = _sqlite_connect(target)
    slot = 0

    def fill(batch: Sequence[Msg]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO q (id, agent, body) VALUES (?, ?, ?)", [(m.id, m.agent, m.body) for m in batch]
        )
        conn.execute("COMMIT")

    def drain() -> list[int]:
        got: list[int] = []
        while True:
            rows = peer._claim(conn, slot)  # the peer's own claim transaction, as its consumer runs it
            if not rows:
                return got
            for msg_id, body in rows:
                got.append(msg_id_of(body))
                conn.execute("UPDATE q SET state = 2 WHERE id = ?", (msg_id,))

    return fill, drain, conn.close


SYSTEMS: dict[str, Callable[[str], tuple[Fill, Drain, Callable[[], None]]]] = {
    "agentpost": _agentpost,
    "plain": _plain,
}


def one_run(system: str, workdir: Path, *, rounds: int, agents: int, per_agent: int) -> float:
    """Fresh database, `rounds` fill + drain rounds; returns messages drained per second of draining."""
    folder = Path(tempfile.mkdtemp(prefix=f"{system}-", dir=workdir))
    fill, drain, close = SYSTEMS[system](str(folder / "queue.db"))
    size = agents * per_agent
    messages = make_messages(rounds * size, agents, 120)
    spent = 0.0
    try:
        for r in range(rounds):
            batch = messages[r * size : (r + 1) * size]
            fill(batch)
            t = time.perf_counter()
            got = drain()
            spent += time.perf_counter() - t
            if sorted(got) != [m.id for m in batch]:
                raise RuntimeError(f"{system} round {r}: drained {len(got)} ids, not the {size} of the round")
    finally:
        close()
        shutil.rmtree(folder, ignore_errors=True)
    return rounds * size / spent


def measure(*, rounds: int, runs: int, agents: int, per_agent: int) -> dict[str, Any]:
    with scratch_dir("agentpost-claim-batch-") as workdir:
        rates = alternate(
            runs,
            list(SYSTEMS),
            lambda name, k: one_run(name, workdir, rounds=rounds, agents=agents, per_agent=per_agent),
            lambda name, k, rate: f"claim-batch {name:<9} run {k + 1}: {rate:9,.0f} msg/s drained",
        )
    med = medians(rates)
    return {
        "backend": "sqlite",
        "agents": agents,
        "per_agent": per_agent,
        "rounds": rounds,
        "messages": rounds * agents * per_agent,
        "runs": runs,
        "agentpost": rates["agentpost"],
        "plain": rates["plain"],
        "agentpost_median": med["agentpost"],
        "plain_median": med["plain"],
        "ratio": ratio(med["agentpost"], med["plain"]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=50, help="fill + drain rounds per run (default 50)")
    p.add_argument("--runs", type=int, default=3, help="runs of each system, alternating (default 3)")
    p.add_argument("--agents", type=int, default=8, help="agents (default 8)")
    p.add_argument("--per-agent", type=int, default=20, help="messages waiting per agent (default 20)")
    p.add_argument("--json", default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    r = measure(rounds=args.rounds, runs=args.runs, agents=args.agents, per_agent=args.per_agent)
    say(
        f"claim-batch: agentpost {r['agentpost_median']:,.0f} msg/s, plain claim-all {r['plain_median']:,.0f}"
        f" msg/s, ratio {r['ratio']:.2f} ({r['per_agent']} waiting per agent, {r['messages']:,} per run)"
    )
    write_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
