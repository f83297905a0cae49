"""Turn the JSON results of one `make bench` run into a printed table and docs/benchmarks.md.

Inputs (in --results): peers.json (run_peers.py), latency.json, growth.json, parallel.json, meta.json
(written by bench/run.sh: command, start/end, load samples). Everything missing is reported as missing.
The hand-written analysis in bench/analysis.md (profiles, why a target is missed) is appended verbatim.

    bench/.venv/bin/python bench/report.py --results DIR --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def machine() -> dict[str, str]:
    """nproc, CPU model, RAM, Python, SQLite and PostgreSQL versions."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    pg = "unavailable"
    try:
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=3) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            pg = str(row[0]) if row else "?"
    except Exception:
        pass
    return {
        "cores (nproc)": str(os.cpu_count()),
        "CPU": cpu,
        "RAM": ram,
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "SQLite": sqlite3.sqlite_version,
        "PostgreSQL": pg,
    }


def _git_head() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        )
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def _row(rows: list[dict[str, Any]], system: str, variant: str = "base") -> dict[str, Any] | None:
    for r in rows:
        if r["system"] == system and r["variant"] == variant and not r["errors"]:
            return r
    return None


def _rate(rows: list[dict[str, Any]], system: str, variant: str = "base") -> float | None:
    r = _row(rows, system, variant)
    return None if r is None else r["median"]


def targets(peers: Any, latency: Any, growth: Any, parallel: Any) -> list[tuple[str, str, str, str]]:
    """(what, target, measured, verdict) for every target of issue 7."""
    out: list[tuple[str, str, str, str]] = []
    rows = peers["rows"] if peers else []

    def ratio(what: str, a: str, b: str, goal: float, variant: str = "base") -> None:
        x, y = _rate(rows, a, variant), _rate(rows, b, variant)
        if x is None or y is None:
            out.append((what, f">= {goal:g}x", "missing", "NOT MEASURED"))
            return
        r = x / y
        verdict = "met" if r >= goal else f"NOT MET ({r / goal:.0%} of target)"
        out.append((what, f">= {goal:g}x", f"{r:.2f}x ({x:,.0f} vs {y:,.0f} msg/s)", verdict))

    ratio("SQLite e2e vs plain sqlite3 per op", "agentpost-sqlite", "sqlite-per-op", 0.8)
    ratio("SQLite e2e vs litequeue", "agentpost-sqlite", "litequeue", 1.5)
    ratio("SQLite e2e vs huey", "agentpost-sqlite", "huey-SqliteStorage", 2.0)
    ratio(
        "SQLite e2e vs persist-queue (N capped for it)",
        "agentpost-sqlite",
        "persist-queue-SQLiteAckQueue",
        5.0,
    )
    ratio("batched path vs plain sqlite3 claim-all", "agentpost-sqlite", "sqlite-claim-agent", 0.9)
    ratio("PostgreSQL vs SKIP LOCKED per message", "agentpost-pg", "pg-skip-locked", 0.8)
    ratio("PostgreSQL vs SKIP LOCKED claim-all", "agentpost-pg", "pg-skip-locked-agent", 0.8)
    for system in ("agentpost-sqlite", "agentpost-pg"):
        for variant in ("c2", "c4"):
            r = _row(rows, system, variant)
            got = "missing" if r is None else f"dup {r['duplicated']}, lost {r['lost']}"
            ok = r is not None and r["duplicated"] == 0 and r["lost"] == 0
            out.append((f"{system} {variant[1]} consumers", "dup 0, lost 0", got, "met" if ok else "NOT MET"))
        r = _row(rows, system, "crash")
        if r is None:
            out.append((f"{system} SIGKILLs", "lost 0", "missing", "NOT MEASURED"))
        else:
            got = (
                f"{r['kills']} kills: lost {r['lost']}, dup {r['duplicated']} (recovered {r['recovered']},"
                f" unexplained {r['dup_unexplained']})"
            )
            ok = r["lost"] == 0 and r["dup_unexplained"] == 0 and r["kills"] >= 20
            out.append((f"{system} SIGKILLs", "20 kills, lost 0", got, "met" if ok else "NOT MET"))
    for lat in latency or []:
        label = (
            f"latency {lat['backend']} (Waker: inotify, fallback poll {lat['wake_ms']} ms)"
            if lat["backend"] == "sqlite"
            else ("latency postgres (LISTEN/NOTIFY)")
        )
        p50, p99, idle = lat["p50_ms"], lat["p99_ms"], lat["idle_cpu_share"] * 100
        misses = [m for m, bad in (("p50", p50 >= 5), ("p99", p99 >= 20), ("idle", idle >= 1)) if bad]
        out.append(
            (
                label,
                "p50 < 5 ms, p99 < 20 ms, idle < 1%",
                f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, idle {idle:.2f}%",
                "met" if not misses else "NOT MET: " + ", ".join(misses),
            )
        )
    for g in growth or []:
        r = g["ratio"]
        out.append(
            (
                f"growth {g['backend']} ({g['retained']:,} completed retained)",
                ">= 0.9x",
                f"{r:.2f}x ({g['retained_median']:,.0f} vs {g['empty_median']:,.0f} msg/s)",
                "met" if r >= 0.9 and not g["problems"] else "NOT MET",
            )
        )
    for p in parallel or []:
        out.append(
            (
                f"parallelism K={p['k']} (cap {p['cap']})",
                "about 5 s (ratio ~1)",
                f"{p['wall_s']:.2f} s, ratio {p['ratio']:.2f}",
                "met" if p["ratio"] <= 1.2 else "NOT MET",
            )
        )
    return out


