"""Helpers for the processor tests: a home folder with settings, a processor run, scripted agent CLIs.

The scripted CLI (:data:`AGENT_SCRIPT`) is a real program run by the ``command`` provider: it reads the
prompt on stdin, appends ``start``/``end`` lines (agent, epoch seconds, pid) to an invocation log, sleeps
when the prompt asks for it, and prints a reply. The log is how tests see from outside which runs overlapped;
it is ``runs.log`` beside the script (agent CLIs get only an allowlisted environment, so no ``AGENT_LOG``
reaches them unless an agent's ``env`` table names it).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import tomlkit

from shared.runtime import Runtime
from tests.homes import build_home, open_home  # noqa: F401  (re-exported: tests import it from here)
from tests.probes import count, wait_for  # noqa: F401  (re-exported: tests import them from here)
from workers.processor import Processor, ProcessorSettings, ProcessorStats

REPO_ROOT = Path(__file__).resolve().parents[1]

#: A stand-in agent CLI for the ``command`` provider. Prompt words it understands:
#: ``sleep=SECONDS``, ``fail`` (exit 3), ``spawn`` (start a child ``sleep`` and record its pid).
AGENT_SCRIPT = r"""
import json, os, subprocess, sys, time
log = os.environ.get("AGENT_LOG") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs.log")
agent = os.environ.get("AGENTPOST_AGENT", "?")
prompt = sys.stdin.read()
def note(kind):
    with open(log, "a") as f:
        f.write(json.dumps({"kind": kind, "agent": agent, "t": time.time(), "pid": os.getpid(),
                            "prompt": prompt[:200]}) + "\n")
note("start")
if "spawn" in prompt:
    child = subprocess.Popen(["sleep", "60"])
    with open(log + ".child", "w") as f:
        f.write(str(child.pid))
for word in prompt.split():
    if word.startswith("sleep="):
        time.sleep(float(word.split("=", 1)[1]))
if "fail" in prompt.split():
    note("end")
    print("something broke", file=sys.stderr)
    sys.exit(3)
note("end")
print("done: " + " ".join(prompt.split()[:6]))
"""


def write_settings(home: Path, data: Mapping[str, Any]) -> Path:
    """Write ``settings.toml`` in ``home`` from a plain dict."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "settings.toml"
    path.write_text(tomlkit.dumps(dict(data)), encoding="utf-8")
    return path


def agent_script(tmp: Path) -> Path:
    """Write the scripted CLI into ``tmp`` and return its path."""
    path = tmp / "agent_script.py"
    path.write_text(AGENT_SCRIPT, encoding="utf-8")
    return path


def command_agent(script: Path, **extra: Any) -> dict[str, Any]:
    """Settings of an agent run by the scripted CLI."""
    return {"provider": "command", "command": [sys.executable, str(script)], **extra}


def make_home(
    tmp: Path,
    db_url: str,
    agents: Mapping[str, Mapping[str, Any]],
    *,
    teams: Mapping[str, Mapping[str, Any]] | None = None,
    queue: Mapping[str, Any] | None = None,
    processor: Mapping[str, Any] | None = None,
    channels: Mapping[str, Any] | None = None,
) -> Path:
    """A home folder whose settings use ``db_url``, the given agents, and fast test timings (3 retries)."""
    return build_home(
        tmp,
        db_url,
        agents,
        teams=teams,
        queue={"max_retries": 3, **(queue or {})},
        processor=processor,
        channels=channels,
    )


def run_idle(
    rt: Runtime,
    *,
    env: Mapping[str, str] | None = None,
    include_delayed: bool = False,
    timeout: float = 60.0,
    config: ProcessorSettings | None = None,
) -> ProcessorStats:
    """Run one processor over ``rt`` until the queue is idle; return its counters."""
    processor = Processor(rt, env=env, config=config)

    async def go() -> ProcessorStats:
        return await processor.run_until_idle(include_delayed=include_delayed, timeout=timeout)

    return anyio.run(go)


@dataclass(frozen=True)
class Invocation:
    """One run of the scripted CLI, from its log."""

    agent: str
    start: float
    end: float | None
    pid: int
    prompt: str


def read_invocations(log: Path) -> list[Invocation]:
    """Pair the ``start``/``end`` lines of the scripted CLI's log by pid."""
    import json

    starts: dict[int, dict[str, Any]] = {}
    ends: dict[int, float] = {}
    if not log.exists():
        return []
    for line in log.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if item["kind"] == "start":
            starts[item["pid"]] = item
        else:
            ends[item["pid"]] = item["t"]
    return sorted(
        (Invocation(s["agent"], s["t"], ends.get(pid), pid, s["prompt"]) for pid, s in starts.items()),
        key=lambda i: i.start,
    )


def overlapping(runs: list[Invocation]) -> list[tuple[Invocation, Invocation]]:
    """Pairs of finished runs whose [start, end] intervals overlap."""
    pairs = []
    done = [r for r in runs if r.end is not None]
    for i, a in enumerate(done):
        for b in done[i + 1 :]:
            assert a.end is not None and b.end is not None
            if a.start < b.end and b.start < a.end:
                pairs.append((a, b))
    return pairs


def event_types(rt: Runtime, message_id: str | None = None) -> list[str]:
    """The types of events recorded (for one message, or all), oldest first."""
    if message_id is None:
        rows = rt.db.read("SELECT type FROM events ORDER BY id")
    else:
        rows = rt.db.read("SELECT type FROM events WHERE message_id = :m ORDER BY id", {"m": message_id})
    return [r["type"] for r in rows]
