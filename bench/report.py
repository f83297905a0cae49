"""Turn the JSON results of one `make bench` run into a printed table and docs/benchmarks.md.

Inputs (in --results): peers.json (run_peers.py), latency.json, growth.json, parallel.json,
claim_batch.json (claim_batch.py), enqueue_agents.json (enqueue_agents.py), instructions.json
(instructions.py), meta.json (written by
bench/run.sh: command, start/end, load samples). Everything missing is reported as missing.
The Targets table lists the acceptance figures of issue 17 ("Enqueue at the speed of SQLite"), each
judged from this one run; the other sections show the measurements behind them.
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

from measure import PEER_COLUMNS, fmt_rate, peer_cells

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


ISSUE = "issue 17: Enqueue at the speed of SQLite"


def targets(
    peers: Any, latency: Any, growth: Any, claim_batch: Any = None, enqueue_agents: Any = None
) -> list[tuple[str, str, str, str]]:
    """(what, target, measured, verdict) for every acceptance figure of issue 17, in its order."""
    out: list[tuple[str, str, str, str]] = []
    rows = peers["rows"] if peers else []

    def judge(what: str, goal: float, x: float | None, y: float | None, unit: str) -> None:
        if x is None or y is None or not y:
            out.append((what, f">= {goal:g}x", "missing", "NOT MEASURED"))
            return
        r = x / y
        verdict = "met" if r >= goal else f"NOT MET ({r / goal:.0%} of target)"
        out.append((what, f">= {goal:g}x", f"{r:.2f}x ({x:,.0f} vs {y:,.0f} {unit})", verdict))

    def ratio(what: str, a: str, b: str, goal: float) -> None:
        judge(what, goal, _rate(rows, a), _rate(rows, b), "msg/s")

    def enqueue(r: dict[str, Any] | None) -> float | None:
        return None if r is None else r["enqueue_median"]

    ratio("SQLite e2e vs plain sqlite3 per op", "agentpost-sqlite", "sqlite-per-op", 0.8)
    judge(
        "SQLite enqueue alone (producer enq/s) vs plain INSERT + event row",
        0.8,
        enqueue(_row(rows, "agentpost-sqlite")),
        enqueue(_row(rows, "sqlite-insert-event")),
        "enq/s",
    )
    ratio("SQLite e2e vs huey", "agentpost-sqlite", "huey-SqliteStorage", 2.5)
    ratio("SQLite e2e vs litequeue", "agentpost-sqlite", "litequeue", 3.0)
    cb = claim_batch or {}
    judge(
        f"SQLite drain, {cb.get('per_agent', 20)} waiting per agent, vs plain claim-all",
        0.7,
        cb.get("agentpost_median"),
        cb.get("plain_median"),
        "msg/s",
    )
    ratio("PostgreSQL vs SKIP LOCKED per message", "agentpost-pg", "pg-skip-locked", 0.9)
    ratio("PostgreSQL vs SKIP LOCKED group claim", "agentpost-pg", "pg-skip-locked-agent", 0.5)
    for backend in ("sqlite", "postgres"):
        g = next((g for g in growth or [] if g["backend"] == backend), None)
        if g is None or g["ratio"] is None:
            out.append((f"growth {backend}", ">= 0.9x", "missing", "NOT MEASURED"))
            continue
        r = g["ratio"]
        out.append(
            (
                f"growth {backend} ({g['retained']:,} completed retained)",
                ">= 0.9x",
                f"{r:.2f}x ({g['retained_median']:,.0f} vs {g['empty_median']:,.0f} msg/s)",
                "met" if r >= 0.9 and not g["problems"] else "NOT MET",
            )
        )
    ea = enqueue_agents or {}
    judge(
        f"enqueue with {ea.get('large_agents', 256)} agents vs with {ea.get('small_agents', 8)}",
        0.9,
        ea.get("large_median"),
        ea.get("small_median"),
        "enq/s",
    )
    for lat in latency or []:
        label = (
            f"pickup latency {lat['backend']} (Waker: inotify, fallback poll {lat['wake_ms']} ms)"
            if lat["backend"] == "sqlite"
            else ("pickup latency postgres (LISTEN/NOTIFY)")
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
    if not latency:
        out.append(("pickup latency", "p50 < 5 ms, p99 < 20 ms, idle < 1%", "missing", "NOT MEASURED"))
    # The kills a run asked for (20 in `make bench`, fewer in BENCH_QUICK=1): a quick run is judged on its own.
    kills = int(peers["meta"]["args"].get("kills", 20)) if peers else 20
    for system in ("agentpost-sqlite", "agentpost-pg"):
        out.append(_kill_test(rows, system, kills))
    return out


def _kill_test(rows: list[dict[str, Any]], system: str, kills: int) -> tuple[str, str, str, str]:
    """The kill test of one system: SIGKILLs of consumer processes (crash) and 2 / 4 live consumers (c2,
    c4). A duplicate counts against it only when no kill explains it (a message whose consumer was killed
    comes back: at-least-once, as designed)."""
    what, goal = f"{system} kill tests (SIGKILLs; 2 and 4 consumers)", f"{kills} kills: 0 lost, 0 duplicated"
    crash = _row(rows, system, "crash")
    if crash is None:
        return (what, goal, "missing", "NOT MEASURED")
    got = (
        f"{crash['kills']} kills: lost {crash['lost']}, dup {crash['dup_unexplained']}"
        f" (+{crash['recovered']} redelivered after a kill)"
    )
    ok = crash["lost"] == 0 and crash["dup_unexplained"] == 0 and crash["kills"] >= kills
    for variant in ("c2", "c4"):
        r = _row(rows, system, variant)
        if r is None:
            got += f"; {variant} missing"
            ok = False
        else:
            got += f"; {variant}: lost {r['lost']}, dup {r['duplicated']}"
            ok = ok and r["lost"] == 0 and r["duplicated"] == 0
    return (what, goal, got, "met" if ok else "NOT MET")


def _md_table(head: list[str], body: list[list[str]], right: Callable[[int], bool] = lambda i: False) -> str:
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" if right(i) else "---" for i in range(len(head))) + "|",
    ]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in body]
    return "\n".join(lines)


def _runs_table(head: list[str], result: dict[str, Any], rows: list[tuple[str, str]]) -> str:
    """A table of alternating runs (claim_batch.py, enqueue_agents.py): per (label, key) of ``rows`` the
    rates of ``result[key]`` and their median ``result[key + "_median"]``, then the ratio of the medians."""
    body = [
        [label, " / ".join(fmt_rate(x) for x in result[key]), fmt_rate(result[f"{key}_median"])]
        for label, key in rows
    ]
    body.append(["ratio", "", f"{result['ratio']:.2f}" if result["ratio"] is not None else "-"])
    return _md_table(head, body, lambda i: i >= 2)


def render(results: Path) -> tuple[str, str]:
    """(console text, markdown)."""
    peers = _load(results / "peers.json")
    latency = _load(results / "latency.json")
    growth = _load(results / "growth.json")
    parallel = _load(results / "parallel.json")
    claim_batch = _load(results / "claim_batch.json")
    enqueue_agents = _load(results / "enqueue_agents.json")
    instructions = _load(results / "instructions.json")
    meta = _load(results / "meta.json") or {}
    tg = targets(peers, latency, growth, claim_batch, enqueue_agents)

    console = ["", f"Targets ({ISSUE}):"]
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

    md += ["", f"## Targets ({ISSUE})", ""]
    md.append(
        "The issue is done when every row below is met in one run. Ratios are agentpost over the peer, from"
        " the sections below (e2e: first enqueue to last ack, medians)."
    )
    md.append("")
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
        head = PEER_COLUMNS
        body = [peer_cells(r, f"{r['n']:,}") for r in peers["rows"]]
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
    if claim_batch:
        cb = claim_batch
        md += ["", f"## Claim with {cb['per_agent']} messages waiting per agent", ""]
        md.append(
            f"bench/claim_batch.py, one process, SQLite: {cb['rounds']} rounds of {cb['per_agent']} messages"
            f" for each of {cb['agents']} agents ({cb['messages']:,} per run); each round is filled (untimed)"
            " and then drained (timed). agentpost drains through its public Queue API as the benchmark"
            " consumer does (agents_with_pending, claim_all_pending_messages, complete_messages with a reply,"
            " release_agent); plain claim-all is sqlite-claim-agent's SQL (one UPDATE ... RETURNING claims an"
            f" agent's rows, one UPDATE per message marks it done). Runs alternate; medians of {cb['runs']}."
        )
        md.append("")
        rows = [("agentpost", "agentpost"), ("plain sqlite3 claim-all", "plain")]
        md.append(_runs_table(["system", "msg/s drained (runs)", "median"], cb, rows))
    if enqueue_agents:
        ea = enqueue_agents
        md += ["", f"## Enqueue with {ea['large_agents']} agents", ""]
        md.append(
            f"bench/enqueue_agents.py, one process, SQLite: {ea['n']:,} `Queue.intake.enqueue_message` calls on a fresh"
            f" file with a directory of {ea['small_agents']} or {ea['large_agents']} agents, each message routed"
            " by a leading `@agent-N` mention (no `agent=`) to one of the first 8 agents. Runs alternate;"
            f" medians of {ea['runs']}."
        )
        md.append("")
        rows = [(str(ea[f"{key}_agents"]), key) for key in ("small", "large")]
        md.append(_runs_table(["agents", "enqueues/s (runs)", "median"], ea, rows))
    if instructions:
        md += ["", "## Instructions per message (callgrind)", ""]
        md.append(
            "bench/instructions.py: each workload in its own process under valgrind's callgrind, counting only"
            f" the measured part ({instructions['n']:,} messages after {instructions['warm']:,} uncounted)."
            " Unlike the rates above, the counts do not drift with the machine's load: the same code gives the"
            " same count. The kernel's work (writes, fsync, locks) is not counted. Ratio: the baseline's count"
            " over agentpost's (1.00 = as cheap, the way the rate ratios read). enqueue-sql is agentpost's two"
            " enqueue statements alone, from a bare loop: the floor its schema sets; drain-sql the same for"
            " the drain's two status changes (claim, completion); drain-sql-hot-split those two on an"
            " experimental schema with the changing state in a narrow table of its own."
        )
        md.append("")
        body = [
            [
                name,
                f"{pair['agentpost']:,.0f}",
                f"{pair['baseline']:,.0f}" if pair["baseline"] else "-",
                f"{pair['ratio']:.2f}" if pair["ratio"] else "-",
            ]
            for name, pair in instructions["pairs"].items()
        ]
        md.append(
            _md_table(
                ["workload", "agentpost instr/msg", "baseline instr/msg", "ratio"], body, lambda i: i >= 1
            )
        )
        md += [
            "",
            "Baselines: enqueue and enqueue-sql — the sqlite-insert-event peer's producer; drain, drain-sql"
            " and drain-sql-hot-split — plain claim-all as in the section above (its whole drain).",
        ]
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
                " / ".join(fmt_rate(x) for x in g["empty"]),
                " / ".join(fmt_rate(x) for x in g["with_retained"]),
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