def _md_table(head: list[str], body: list[list[str]], right: Callable[[int], bool] = lambda i: False) -> str:
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" if right(i) else "---" for i in range(len(head))) + "|",
    ]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in body]
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def render(results: Path) -> tuple[str, str]:
    """(console text, markdown)."""
    peers = _load(results / "peers.json")
    latency = _load(results / "latency.json")
    growth = _load(results / "growth.json")
    parallel = _load(results / "parallel.json")
    meta = _load(results / "meta.json") or {}
    tg = targets(peers, latency, growth, parallel)

    console = ["", "Targets (issue 7):"]
    w = max(len(t[0]) for t in tg) if tg else 10
    console += [f"  {t[0]:<{w}}  {t[2]}  -> {t[3]}" for t in tg]

    md: list[str] = ["# Benchmarks", ""]
    md.append(
        "Generated by `make bench` (bench/run.sh -> bench/report.py); the hand-written analysis at the end comes"
        " from bench/analysis.md. Every figure below is from the one run described here, on one machine, with"
        " the peers and agentpost side by side."
    )
    md += ["", "## The run", ""]
    md.append(
        f"- Command: `{meta.get('command', 'make bench')}` (at commit {meta.get('commit') or _git_head()})"
    )
    if meta:
        md.append(f"- Started {meta.get('started', '?')}, wall time {meta.get('wall_s', 0):.0f} s")
        loads = meta.get("loads", [])
        if loads:
            md.append(
                "- Load average (1 min) sampled during the run: "
                + ", ".join(f"{s['step']} {s['load1']:.2f}" for s in loads)
                + " — other work on this machine competes above ~2 on 2 cores."
            )
    md += ["", "| machine | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in machine().items()]

    md += ["", "## Targets", ""]
    md.append(_md_table(["figure", "target", "measured", "verdict"], [list(t) for t in tg]))

    if peers:
        a = peers["meta"]["args"]
        md += ["", "## Throughput and safety, side by side", ""]
        md.append(
            f"End to end (first enqueue to last ack), 1 producer process + 1 consumer (base) or 2/4 consumers"
            f" (c2/c4), {a['agents']} agents, {a['payload']}-byte messages; base N={a['n']:,}, c2/c4/crash"
            f" N={a['variant_n']:,}; medians of {a['runs']} runs (crash: {a['crash_runs']} run with {a['kills']}"
            " SIGKILLs of consumer processes). lost/dup/recovered are summed over a row's runs."
        )
        md.append("")
        body = []
        for r in peers["rows"]:
            body.append(
                [
                    r["system"],
                    r["variant"],
                    f"{r['n']:,}",
                    _fmt(r["median"]) if not r["errors"] else "ERROR",
                    _fmt(r["min"]),
                    _fmt(r["max"]),
                    _fmt(r["enqueue_median"]),
                    str(r["lost"]),
                    str(r["duplicated"]),
                    str(r["recovered"]),
                    str(r["dup_unexplained"]),
                    str(r["kills"]),
                    f"{r['max_load1']:.1f}",
                ]
            )
        head = [
            "system",
            "variant",
            "N",
            "msgs/s median",
            "min",
            "max",
            "enq/s",
            "lost",
            "dup",
            "recov",
            "dup-other",
            "kills",
            "load",
        ]
        md.append(_md_table(head, body, lambda i: i >= 2))
        md += [
            "",
            "enq/s: the producer alone, first to last enqueue. recov: redelivered after its consumer was"
            " SIGKILLed (at-least-once, expected); dup-other: delivered twice to processes never killed.",
        ]
        notes = sorted({(r["system"], r["note"]) for r in peers["rows"] if r.get("note")})
        if notes:
            md += [""] + [f"- {s}: {n}" for s, n in notes]
        errors = [f"- {r['system']} {r['variant']}: {e}" for r in peers["rows"] for e in r["errors"]]
        if errors:
            md += ["", "Errors:", *errors]
    if latency:
        md += ["", "## Pickup latency and idle cost", ""]
        md.append(
            "A producer process enqueues at a steady rate; a consumer process waiting on `Waker` claims; latency is"
            " commit (returned in the producer) to claim (returned in the consumer), `time.monotonic` in both."
            " Idle: a process with a started `Waker` waiting for work, CPU time from `getrusage` over ~5 s."
        )
        md.append("")
        body = [
            [
                lat["backend"],
                f"inotify on the WAL (fallback poll {lat['wake_ms']} ms)"
                if lat["backend"] == "sqlite"
                else "LISTEN/NOTIFY",
                f"{lat['rate']:.0f}/s x {lat['n']}",
                f"{lat['p50_ms']:.2f}",
                f"{lat['p99_ms']:.2f}",
                f"{lat['max_ms']:.1f}",
                f"{lat['idle_cpu_share'] * 100:.2f}%",
            ]
            for lat in latency
        ]
        md.append(
            _md_table(
                ["backend", "wake", "load", "p50 ms", "p99 ms", "max ms", "idle CPU"], body, lambda i: i >= 3
            )
        )
    if growth:
        md += ["", "## Growth", ""]
        body = [
            [
                g["backend"],
                f"{g['n']:,}",
                f"{g['retained']:,}",
                " / ".join(_fmt(x) for x in g["empty"]),
                " / ".join(_fmt(x) for x in g["with_retained"]),
                f"{g['ratio']:.2f}",
            ]
            for g in growth
        ]
        md.append(
            "Base workload on an empty database and on one holding a million completed messages, alternating."
        )
        md.append("")
        md.append(
            _md_table(
                [
                    "backend",
                    "N",
                    "retained",
                    "empty msg/s (runs)",
                    "retained msg/s (runs)",
                    "ratio of medians",
                ],
                body,
            )
        )
    if parallel:
        md += ["", "## Agent parallelism (real processor)", ""]
        md.append(
            "`agentpost run processor` with K agents whose CLI sleeps 1 s; 5 messages per agent (`busy_policy ="
            ' "followup"`: one run each); wall time from the first enqueue to the last completion.'
        )
        md.append("")
        body = [
            [str(p["k"]), str(p["cap"]), str(p["messages"]), f"{p['wall_s']:.2f}", f"{p['ratio']:.2f}"]
            for p in parallel
        ]
        md.append(_md_table(["K", "cap", "runs", "wall s", "ratio to 5 s"], body, lambda i: i >= 2))
    analysis = HERE / "analysis.md"
    if analysis.exists():
        md += ["", analysis.read_text().strip()]
    return "\n".join(console), "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", required=True, help="folder with the JSON results")
    p.add_argument("--out", default=None, help="write the markdown here (default: print only)")
    args = p.parse_args(argv)
    console, md = render(Path(args.results))
    print(console)
    if args.out:
        Path(args.out).write_text(md)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
