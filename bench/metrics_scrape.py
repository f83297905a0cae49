"""What one scrape of ``/metrics`` costs on a database with history, and that the cost stays flat as it grows.

Builds a database holding ``--messages`` finished messages, ``--per-day`` of them a day going back as far as
that takes (each with its reply, four events — received, claimed, run end, reply ready — and a usage row; one in
500 of the last week's a dead letter), plus ``--recent`` messages in the last hour (the window of the scrape's
run and delivery figures). A bigger history is then a longer one with the same daily traffic. Then serves
it with the real web app on 127.0.0.1 and times ``GET /metrics`` with the token, ``--scrapes`` times, and the CPU time of the database read alone.
Pass ``--messages`` twice to compare sizes with the same recent traffic.

    .venv/bin/python bench/metrics_scrape.py --messages 50000 --messages 500000
    .venv/bin/python bench/metrics_scrape.py --backend postgres --messages 50000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared.clock import now_ms  # noqa: E402
from shared.reads.metrics import read_figures  # noqa: E402
from shared.storage.schema import open_database  # noqa: E402
from tests.web_support import LiveServer, make_home, runtime_for  # noqa: E402

AGENTS = ("alpha", "beta", "gamma")
HOUR_MS = 3_600_000
_MESSAGE = (
    "INSERT INTO messages (message_id, channel, sender, message, agent, status, created_at, updated_at, "
    "available_at, run_started_at) VALUES (:m, 'telegram', 'ann', 'hello', :a, :s, :c, :u, :c, :r)"
)
_RESPONSE = (
    "INSERT INTO responses (message_id, channel, message, agent, status, created_at, updated_at, acked_at) "
    "VALUES (:m, 'telegram', 'answer', :a, 'acked', :u, :u, :u)"
)
_EVENT = (
    "INSERT INTO events (id, topic, type, message_id, payload, created_at) "
    "VALUES (:id, 'queue', :t, :m, :p, :at)"
)
_USAGE = (
    "INSERT INTO run_usage (message_id, agent, input_tokens, output_tokens, cost_usd, duration_ms, "
    "created_at) VALUES (:m, :a, 10, 7, 0.01, 2500, :u)"
)


def fill(url: str, messages: int, recent: int, per_day: int) -> None:
    """Write the history described in the module docstring, oldest first (event ids follow time)."""
    db = open_database(url)
    now = now_ms()
    span = messages * 86_400_000 // per_day
    times = [now - span + (span - HOUR_MS) * i // max(1, messages) for i in range(messages)]
    times += [now - HOUR_MS + HOUR_MS * i // max(1, recent) for i in range(recent)]
    event_id = 0
    for start in range(0, len(times), 5000):
        rows: dict[str, list[dict[str, Any]]] = {"m": [], "r": [], "e": [], "u": []}
        for i, at in enumerate(times[start : start + 5000], start):
            mid, agent = f"bench_{i:08d}", AGENTS[i % len(AGENTS)]
            status = "dead" if i % 500 == 0 and at > now - 7 * 86_400_000 else "completed"
            done = at + 3000
            rows["m"].append({"m": mid, "a": agent, "s": status, "c": at, "u": done, "r": at + 400})
            rows["r"].append({"m": mid, "a": agent, "u": done})
            rows["u"].append({"m": mid, "a": agent, "u": done})
            end = {"agent": agent, "ok": status == "completed", "duration_ms": 2500, "first_text_ms": 700}
            for kind, when, payload in (
                ("message_received", at, {"agent": agent}),
                ("message_claimed", at + 300, {"agent": agent, "message_ids": [mid]}),
                ("chain_step_done", done, {**end, "message_ids": [mid]}),
                ("response_ready", done, {"agent": agent}),
            ):
                event_id += 1
                rows["e"].append({"id": event_id, "t": kind, "m": mid, "p": json.dumps(payload), "at": when})
        with db.transaction() as tx:
            tx.executemany(_MESSAGE, rows["m"])
            tx.executemany(_RESPONSE, rows["r"])
            tx.executemany(_EVENT, rows["e"])
            tx.executemany(_USAGE, rows["u"])
    db.close()


def scrape_times(url: str, workdir: Path, scrapes: int) -> dict[str, float]:
    """Median and slowest wall time of ``GET /metrics`` against the real web app, and the read time the
    scrape itself reports (``agentpost_metrics_read_seconds``), in ms."""
    rt = runtime_for(make_home(workdir, db_url=url))
    walls, reads = [], []
    try:
        with LiveServer(rt) as live, live.client() as client:
            client.get("/metrics")  # the first connection and statement preparation, not timed
            for _ in range(scrapes):
                t0 = time.perf_counter()
                response = client.get("/metrics")
                walls.append((time.perf_counter() - t0) * 1000)
                response.raise_for_status()
                line = next(x for x in response.text.splitlines() if x.startswith("agentpost_metrics_read"))
                reads.append(float(line.split()[-1]) * 1000)
    finally:
        rt.close()
    # The CPU time of the database read alone, in this thread: what the scrape costs, whatever else the
    # machine is busy with (wall times move with the load of other work on a shared machine).
    # On PostgreSQL the server's share too: the CPU time its backend process for this connection spent.
    db = open_database(url, create=False)
    cpu = []
    try:
        backend = None if db.dialect.is_sqlite else int(db.read_scalar("SELECT pg_backend_pid()"))
        server_before = _cpu_ticks(backend)
        for _ in range(scrapes):
            t0 = time.thread_time()
            read_figures(db)
            cpu.append((time.thread_time() - t0) * 1000)
        server_ms = (_cpu_ticks(backend) - server_before) * 1000 / os.sysconf("SC_CLK_TCK") / scrapes
    finally:
        db.close()
    return {
        "wall_median_ms": statistics.median(walls),
        "wall_max_ms": max(walls),
        "read_median_ms": statistics.median(reads),
        "cpu_median_ms": statistics.median(cpu),
        "server_cpu_ms": server_ms,
    }


def _cpu_ticks(pid: int | None) -> int:
    """User and system CPU time of process ``pid`` so far, in clock ticks (0 for None)."""
    if pid is None:
        return 0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--messages", type=int, action="append", help="history sizes (default 50000)")
    p.add_argument("--recent", type=int, default=1000, help="messages in the last hour (default 1000)")
    p.add_argument("--per-day", type=int, default=1700, help="messages a day in the history (default 1700)")
    p.add_argument("--scrapes", type=int, default=20, help="timed scrapes per size (default 20)")
    args = p.parse_args(argv)
    for size in args.messages or [50_000]:
        with (
            tempfile.TemporaryDirectory(prefix="agentpost-metrics-") as tmp,
            _database(args.backend, args.pg_url, Path(tmp)) as url,
        ):
            workdir = Path(tmp)
            t0 = time.monotonic()
            fill(url, size, args.recent, args.per_day)
            if args.backend == "postgres":
                _analyze(url)
            built = time.monotonic() - t0
            figures = scrape_times(url, workdir, args.scrapes)
            print(
                f"{args.backend} {size:,} messages (+{args.recent:,} in the last hour, built in {built:.0f} s): "
                f"scrape median {figures['wall_median_ms']:.1f} ms, slowest {figures['wall_max_ms']:.1f} ms, "
                f"database read {figures['read_median_ms']:.1f} ms, its CPU time {figures['cpu_median_ms']:.1f} ms "
                + (
                    f"+ {figures['server_cpu_ms']:.1f} ms in the server "
                    if args.backend == "postgres"
                    else ""
                )
                + f"({args.scrapes} scrapes, load {os.getloadavg()[0]:.1f})"
            )
    return 0


def _analyze(url: str) -> None:
    """Give PostgreSQL's planner the statistics autovacuum gathers soon after a bulk load in real life: right
    after it, the planner knows nothing of the rows and reads whole tables where an index would do."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")


@contextlib.contextmanager
def _database(backend: str, server_url: str, workdir: Path) -> Iterator[str]:
    """A new, empty database for one size: a SQLite file in ``workdir``, or a PostgreSQL database of its own
    on the server at ``server_url``, dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{workdir / 'agentpost.db'}"
        return
    import psycopg

    name = f"agentpost_bench_metrics_{os.getpid()}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = server_url.rsplit("/", 1)[0] + "/" + name
    try:
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    raise SystemExit(main())
