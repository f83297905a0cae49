"""How long `agentpost backup` takes on a database with many messages, and how long an enqueue waits while it
runs (SQLite and PostgreSQL).

    .venv/bin/python bench/backup.py [--messages 50000] [--db sqlite|postgresql|both]
        [--pg-url postgresql://postgres@127.0.0.1:5432/postgres]

For each database: a fresh home whose database gets ``--messages`` messages through the real queue
(``enqueue_message``, about 200 characters each, over 50 chats), then one thread enqueues without pause for a
few seconds alone (the baseline) and again while `agentpost backup FILE` runs as its own process, as an
operator starts it. Printed: the copy's size, the backup's own time (as the command reports it) and its wall
time (with the command's start), and the enqueue latency (median, p99, max) and count with and without the
backup. On PostgreSQL a database is created on the server for the run and dropped after.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg

from shared.chat.address import ChatAddress
from shared.runtime import Runtime, open_runtime

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))
BASELINE_SECONDS = 5.0


class Flow:
    """Enqueues in a thread until stopped, timing each call."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: (when the call started, how long it took), perf_counter seconds.
        self.calls: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            start = time.perf_counter()
            self.rt.queue.intake.enqueue_message(ChatAddress("web", f"flow{n % 10}", "ann"), f"flow {n}")
            self.calls.append((start, time.perf_counter() - start))

    def waits(self, since: float = 0.0, until: float = float("inf")) -> list[float]:
        """The waits of the calls that were under way at some point in ``[since, until]``."""
        return [wait for start, wait in self.calls if start <= until and start + wait >= since]

    def __enter__(self) -> Flow:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def summary(waits: list[float]) -> str:
    if not waits:
        return "no enqueue"
    ordered = sorted(waits)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"{len(waits)} enqueues, median {statistics.median(ordered) * 1000:.2f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms"
    )


def fill(rt: Runtime, count: int, threads: int = 8) -> float:
    """``count`` messages through the queue, from ``threads`` threads (PostgreSQL takes writers side by side)."""
    text = "x" * 190

    def part(first: int) -> None:
        for n in range(first, count, threads):
            rt.queue.intake.enqueue_message(ChatAddress("web", f"chat{n % 50}", "ann"), f"{n} {text}")

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(part, range(threads)))
    return time.perf_counter() - start


def measure(name: str, url: str, messages: int) -> None:
    with tempfile.TemporaryDirectory(prefix="agentpost-bench-backup-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        (home / "settings.toml").write_text(f'[database]\nurl = "{url}"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
        env.update(AGENTPOST_HOME=str(home), NO_COLOR="1")
        rt = open_runtime(home, env={})
        try:
            took = fill(rt, messages)
            print(f"{name}: {messages} messages enqueued in {took:.1f} s")
            with Flow(rt) as alone:
                time.sleep(BASELINE_SECONDS)
            copy = Path(tmp) / f"copy.{'db' if name == 'sqlite' else 'dump'}"
            with Flow(rt) as during:
                start = time.perf_counter()
                out = subprocess.run(
                    [AGENTPOST, "backup", str(copy)], env=env, capture_output=True, text=True, check=False
                )
                end = time.perf_counter()
                wall = end - start
            if out.returncode != 0:
                raise SystemExit(f"{name}: backup failed: {out.stderr}")
            reported = re.search(r"\(([\d.]+ \w+), ([\d.]+) s\)", out.stdout)
            if reported is None:
                raise SystemExit(f"{name}: cannot read the backup's report: {out.stdout}")
            size, seconds = reported.group(1), float(reported.group(2))
            held = re.search(r"messages: (\d+)", out.stdout)
            print(
                f"{name}: backup of {held.group(1) if held else '?'} messages: {size}, {seconds:.2f} s (wall {wall:.1f} s)"
            )
            print(f"{name}: enqueue without backup:          {summary(alone.waits())}")
            print(f"{name}: enqueue while the command ran:   {summary(during.waits())}")
            # The copy is the command's last part (then the record and the report): its window, with a margin.
            copying = during.waits(end - seconds - 1.0, end)
            print(f"{name}: enqueue during the copy (+-1 s):  {summary(copying)}")
        finally:
            rt.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("AGENTPOST_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args()
    if args.db in ("sqlite", "both"):
        with tempfile.TemporaryDirectory(prefix="agentpost-bench-db-") as tmp:
            measure("sqlite", f"sqlite:///{tmp}/agentpost.db", args.messages)
    if args.db in ("postgresql", "both"):
        db_name = f"agentpost_bench_{secrets.token_hex(4)}"
        with psycopg.connect(args.pg_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db_name}"')
        try:
            measure("postgresql", f"{args.pg_url.rpartition('/')[0]}/{db_name}", args.messages)
        finally:
            with psycopg.connect(args.pg_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
