"""Agent parallelism through the real processor: K agents x 5 messages of a 1-second scripted agent.

For each K: a temporary AGENTPOST_HOME whose settings define K agents with provider ``command`` running a
tiny Python script (read the prompt, sleep 1 s, print a reply), ``[processor] max_concurrency`` = the cap
and ``busy_policy = "followup"`` (each message its own run, as a chat that keeps talking would be run).
``agentpost run processor`` starts as a subprocess; once its ``processor_start`` event is in the database,
5 messages per agent are enqueued and the clock runs until all 5K are completed. An agent runs one message
at a time, so the ideal is 5 s for any K up to the cap; the figure is the wall time and its ratio to 5 s.

    bench/.venv/bin/python bench/parallel.py --k 1,2,4 --cap 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shared.chat.address import ChatAddress

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import say, write_json

AGENT_SCRIPT = "import sys, time\nsys.stdin.read()\ntime.sleep(1.0)\nprint('done after one second')\n"
PER_AGENT = 5


def _settings(home: Path, k: int, cap: int, script: Path) -> str:
    agents = "".join(
        f'[agents.a{i}]\nprovider = "command"\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(script))}]\n\n'
        for i in range(k)
    )
    return (
        f'[database]\nurl = "sqlite:///{home / "agentpost.db"}"\n\n'
        '[queue]\ndefault_agent = "a0"\nlease_seconds = 30\n\n'
        f'{agents}[processor]\nmax_concurrency = {cap}\nbusy_policy = "followup"\nprogress_events = false\n'
    )


def _agentpost_bin() -> str:
    candidate = Path(sys.executable).parent / "agentpost"
    return str(candidate) if candidate.exists() else "agentpost"


def measure(k: int, cap: int, timeout: float = 120.0) -> dict[str, Any]:
    """One K: start the processor, enqueue 5K messages, time until all are completed."""
    from shared.runtime import open_runtime

    with tempfile.TemporaryDirectory(prefix="agentpost-parallel-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        script = Path(tmp) / "agent.py"
        script.write_text(AGENT_SCRIPT)
        (home / "settings.toml").write_text(_settings(home, k, cap, script))
        env = {**os.environ, "AGENTPOST_HOME": str(home), "AGENTPOST_LOG_LEVEL": "WARNING"}
        rt = open_runtime(home, env)
        log = open(Path(tmp) / "processor.log", "wb")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen(
            [_agentpost_bin(), "run", "processor"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 60
            while not rt.db.read_scalar("SELECT 1 FROM events WHERE type = 'processor_start' LIMIT 1"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"processor did not start: {(Path(tmp) / 'processor.log').read_text()}"
                    )
                time.sleep(0.02)
            total = k * PER_AGENT
            t0 = time.monotonic()
            for j in range(PER_AGENT):
                for i in range(k):
                    rt.queue.intake.enqueue_message(
                        ChatAddress("bench", "bench-user", conversation=f"c{i}"),
                        f"task {j} for a{i}",
                        agent=f"a{i}",
                    )
            done = 0
            while done < total:
                if time.monotonic() - t0 > timeout or proc.poll() is not None:
                    raise RuntimeError(
                        f"only {done}/{total} completed: {(Path(tmp) / 'processor.log').read_text()}"
                    )
                time.sleep(0.01)
                done = int(rt.db.read_scalar("SELECT COUNT(*) FROM messages WHERE status = 'completed'"))
            wall = time.monotonic() - t0
            failed = int(rt.db.read_scalar("SELECT COUNT(*) FROM messages WHERE retry_count > 0"))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            rt.close()
    return {
        "k": k,
        "cap": cap,
        "messages": total,
        "wall_s": wall,
        "ratio": wall / PER_AGENT,
        "retried": failed,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", default="1,2,4", help="comma list of agent counts (default 1,2,4)")
    p.add_argument("--cap", type=int, default=4, help="[processor] max_concurrency (default 4)")
    p.add_argument("--json", default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    results = []
    for k in (int(x) for x in args.k.split(",")):
        r = measure(k, args.cap)
        results.append(r)
        say(
            f"parallel K={k} cap={args.cap}: {r['messages']} runs of 1 s in {r['wall_s']:.2f} s,"
            f" ratio to 5 s {r['ratio']:.2f}"
        )
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
