"""Growth: end-to-end throughput with 1,000,000 completed messages retained vs an empty database.

The same harness run as the base variant of run_peers.py (1 producer + 1 consumer process, N messages,
8 agents), for agentpost on an empty database and on one that already holds ``--retained`` completed
messages (inserted in bulk: INSERT ... SELECT over a recursive CTE on SQLite, generate_series on
PostgreSQL). Runs alternate empty / retained so drifting machine load hits both alike. Target: the median
with the history is at least 0.9x the median without.

    bench/.venv/bin/python bench/growth.py --backend sqlite --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import DEFAULT_PG_URL, run_once, target_for
from measure import backends, medians, ratio, say, scratch_dir, write_json
from systems_agentpost import (
    AgentpostPostgres,
    AgentpostPostgresRetained,
    AgentpostSqlite,
    AgentpostSqliteRetained,
    cleanup_templates,
)


def measure(backend: str, *, n: int, runs: int, retained: int, pg_url: str) -> dict[str, Any]:
    empty = AgentpostSqlite() if backend == "sqlite" else AgentpostPostgres()
    full = AgentpostSqliteRetained() if backend == "sqlite" else AgentpostPostgresRetained()
    full.retained = retained
    rates: dict[str, list[float]] = {"empty": [], "retained": []}
    problems: list[str] = []
    with scratch_dir("agentpost-growth-") as workdir:
        try:
            for k in range(runs):
                for label, system in (("empty", empty), ("retained", full)):
                    rundir = workdir / f"{label}-{k}"
                    t0 = time.monotonic()
                    r = run_once(
                        system, target_for(system, rundir, pg_url), rundir, n=n, rng=random.Random(k)
                    )
                    shutil.rmtree(rundir, ignore_errors=True)
                    if r.error or r.lost or r.duplicated:
                        problems.append(f"{label} run {k}: error={r.error} lost={r.lost} dup={r.duplicated}")
                    rates[label].append(r.msgs_per_s)
                    say(
                        f"growth {backend:<8} {label:<8} run {k + 1}: {r.msgs_per_s:8,.0f} msg/s"
                        f"  (setup + run {time.monotonic() - t0:5.1f} s, load {r.load1:.1f})"
                    )
        finally:
            cleanup_templates()
    med = medians(rates)
    return {
        "backend": backend,
        "n": n,
        "retained": retained,
        "runs": runs,
        "empty": rates["empty"],
        "with_retained": rates["retained"],
        "empty_median": med["empty"],
        "retained_median": med["retained"],
        "ratio": ratio(med["retained"], med["empty"]),
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgres"], action="append", help="default: both")
    p.add_argument("--n", type=int, default=20_000, help="messages per run (default 20000)")
    p.add_argument("--runs", type=int, default=3, help="runs of each (default 3)")
    p.add_argument("--retained", type=int, default=1_000_000, help="completed messages kept (default 1e6)")
    p.add_argument("--pg-url", default=DEFAULT_PG_URL)
    p.add_argument("--json", default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    results = []
    for backend in backends(args.backend, args.pg_url):
        r = measure(backend, n=args.n, runs=args.runs, retained=args.retained, pg_url=args.pg_url)
        results.append(r)
        say(
            f"growth {backend}: empty {r['empty_median']:,.0f} msg/s, with {args.retained:,} retained"
            f" {r['retained_median']:,.0f} msg/s, ratio {r['ratio']:.2f}"
        )
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
