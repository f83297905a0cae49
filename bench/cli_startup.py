"""Wall time of short `agentpost` commands, hyperfine-style: warm-up runs, then N timed runs of each
command in a fresh home (SQLite), with the median, p90 and the CPU time of the runs.

    .venv/bin/python bench/cli_startup.py [--runs 30] [--tree DIR]

``--tree DIR`` times another copy of the sources (for a before/after comparison, e.g. the output of
``git archive COMMIT | tar -x -C DIR``) as ``python -m shared.cli.main`` with ``DIR`` first on the path
(``python -m shared.cli`` for a tree from before the CLI moved into its own folder).

Each run is a whole new process, as a person typing the command starts it. `python -c pass` is timed
alongside: the interpreter's own start on this machine, and a yardstick for how busy the machine is.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def bench(name: str, argv: list[str], env: dict[str, str], runs: int) -> str:
    for _ in range(3):
        timed(argv, env)
    walls, cpus = zip(*(timed(argv, env) for _ in range(runs)), strict=True)
    ordered = sorted(walls)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (
        f"| {name} | {statistics.median(walls) * 1000:.0f} ms | {p90 * 1000:.0f} ms | "
        f"{min(walls) * 1000:.0f} ms | {statistics.median(cpus) * 1000:.0f} ms |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--tree", type=Path, help="time the sources in this folder instead")
    args = parser.parse_args()
    cli = [AGENTPOST]
    if args.tree:
        # The CLI moved from shared/cli.py to shared/cli/main.py; an older tree still has the first.
        module = "shared.cli.main" if (args.tree / "shared" / "cli" / "main.py").exists() else "shared.cli"
        cli = [sys.executable, "-m", module]
        os.chdir(args.tree)
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
        env.update(AGENTPOST_HOME=str(Path(tmp) / "home"), HOME=tmp, NO_COLOR="1")
        if args.tree:
            env["PYTHONPATH"] = str(args.tree.resolve())
        subprocess.run([*cli, "init"], env=env, stdout=subprocess.DEVNULL, check=True)
        print(f"{args.runs} runs each, after 3 warm-up runs; load average {os.getloadavg()[0]:.2f}")
        print("| command | median wall | p90 wall | fastest | median CPU |")
        print("| --- | --- | --- | --- | --- |")
        print(bench("`python -c pass`", [sys.executable, "-c", "pass"], env, args.runs))
        print(bench("`agentpost send hello`", [*cli, "send", "hello"], env, args.runs))
        print(bench("`agentpost queue status`", [*cli, "queue", "status"], env, args.runs))
        print(bench("`agentpost --help`", [*cli, "--help"], env, args.runs))


if __name__ == "__main__":
    main()
