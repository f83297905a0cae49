"""From a Discord message to its reply, with a zero-time agent: how much of the wait is agentpost's own.

Real processes: ``agentpost run discord`` and ``agentpost run processor`` on one SQLite home, against the
Discord fake of the tests (gateway + REST, in this process). The agent is the ``command`` provider running
``cat`` (the reply is the prompt, printed at once). Messages are sent one at a time to one DM channel, each
after the previous reply arrived, so every one meets a quiet chat and an idle agent.

Per message, from timestamps on one clock (epoch ms; the fake's monotonic send times are converted once):

- ``total``: the user's message pushed to the gateway → the fake received the reply (``POST .../messages``);
- ``cli``: the processor's ``chain_step_start`` → ``chain_step_done`` events (the agent CLI's run as the
  processor sees it, spawn included);
- ``overhead`` = ``total - cli``: adapter intake, queue, claim, completion, delivery — ours;
- the stages: push → ``message_received`` (adapter) → ``chain_step_start`` (claimed, run starting);
  ``chain_step_done`` → reply at the fake.

    .venv/bin/python bench/discord_latency.py --n 40 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import tomlkit  # noqa: E402
from measure import spread  # noqa: E402

from shared.runtime import open_runtime  # noqa: E402
from tests.fakes.discord_api import FakeDiscord  # noqa: E402
from tests.probes import wait_for  # noqa: E402

ALICE, DM = 5001, 7001


def _home(root: Path) -> Path:
    home = root / "home"
    home.mkdir(parents=True)
    cat = shutil.which("cat") or "/bin/cat"
    settings = {
        "database": {"url": f"sqlite:///{root / 'agentpost.db'}"},
        "agents": {"alpha": {"provider": "command", "command": [cat]}},
        "queue": {"default_agent": "alpha"},
        "channels": {"discord": {"allowlist": [str(ALICE)], "guild_ready_timeout_seconds": 0.1}},
    }
    (home / "settings.toml").write_text(tomlkit.dumps(settings), encoding="utf-8")
    return home


def _start(kind: str, home: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    full = {**os.environ, "AGENTPOST_HOME": str(home), "AGENTPOST_LOG_LEVEL": "WARNING", **env}
    full.pop("AGENTPOST_DATABASE_URL", None)
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "shared.cli.main", "run", kind], cwd=REPO, env=full, stdout=out, stderr=out
        )


def _wait(condition: Any, timeout: float, what: str) -> Any:
    return wait_for(condition, timeout, what, interval=0.002, error=TimeoutError)


def measure(n: int, warmup: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="discord-latency-"))
    home = _home(root)
    procs: list[subprocess.Popen[bytes]] = []
    samples: list[dict[str, float]] = []
    with FakeDiscord(heartbeat_interval_ms=5_000) as fake:
        env = {
            "DISCORD_BOT_TOKEN": fake.token,
            "DISCORD_API_BASE_URL": fake.api_base,
            "DISCORD_GATEWAY_URL": fake.gateway_url,
        }
        procs.append(_start("processor", home, {}, root / "processor.log"))
        procs.append(_start("discord", home, env, root / "discord.log"))
        rt = open_runtime(home)
        try:
            _wait(lambda: fake.identifies > 0, 30, "the adapter to connect")
            offset_ms = time.time() * 1000 - time.monotonic() * 1000  # fake send times are monotonic
            for i in range(warmup + n):
                before = len([s for s in fake.sent if s.kind == "message"])
                pushed = time.time() * 1000
                sent = fake.push_message(DM, f"ping {i}", ALICE, "alice")
                reply = _wait(
                    lambda b=before: [s for s in fake.sent if s.kind == "message"][b:], 30, f"reply {i}"
                )[0]
                if i < warmup:
                    continue
                replied = reply.at * 1000 + offset_ms
                mid = _wait(
                    lambda ext=sent["id"]: rt.db.read_scalar(
                        "SELECT message_id FROM messages WHERE external_id = :e", {"e": str(ext)}
                    ),
                    5,
                    "the message row",
                )
                events = _wait(
                    lambda m=mid: (
                        {
                            r["type"]: int(r["created_at"])
                            for r in rt.db.read(
                                "SELECT type, created_at FROM events WHERE message_id = :m", {"m": m}
                            )
                        }
                        if "chain_step_done"
                        in {
                            r["type"]
                            for r in rt.db.read("SELECT type FROM events WHERE message_id = :m", {"m": m})
                        }
                        else None
                    ),
                    5,
                    "the run's events",
                )
                total = replied - pushed
                cli = events["chain_step_done"] - events["chain_step_start"]
                samples.append(
                    {
                        "total": total,
                        "cli": cli,
                        "overhead": total - cli,
                        "intake": events["message_received"] - pushed,
                        "to_run": events["chain_step_start"] - events["message_received"],
                        "to_reply": replied - events["chain_step_done"],
                    }
                )
        finally:
            rt.close()
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    shutil.rmtree(root, ignore_errors=True)
    summary: dict[str, Any] = {"n": len(samples)}
    for key in ("total", "cli", "overhead", "intake", "to_run", "to_reply"):
        summary[key] = spread([s[key] for s in samples])
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=40, help="messages measured")
    parser.add_argument("--warmup", type=int, default=3, help="messages sent first and not counted")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    summary = measure(args.n, args.warmup)
    print(f"{summary['n']} messages, milliseconds:")
    print(f"{'':10} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for key in ("total", "cli", "overhead", "intake", "to_run", "to_reply"):
        s = summary[key]
        print(f"{key:10} {s['p50']:8.1f} {s['p90']:8.1f} {s['p99']:8.1f} {s['max']:8.1f}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
