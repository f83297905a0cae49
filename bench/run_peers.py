"""Run the queue benchmark over the peer and baseline systems and print a table.

Run with the benchmark's own virtualenv (see bench/setup_venv.sh):

    bench/.venv/bin/python bench/run_peers.py            # everything, defaults (~3-4 minutes on 2 cores)
    bench/.venv/bin/python bench/run_peers.py --only sqlite-per-op,litequeue --variants base --runs 5

Variants: base (1 producer + 1 consumer process, N messages), c2 / c4 (2 / 4 consumer processes,
--variant-n messages), crash (2 consumers, --kills random SIGKILLs of consumer processes per run, each
restarted at once, --variant-n messages, --crash-runs runs). Throughput is end to end: from the first
enqueue to the last ack. lost/dup/recovered are summed over the runs of a row.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import DEFAULT_PG_URL, QueueSystem, RunResult, Series, Variant, effective_n, pg_admin, run_next
from measure import PEER_COLUMNS, peer_cells

NOTES = {
    "huey-SqliteStorage": "at most once (dequeue deletes); synchronous=FULL (its default)",
    "persist-queue-SQLiteAckQueue": "its claim scans acked rows, slower as they accumulate",
    "sqlite-claim-agent": "claims all pending rows of one agent per transaction",
    "sqlite-insert-event": "enqueue = message row + one event row in one transaction; per-op consumer",
    "pg-skip-locked": "synchronous_commit=off (durability of SQLite WAL+NORMAL)",
    "pg-skip-locked-agent": "claims all pending rows of one agent per transaction; synchronous_commit=off",
    "pg-skip-locked-fsync": "synchronous_commit=on (server default): fsync per commit",
    "litequeue": "v0.9 (0.11+ needs Python 3.12)",
}


def note_for(system: QueueSystem, requested_n: int) -> str:
    parts = [NOTES.get(system.name, "")]
    if effective_n(system, requested_n) < requested_n:
        parts.append(f"N capped at {system.max_n} (slow)")
    return "; ".join(p for p in parts if p)


def load_systems(extra: list[str]) -> list[QueueSystem]:
    from systems_peers import ALL_PEERS

    systems: list[QueueSystem] = [cls() for cls in ALL_PEERS]
    for spec in extra:
        module, _, attr = spec.partition(":")
        if not attr:
            raise SystemExit(f"--add wants MODULE:CLASS, got {spec!r}")
        systems.append(getattr(importlib.import_module(module), attr)())
    return systems


def build_variants(args: argparse.Namespace) -> list[tuple[Variant, int]]:
    known = {
        "base": (Variant("base", consumers=1), args.runs),
        "c2": (Variant("c2", consumers=2, n=args.variant_n), args.runs),
        "c4": (Variant("c4", consumers=4, n=args.variant_n), args.runs),
        "crash": (Variant("crash", consumers=2, n=args.variant_n, kills=args.kills), args.crash_runs),
    }
    out = []
    for name in args.variants.split(","):
        if name.strip() not in known:
            raise SystemExit(f"unknown variant {name!r}; choose from {', '.join(known)}")
        out.append(known[name.strip()])
    return out


def print_table(rows: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    head = PEER_COLUMNS
    body = [peer_cells(r, str(r["n"])) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    right = set(range(2, len(head)))

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(line(head), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for b in body:
        print(line(b), file=out)
    notes = sorted({(r["system"], r["note"]) for r in rows if r.get("note")})
    errors = [(r["system"], r["variant"], e) for r in rows for e in r["errors"]]
    if notes:
        print("\nnotes:", file=out)
        for system, note in notes:
            print(f"  {system}: {note}", file=out)
    if errors:
        print("\nerrors:", file=out)
        for system, variant, e in errors:
            print(f"  {system} {variant}: {e}", file=out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20_000, help="messages per base run (default 20000)")
    p.add_argument("--runs", type=int, default=3, help="runs per row; the table shows the median (default 3)")
    p.add_argument("--variant-n", type=int, default=5_000, help="messages per c2/c4/crash run (default 5000)")
    p.add_argument("--variants", default="base,c2,c4,crash", help="comma list of base,c2,c4,crash")
    p.add_argument("--kills", type=int, default=5, help="SIGKILLs per crash run (default 5)")
    p.add_argument("--crash-runs", type=int, default=1, help="runs of the crash variant (default 1)")
    p.add_argument("--only", default="", help="comma list of system names (default: all)")
    p.add_argument("--add", action="append", default=[], metavar="MODULE:CLASS", help="extra system to run")
    p.add_argument("--agents", type=int, default=8, help="distinct agents (default 8)")
    p.add_argument("--payload", type=int, default=120, help="message body size in bytes (default 120)")
    p.add_argument("--pg-url", default=DEFAULT_PG_URL, help="database created and dropped by the run")
    p.add_argument("--seed", type=int, default=0, help="seed for the crash schedule")
    p.add_argument("--workdir", default=None, help="parent folder for scratch files (default: system temp)")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder")
    p.add_argument("--json", metavar="OUT", default=None, help="write all results (per run too) as JSON")
    p.add_argument("--list", action="store_true", help="list the systems and exit")
    args = p.parse_args(argv)

    try:
        systems = load_systems(args.add)
    except ImportError as exc:
        print(
            f"cannot import a peer ({exc}); run bench/setup_venv.sh and use bench/.venv/bin/python",
            file=sys.stderr,
        )
        return 2
    if args.list:
        for s in systems:
            print(f"{s.name}\t{s.backend}")
        return 0
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = set(wanted) - {s.name for s in systems}
        if unknown:
            print(f"unknown systems: {', '.join(sorted(unknown))} (see --list)", file=sys.stderr)
            return 2
        systems = [s for s in systems if s.name in wanted]
    variants = build_variants(args)

    skipped: list[str] = []
    pg_made = False
    if any(s.backend == "postgres" for s in systems):
        try:
            pg_admin(args.pg_url, "create")
            pg_made = True
        except Exception as exc:
            print(f"PostgreSQL unavailable ({exc}); skipping its systems", file=sys.stderr)
            skipped = [s.name for s in systems if s.backend == "postgres"]
            systems = [s for s in systems if s.backend != "postgres"]

    workdir = Path(tempfile.mkdtemp(prefix="agentpost-bench-", dir=args.workdir))
    total_runs = len(systems) * sum(runs for _, runs in variants)
    done = 0
    t_all = time.monotonic()
    rows: list[dict[str, Any]] = []

    def on_run(series: Series, r: RunResult) -> None:
        nonlocal done
        done += 1
        extra = f" kills={r.kills} recovered={r.recovered}" if r.kills else ""
        status = f"ERROR {r.error}" if r.error else f"{r.msgs_per_s:>9,.0f} msg/s"
        extra += f" load={r.load1:.1f}"
        print(
            f"[{done:>3}/{total_runs}] {time.monotonic() - t_all:6.1f}s  {series.system:<28}"
            f" {series.variant:<5} N={series.n:<6} run {len(series.runs)}: {status}"
            f"  lost={r.lost} dup={r.duplicated}{extra}",
            file=sys.stderr,
            flush=True,
        )

    try:
        # Runs alternate between the systems (run 1 of each, then run 2 of each, ...), as the one-process
        # benchmarks do: a machine that drifts, or a server still busy after the previous system's runs,
        # then weighs on every system alike instead of on whichever runs last.
        for variant, runs in variants:
            series = {
                s.name: Series(s.name, variant.name, effective_n(s, variant.n or args.n)) for s in systems
            }
            for _ in range(runs):
                for system in systems:
                    run_next(
                        system,
                        variant,
                        series[system.name],
                        workdir=workdir,
                        pg_url=args.pg_url,
                        seed=args.seed,
                        on_run=on_run,
                        agents=args.agents,
                        payload_size=args.payload,
                    )
                    if not args.keep:
                        for d in workdir.glob(f"{system.name}-{variant.name}-*"):
                            shutil.rmtree(d, ignore_errors=True)
            for system in systems:
                row = series[system.name].summary()
                row["note"] = note_for(system, args.n)
                rows.append(row)
    finally:
        if pg_made:
            try:
                pg_admin(args.pg_url, "drop")
            except Exception as exc:
                print(f"could not drop the benchmark database: {exc}", file=sys.stderr)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    wall = time.monotonic() - t_all
    print()
    print_table(rows)
    print(
        "\nmsgs/s: first enqueue to last ack; enq/s: the producer alone (median). lost/dup/recov/dup-other: summed over a row's runs (recov:"
        " redelivered after its consumer was SIGKILLed; dup-other: delivered twice to processes never killed)."
        f"\nload: highest 1-minute load average after a run ({os.cpu_count()} cores: much above that, other"
        " work competed and the row is noisy)."
    )
    if skipped:
        print(f"\nskipped (PostgreSQL unavailable): {', '.join(skipped)}")
    print(
        f"\nwall time {wall:.1f}s; base: 1 producer + 1 consumer process, {args.agents} agents,"
        f" {args.payload}-byte messages; medians of {args.runs} runs (crash: {args.crash_runs})"
    )
    if args.keep:
        print(f"scratch kept in {workdir}")
    if args.json:
        meta = {"args": vars(args), "wall_s": wall, "skipped": skipped, "python": sys.version}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
