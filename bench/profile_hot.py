"""Profile agentpost's hot paths with pyinstrument: the producer (enqueue) and the consumer (claim-all,
complete with response, release), each alone in this process, on SQLite or PostgreSQL.

    bench/.venv/bin/python bench/profile_hot.py --backend sqlite --n 5000

The producer enqueues N messages to 8 agents; the consumer then drains them the way the benchmark consumer
does, in groups of --group messages per agent (1: one message per claim, the streaming case). Prints the
rate of each phase and pyinstrument's call tree (pass --html DIR for the interactive pages too).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from shared.chat.address import ChatAddress

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import DEFAULT_PG_URL, make_messages, msg_id_of, pg_admin
from systems_agentpost import REPLY, AgentpostPostgres, AgentpostSqlite


def main(argv: list[str] | None = None) -> int:
    from pyinstrument import Profiler

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--group", type=int, default=1, help="messages per agent per claim (default 1)")
    p.add_argument("--pg-url", default=DEFAULT_PG_URL)
    p.add_argument("--html", default=None, help="also write producer.html / consumer.html here")
    args = p.parse_args(argv)

    system = AgentpostSqlite() if args.backend == "sqlite" else AgentpostPostgres()
    tmp = tempfile.TemporaryDirectory(prefix="agentpost-profile-")
    target = str(Path(tmp.name) / "queue.db") if args.backend == "sqlite" else args.pg_url
    if args.backend == "postgres":
        pg_admin(target, "create")
    system.setup(target)
    queue = system.open_queue(target)
    messages = make_messages(args.n, 8, 120)
    # The consumer claims what is there: enqueue in rounds of `group` messages per agent, drain each round.
    rounds = [messages[i : i + 8 * args.group] for i in range(0, len(messages), 8 * args.group)]
    prod, cons = Profiler(interval=0.0002), Profiler(interval=0.0002)
    t_prod = t_cons = 0.0
    done = 0
    for batch in rounds:
        prod.start()
        t = time.perf_counter()
        for m in batch:
            queue.intake.enqueue_message(
                ChatAddress("bench", "bench-user", conversation=m.agent), m.body, agent=m.agent
            )
        t_prod += time.perf_counter() - t
        prod.stop()
        cons.start()
        t = time.perf_counter()
        for agent in queue.messages.agents_with_pending():
            group = queue.messages.claim_all_pending_messages(agent, "profiler")
            done += sum(1 for m in group if msg_id_of(m.message) >= 0)
            outcome = queue.messages.complete_messages(
                [m.message_id for m in group], "profiler", REPLY, release_when_idle=True
            )
            if not outcome.released:
                queue.leases.release_agent(agent, "profiler")
        t_cons += time.perf_counter() - t
        cons.stop()
    queue.db.close()
    if args.backend == "postgres":
        pg_admin(target, "drop")
    tmp.cleanup()
    print(f"# {args.backend}: producer {args.n / t_prod:,.0f} enqueues/s (profiled)")
    print(prod.output_text(unicode=False, color=False))
    print(f"# {args.backend}: consumer {done / t_cons:,.0f} messages/s in groups of {args.group} (profiled)")
    print(cons.output_text(unicode=False, color=False))
    if args.html:
        Path(args.html).mkdir(parents=True, exist_ok=True)
        (Path(args.html) / "producer.html").write_text(prod.output_html())
        (Path(args.html) / "consumer.html").write_text(cons.output_html())
    return 0


if __name__ == "__main__":
    sys.exit(main())
