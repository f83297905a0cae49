"""Cross-process pickup latency at a steady rate, and what a waiting process costs when idle.

A producer process enqueues at a fixed rate (default 200 messages/s) with the real
:meth:`Queue.intake.enqueue_message` and records the moment each commit returned; a consumer process waits on
:class:`shared.events.wake.Waker` (read the generation, look for work, ``wait(generation, timeout)``), claims with
:meth:`Queue.messages.claim_all_pending_messages`, records the moment each claim returned, then completes the group
and releases the agent. ``time.monotonic`` is one system-wide clock on Linux, so the two processes'
timestamps compare directly. Latency = claim time - commit time, per message.

Idle cost: a separate process opens the queue, starts its Waker and waits (as an idle processor does) for
``--idle-s`` seconds; its CPU time (``resource.getrusage``, user + system, all threads) over the wall time is
the share of one core it costs.

    bench/.venv/bin/python bench/latency.py --backend sqlite --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shared.chat.address import ChatAddress

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import DEFAULT_PG_URL, make_messages, msg_id_of
from measure import backends, say, write_json
from systems_agentpost import AgentpostPostgres, AgentpostSqlite


def _system(backend: str) -> AgentpostSqlite:
    return AgentpostSqlite() if backend == "sqlite" else AgentpostPostgres()


def _producer(backend: str, target: str, n: int, rate: float, start: Any, out: str) -> None:
    queue = _system(backend).open_queue(target)
    queue.db.connection()
    messages = make_messages(n, 8, 120)
    start.wait()
    t0 = time.monotonic()
    commits: list[float] = []
    for i, m in enumerate(messages):
        due = t0 + i / rate
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        queue.intake.enqueue_message(
            ChatAddress("bench", "bench-user", conversation=m.agent), m.body, agent=m.agent
        )
        commits.append(time.monotonic())
    queue.db.close()
    Path(out).write_text(json.dumps(commits))


def _consumer(backend: str, target: str, n: int, wake_ms: int, ready: Any, start: Any, out: str) -> None:
    from shared.events.wake import Waker

    queue = _system(backend).open_queue(target)
    queue.db.connection()
    waker = Waker(queue.db, interval_ms=wake_ms).start()
    claims: dict[int, float] = {}
    ready.set()
    start.wait()
    deadline = time.monotonic() + n / 50 + 30
    worker = "latency-consumer"
    while len(claims) < n and time.monotonic() < deadline:
        gen = waker.generation
        got = False
        for agent in queue.messages.agents_with_pending():
            group = queue.messages.claim_all_pending_messages(agent, worker)
            now = time.monotonic()
            if not group:
                continue
            got = True
            for m in group:
                claims[msg_id_of(m.message)] = now
            outcome = queue.messages.complete_messages(
                [m.message_id for m in group], worker, "ok", release_when_idle=True
            )
            if not outcome.released:
                queue.leases.release_agent(agent, worker)
        if not got:
            waker.wait(gen, 1.0)
    waker.stop()
    queue.db.close()
    Path(out).write_text(json.dumps(claims))


def _idle(backend: str, target: str, wake_ms: int, seconds: float, out: str) -> None:
    from shared.events.wake import Waker

    queue = _system(backend).open_queue(target)
    queue.db.connection()
    waker = Waker(queue.db, interval_ms=wake_ms).start()
    time.sleep(0.5)  # past start-up
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    end = w0 + seconds
    while (left := end - time.monotonic()) > 0:
        gen = waker.generation
        if not queue.messages.agents_with_pending():  # what an idle processor does after each wake-up
            waker.wait(gen, min(left, 5.0))
    r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    waker.stop()
    queue.db.close()
    Path(out).write_text(json.dumps({"cpu_s": cpu, "wall_s": w1 - w0}))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def measure(backend: str, *, n: int, rate: float, wake_ms: int, idle_s: float, pg_url: str) -> dict[str, Any]:
    """One latency run and one idle measurement; returns the figures (milliseconds, core share)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="agentpost-latency-") as tmp:
        target = str(Path(tmp) / "queue.db") if backend == "sqlite" else pg_url
        system = _system(backend)
        system.setup(target)
        ready, start = ctx.Event(), ctx.Event()
        cons_out, prod_out, idle_out = (
            str(Path(tmp) / f) for f in ("claims.json", "commits.json", "idle.json")
        )
        cons = ctx.Process(target=_consumer, args=(backend, target, n, wake_ms, ready, start, cons_out))
        prod = ctx.Process(target=_producer, args=(backend, target, n, rate, start, prod_out))
        cons.start()
        prod.start()
        if not ready.wait(60):
            raise RuntimeError("latency consumer did not start")
        time.sleep(0.3)  # the producer connects meanwhile
        start.set()
        prod.join(n / rate + 60)
        cons.join(60)
        for p in (prod, cons):
            if p.is_alive():
                p.kill()
        commits = json.loads(Path(prod_out).read_text())
        claims = {int(k): v for k, v in json.loads(Path(cons_out).read_text()).items()}
        lat = [(claims[i] - commits[i]) * 1000 for i in range(len(commits)) if i in claims]
        idle = ctx.Process(target=_idle, args=(backend, target, wake_ms, idle_s, idle_out))
        idle.start()
        idle.join(idle_s + 60)
        idle_fig = json.loads(Path(idle_out).read_text())
    return {
        "backend": backend,
        "wake_ms": wake_ms,
        "rate": rate,
        "n": n,
        "claimed": len(lat),
        "lost": n - len(lat),
        "p50_ms": statistics.median(lat) if lat else None,
        "p99_ms": percentile(lat, 99) if lat else None,
        "max_ms": max(lat) if lat else None,
        "idle_cpu_share": idle_fig["cpu_s"] / idle_fig["wall_s"],
        "idle_s": idle_fig["wall_s"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgres"], action="append", help="default: both")
    p.add_argument("--n", type=int, default=1000, help="messages per run (default 1000: 5 s at 200/s)")
    p.add_argument("--rate", type=float, default=200.0, help="messages per second (default 200)")
    p.add_argument(
        "--wake-ms",
        default="20",
        help="comma list of SQLite Waker poll intervals (default 20, the setting's)",
    )
    p.add_argument("--idle-s", type=float, default=5.0, help="idle measurement length (default 5 s)")
    p.add_argument("--pg-url", default=DEFAULT_PG_URL)
    p.add_argument("--json", default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    results = []
    for backend in backends(args.backend, args.pg_url):
        wakes = [int(w) for w in args.wake_ms.split(",")] if backend == "sqlite" else [20]
        for wake in wakes:
            r = measure(
                backend, n=args.n, rate=args.rate, wake_ms=wake, idle_s=args.idle_s, pg_url=args.pg_url
            )
            results.append(r)
            say(
                f"latency {backend:<8} wake={wake:>3}ms  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms"
                f"  max {r['max_ms']:6.1f} ms  claimed {r['claimed']}/{r['n']}"
                f"  idle CPU {r['idle_cpu_share'] * 100:.2f}% of a core"
            )
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
