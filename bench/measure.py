"""Shared plumbing of the one-process benchmarks: runs that alternate between the things compared, in a
scratch folder; medians and ratios; progress lines on stderr; the JSON results file; the backends to
measure (PostgreSQL's bench database made for its turn); and the peers' throughput table (console and
report)."""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from harness import pg_admin

K = TypeVar("K", bound=Hashable)

#: The columns of the peers' throughput table (run_peers.py's console table, report.py's markdown one).
PEER_COLUMNS = [
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


def say(line: str) -> None:
    """A progress or summary line on stderr (stdout stays free for results)."""
    print(line, file=sys.stderr, flush=True)


def write_json(path: str | None, results: Any) -> None:
    """Write ``results`` as indented JSON to ``path`` (nothing when no path was given)."""
    if path:
        Path(path).write_text(json.dumps(results, indent=2))


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary folder for a measurement's runs, removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def alternate(
    runs: int,
    names: Sequence[K],
    one_run: Callable[[K, int], float],
    progress: Callable[[K, int, float], str],
) -> dict[K, list[float]]:
    """``runs`` rounds of one run of each of ``names`` in turn (so drift hits all alike); each run's rate,
    reported with ``progress(name, k, rate)``, by name in run order."""
    rates: dict[K, list[float]] = {name: [] for name in names}
    for k in range(runs):
        for name in names:
            rate = one_run(name, k)
            rates[name].append(rate)
            say(progress(name, k, rate))
    return rates


def medians(rates: dict[K, list[float]]) -> dict[K, float]:
    """The median of each name's rates."""
    return {name: statistics.median(values) for name, values in rates.items()}


def ratio(num: float, den: float) -> float | None:
    """``num / den``, or None when ``den`` is zero."""
    return num / den if den else None


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spread(values: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max of ``values``, rounded to a tenth."""
    return {
        "p50": round(statistics.median(values), 1),
        "p90": round(pct(values, 0.90), 1),
        "p99": round(pct(values, 0.99), 1),
        "max": round(max(values), 1),
    }


def backends(chosen: Sequence[str] | None, pg_url: str) -> Iterator[str]:
    """The backends to measure (default both), one at a time. PostgreSQL's bench database is created before
    its turn and dropped after it; PostgreSQL is skipped (said on stderr) when it cannot be created."""
    for backend in chosen or ["sqlite", "postgres"]:
        if backend == "postgres":
            try:
                pg_admin(pg_url, "create")
            except Exception as exc:
                say(f"PostgreSQL unavailable ({exc}); skipped")
                continue
        try:
            yield backend
        finally:
            if backend == "postgres":
                pg_admin(pg_url, "drop")


def fmt_rate(x: float | None) -> str:
    """A rate with thousands separators and no decimals; ``-`` when there is none."""
    return "-" if x is None else f"{x:,.0f}"


def peer_cells(r: dict[str, Any], n: str) -> list[str]:
    """One row of the peers' table (:data:`PEER_COLUMNS`) from a run_peers row; ``n`` is N as shown."""
    return [
        r["system"],
        r["variant"],
        n,
        fmt_rate(r["median"]) if not r["errors"] else "ERROR",
        fmt_rate(r["min"]),
        fmt_rate(r["max"]),
        fmt_rate(r["enqueue_median"]),
        str(r["lost"]),
        str(r["duplicated"]),
        str(r["recovered"]),
        str(r["dup_unexplained"]),
        str(r["kills"]),
        f"{r['max_load1']:.1f}",
    ]
