"""An hour of chaos, as a tool: agentpost run as a user runs it, under load and under fire, and counted from
the chats' side.

What runs (real processes, ``agentpost run KIND`` as systemd/supervisord start them): ``processor``,
``telegram`` and ``discord`` (against the tests' platform fakes, in this process), ``scheduler`` and
``web``; the agents are the real Claude Code CLI talking to a fake Anthropic API (in this process) that
answers 1% of calls with a 500, every call inside a burst window with a 529, and a share of replies with
slow streams (seconds between pieces). The home (settings, SQLite file, workspaces, the CLI's own state)
sits on a small tmpfs so the disk can be filled without touching the machine's disk.

What happens: ``--chats`` chats (half Telegram private chats, half Discord DMs) talk to ``--agents`` agents
(chat *i* always to agent *i mod M*, by a leading ``@agent``); messages arrive at ``--rate`` per second on
average, one in five as a burst of 2-3 messages to one chat. Meanwhile every process kind is SIGKILLed at
random times (about every ``--kill-every`` seconds per kind) and restarted a second later as supervisord
would; the database goes away once (PostgreSQL: the server restarted for agentpost's processes, through a
relay — ``--pg-restart real`` runs ``pg_ctlcluster restart`` of the machine's server instead; SQLite: a long
``BEGIN EXCLUSIVE`` held by another program, since a file has no server to restart); the disk fills once.
Then the sends stop and the soak waits (``--drain``) for the last answers.

What it reports (table on stdout, ``--json PATH``): messages sent, finals received, lost (no final reply,
no "could not answer" notice for a message the queue holds as failed), duplicate finals (two runs' answers
to one message), repeated chunks (one reply delivered twice) per adapter kill, out-of-order replies per
chat, latency and overhead p50/p99 (push into the platform → the final reply shown, minus the fake model's
silence and streaming for that message; the CLI's start-up is agentpost's overhead here), and every kill,
restart and fault done. Progress goes to stderr every 30 s.

    .venv/bin/python bench/soak.py [--minutes 60] [--chats 1000] [--agents 50] [--db sqlite|postgres]
        [--rate 0.35] [--kill-every 300] [--json out.json] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import httpx  # noqa: E402
import soak_tally  # noqa: E402
from soak_chaos import (  # noqa: E402
    ApiMischief,
    ChaosApi,
    Supervised,
    fill_disk,
    pg_outage,
    pg_real_restart,
    small_disk,
    sqlite_exclusive_lock,
)

from shared.runtime import Runtime, open_runtime  # noqa: E402
from tests.crash_support import label  # noqa: E402
from tests.fakes.claude_env import claude_binary, claude_env  # noqa: E402
from tests.fakes.discord_api import FakeDiscord  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram  # noqa: E402
from tests.homes import build_home  # noqa: E402
from tests.probes import free_port  # noqa: E402

KINDS = ("processor", "telegram", "discord", "scheduler", "web")
TG_CHAT_BASE = 10_000_000  # Telegram private chat (and user) id of chat i
DC_USER_BASE = 20_000_000  # Discord user id of chat i
DC_CHANNEL_BASE = 30_000_000  # Discord DM channel id of chat i


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def quietly(close: Callable[[], object]) -> None:
    """Close a fake at the end; one that does not stop in time must not cost the report."""
    try:
        close()
    except Exception as error:
        say(f"soak: closing a fake: {error!r}")


def platform_of(chat: int) -> str:
    return "telegram" if chat % 2 == 0 else "discord"


@dataclass
class Faults:
    """What the chaos did, in order, with times relative to the start of the load."""

    log: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, t0: float, what: str, detail: str) -> None:
        with self.lock:
            self.log.append({"at_s": round(time.monotonic() - t0, 1), "what": what, "detail": detail})
        say(f"  [{time.monotonic() - t0:6.0f} s] {what}: {detail}")


class Soak:
    """One soak run; :meth:`run` returns the report (a JSON-able dict)."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.rng = random.Random(args.seed)
        self.sent: list[soak_tally.Sent] = []
        self.sent_lock = threading.Lock()
        self.counters = [0] * args.chats
        self.faults = Faults()
        self.procs: dict[str, Supervised] = {}
        self.stop = threading.Event()
        self.t0 = 0.0
        self.discord_gate = threading.Lock()  # held while a new Discord DM is taken in (see _send)
        self.discord_known: set[int] = set()
        self.web_down: list[float] = []
        self.web_probes = 0

    # -- setup ---------------------------------------------------------------------------------------------

    def home(self, root: Path, db_url: str | None) -> Path:
        agents = {f"a{n:02d}": {"provider": "claude"} for n in range(self.args.agents)}
        tg = [str(TG_CHAT_BASE + i) for i in range(0, self.args.chats, 2)]
        dc = [str(DC_USER_BASE + i) for i in range(1, self.args.chats, 2)]
        queue = {"lease_seconds": self.args.lease} if self.args.lease else {}
        return build_home(
            root,
            db_url,
            agents,
            queue=queue,
            channels={
                "telegram": {"allowlist": tg, "poll_timeout_seconds": 10},
                "discord": {"allowlist": dc, "guild_ready_timeout_seconds": 0.1},
            },
            fast=False,
        )

    # -- the load ------------------------------------------------------------------------------------------

    def _discord_ready(self, fake: FakeDiscord) -> bool:
        proc = self.procs["discord"]
        return proc.alive() and fake.identifies > len(proc.kills)

    def _send(self, chat: int, tg: FakeTelegram, dc: FakeDiscord, rt: Runtime) -> None:
        self.counters[chat] += 1
        lbl = label(chat, self.counters[chat])
        text = f"@a{chat % self.args.agents:02d} {lbl} please answer"
        if platform_of(chat) == "telegram":
            with self.sent_lock:
                self.sent.append(soak_tally.Sent(lbl, chat, time.monotonic()))
            tg.push_text(TG_CHAT_BASE + chat, text, username=f"u{chat}", first_name=f"U{chat}")
            return
        if chat in self.discord_known:
            with self.sent_lock:
                self.sent.append(soak_tally.Sent(lbl, chat, time.monotonic()))
            dc.push_message(DC_CHANNEL_BASE + chat, text, DC_USER_BASE + chat, f"u{chat}")
            return
        # Discord gives a bot no list of its DM channels, so a first DM sent while the adapter is down is
        # never seen (docs/restarts.md, "Not covered"): a new chat's first message goes in only while the
        # adapter is connected, and no kill lands until it is queued.
        with self.discord_gate:
            deadline = time.monotonic() + 60
            while not self._discord_ready(dc) and time.monotonic() < deadline:
                time.sleep(0.2)
            with self.sent_lock:
                self.sent.append(soak_tally.Sent(lbl, chat, time.monotonic()))
            dc.push_message(DC_CHANNEL_BASE + chat, text, DC_USER_BASE + chat, f"u{chat}")
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    pattern = {"p": f"%{lbl} %"}
                    if rt.db.read_scalar("SELECT COUNT(*) FROM messages WHERE message LIKE :p", pattern):
                        break
                time.sleep(0.2)
        self.discord_known.add(chat)

    def drive(self, tg: FakeTelegram, dc: FakeDiscord, rt: Runtime, until: float) -> None:
        """Send messages until ``until``: events at ``rate / 1.3`` per second, one in five a burst."""
        rng = random.Random(self.args.seed + 1)
        event_rate = self.args.rate / 1.3
        while not self.stop.is_set():
            wait = rng.expovariate(event_rate)
            if time.monotonic() + wait >= until or self.stop.wait(wait):
                return
            chat = rng.randrange(self.args.chats)
            burst = rng.choice((2, 3)) if rng.random() < 0.2 else 1
            for n in range(burst):
                if n:
                    time.sleep(rng.uniform(0.3, 1.5))
                self._send(chat, tg, dc, rt)

    # -- the chaos -----------------------------------------------------------------------------------------

    def plan(self, window: float) -> list[tuple[float, str]]:
        """Kill times per kind (uniform in the window's 5-90%), one database outage, one full disk."""
        rng = random.Random(self.args.seed + 2)
        events: list[tuple[float, str]] = []
        per_kind = max(1, round(window / self.args.kill_every))
        for kind in KINDS:
            events += [(rng.uniform(0.05, 0.9) * window, f"kill:{kind}") for _ in range(per_kind)]
        events.append((rng.uniform(0.3, 0.45) * window, "db"))
        events.append((rng.uniform(0.55, 0.7) * window, "disk"))
        return sorted(events)

    def chaos(self, plan: list[tuple[float, str]], rt: Runtime, ctx: dict[str, Any]) -> None:
        for at, action in plan:
            if self.stop.wait(max(0.0, self.t0 + at - time.monotonic())):
                return
            if action.startswith("kill:"):
                kind = action.split(":", 1)[1]
                gate = self.discord_gate if kind == "discord" else contextlib.nullcontext()
                with gate:
                    pid = self.procs[kind].kill9()
                self.faults.add(self.t0, f"kill -9 {kind}", f"pid {pid}, restarted after 1 s")
            elif action == "db":
                threading.Thread(
                    target=self._guard, args=("database outage", ctx["db_fault"]), daemon=True
                ).start()
            elif action == "disk":
                threading.Thread(
                    target=self._guard, args=("disk full", ctx["disk_fault"]), daemon=True
                ).start()

    def _guard(self, what: str, fault: Callable[[], str]) -> None:
        self.faults.add(self.t0, what, "begins")
        try:
            detail = fault()
        except Exception as error:  # the report says what went wrong; the soak goes on
            detail = f"could not be done: {error!r}"
        self.faults.add(self.t0, what, detail)

    def keep_alive(self, web_port: int) -> None:
        """supervisord's part (restart whatever ended by itself) and a probe of the web API every 2 s."""
        while not self.stop.wait(1.0):
            for proc in self.procs.values():
                proc.watch()
            if int(time.monotonic()) % 2 == 0:
                self.web_probes += 1
                try:
                    ok = httpx.get(f"http://127.0.0.1:{web_port}/healthz", timeout=2).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if not ok:
                    self.web_down.append(time.monotonic() - self.t0)

    # -- observation ---------------------------------------------------------------------------------------

    def seen(self, tg: FakeTelegram, dc: FakeDiscord) -> list[soak_tally.Seen]:
        out: list[soak_tally.Seen] = []
        for call in tg.sent:
            if call.method not in ("sendMessage", "editMessageText") or not isinstance(call.chat_id, int):
                continue
            edit = call.method == "editMessageText"
            key = str(call.params.get("message_id")) if edit else str((call.result or {}).get("message_id"))
            out.append(
                soak_tally.Seen(call.chat_id - TG_CHAT_BASE, f"tg:{key}", call.text or "", call.at, edit)
            )
        for item in dc.sent:
            if item.kind in ("message", "edit"):
                chat = item.channel_id - DC_CHANNEL_BASE
                out.append(
                    soak_tally.Seen(
                        chat, f"dc:{item.message_id}", item.content or "", item.at, item.kind == "edit"
                    )
                )
        return out

    def progress(self, tg: FakeTelegram, dc: FakeDiscord, api: ChaosApi) -> str:
        with self.sent_lock:
            sent = list(self.sent)
        tally = soak_tally.count(sent, self.seen(tg, dc), api.calls(), set())
        kills = " ".join(f"{k[:4]}:{len(p.kills)}" for k, p in self.procs.items())
        load = os.getloadavg()[0]
        return (
            f"[{time.monotonic() - self.t0:6.0f} s] sent {tally.sent}, answered {tally.answered}, "
            f"waiting {len(tally.lost)}, duplicate finals {len(tally.duplicate_finals)}, "
            f"API calls {len(api.calls())}; kills {kills}; load {load:.1f}"
        )

    # -- the run -------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        args = self.args
        disk = self.workdir / "disk"
        with contextlib.ExitStack() as stack:
            disk_problem = stack.enter_context(small_disk(disk, args.disk_size))
            root = disk if disk_problem is None else self.workdir / "home-root"
            root.mkdir(exist_ok=True)
            direct_url, relay = None, None
            if args.db == "postgres":
                from tests.fault_support import fresh_pg_database
                from tests.integration.test_storage_faults import Relay

                direct_url = stack.enter_context(fresh_pg_database())
                relay = Relay(("127.0.0.1", 5432))
                relay.open()
                stack.callback(relay.close)
                db_url = f"postgresql://postgres@127.0.0.1:{relay.port}/{direct_url.rpartition('/')[2]}"
                if args.pg_restart == "real":
                    db_url = direct_url
            else:
                db_url = None
            home = self.home(root, db_url)
            user_home = root / "user-home"
            user_home.mkdir(exist_ok=True)
            mischief = ApiMischief(error_rate=args.error_rate, slow_rate=args.slow_rate)
            api = stack.enter_context(ChaosApi(mischief, args.seed))
            tg = FakeTelegram().start()
            stack.callback(quietly, tg.close)
            dc = FakeDiscord(heartbeat_interval_ms=5_000).start()
            stack.callback(quietly, dc.close)
            for i in range(1, args.chats, 2):
                dc.add_user(DC_USER_BASE + i, f"u{i}")
            web_port = free_port()
            env = claude_env(api.base_url, user_home)
            env["PATH"] = os.environ.get("PATH", env["PATH"])
            env.update(
                {
                    "AGENTPOST_HOME": str(home),
                    "AGENTPOST_CLAUDE_BIN": str(claude_binary()),
                    "AGENTPOST_LOG_LEVEL": "INFO",
                    "AGENTPOST_API_PORT": str(web_port),
                    "PYTHONUNBUFFERED": "1",
                    "PTB_TIMEDELTA": "1",
                    "TELEGRAM_BOT_TOKEN": tg.token,
                    "TELEGRAM_API_BASE_URL": tg.url,
                    "DISCORD_BOT_TOKEN": dc.token,
                    "DISCORD_API_BASE_URL": dc.api_base,
                    "DISCORD_GATEWAY_URL": dc.gateway_url,
                }
            )
            rt_env = {"PATH": env["PATH"], **({"AGENTPOST_DATABASE_URL": direct_url} if direct_url else {})}
            rt = open_runtime(home, env=rt_env)
            stack.callback(rt.close)
            logs = self.workdir / "logs"
            logs.mkdir(exist_ok=True)
            for kind in KINDS:
                self.procs[kind] = Supervised(kind, env, logs / f"{kind}.log")
            stack.callback(lambda: [p.stop() for p in self.procs.values()])
            started = time.monotonic()
            while not (dc.identifies > 0 and any(c.method == "getUpdates" for c in tg.calls)):
                if time.monotonic() - started > 120:
                    raise SystemExit(f"the adapters did not connect within 120 s; logs in {logs}")
                time.sleep(0.5)
            say(
                f"soak: {args.chats} chats, {args.agents} agents, {args.db}, {args.minutes:g} min; logs in {logs}"
            )
            if disk_problem:
                say(f"soak: no disk-full fault: cannot mount a tmpfs ({disk_problem})")
            window = args.minutes * 60
            self.t0 = time.monotonic()
            bursts = max(1, round(window / 600))
            for n in range(bursts):
                start = self.t0 + (n + 0.5) * window / bursts
                mischief.bursts.append((start, start + args.burst_seconds))
            db_path = home / "agentpost.db"

            def db_fault() -> str:
                if args.db == "sqlite":
                    return sqlite_exclusive_lock(db_path, args.db_down_seconds)
                if args.pg_restart == "real":
                    return pg_real_restart()
                assert relay is not None and direct_url is not None
                return pg_outage(relay, direct_url, args.db_down_seconds)

            def disk_fault() -> str:
                if disk_problem:
                    return f"skipped: no tmpfs ({disk_problem})"
                return fill_disk(disk, args.disk_full_seconds)

            plan = self.plan(window)
            threads = [
                threading.Thread(target=self.drive, args=(tg, dc, rt, self.t0 + window), daemon=True),
                threading.Thread(
                    target=self.chaos,
                    args=(plan, rt, {"db_fault": db_fault, "disk_fault": disk_fault}),
                    daemon=True,
                ),
                threading.Thread(target=self.keep_alive, args=(web_port,), daemon=True),
            ]
            for thread in threads:
                thread.start()
            for start, end in mischief.bursts:
                self.faults.log.append(
                    {
                        "at_s": round(start - self.t0, 1),
                        "what": "API 529 burst",
                        "detail": f"{end - start:g} s",
                    }
                )
            next_line = time.monotonic() + 30
            while time.monotonic() < self.t0 + window:
                time.sleep(1)
                if time.monotonic() >= next_line:
                    say(self.progress(tg, dc, api))
                    next_line += 30
            threads[0].join(120)
            threads[1].join(300)  # a fault still going on finishes first
            say(f"soak: sends stopped; waiting up to {args.drain:g} s for the last answers")
            drain_end = time.monotonic() + args.drain
            while time.monotonic() < drain_end:
                with self.sent_lock:
                    sent = list(self.sent)
                pending = soak_tally.count(sent, self.seen(tg, dc), api.calls(), self._dead(rt)).lost
                if not pending:
                    break
                time.sleep(2)
                if time.monotonic() >= next_line:
                    say(self.progress(tg, dc, api) + " (draining)")
                    next_line += 30
            self.stop.set()
            threads[2].join(10)
            report = self.report(tg, dc, api, rt, window, time.monotonic() - self.t0)
            if args.keep:  # the home's tmpfs goes away with the run: keep its database beside the logs
                for path in home.glob("agentpost.db*"):
                    shutil.copy(path, self.workdir / path.name)
            return report
        raise AssertionError("unreachable")

    def _dead(self, rt: Runtime) -> set[str]:
        try:
            rows = rt.db.read("SELECT message FROM messages WHERE status = 'dead'")
        except Exception:
            return set()
        from tests.crash_support import labels_in

        return {lbl for r in rows for lbl in labels_in(str(r["message"]))}

    def _db_state(self, rt: Runtime, labels: list[str]) -> dict[str, Any]:
        """Where the queue has each of ``labels`` (for the report's list of lost messages)."""
        out: dict[str, Any] = {}
        for lbl in labels[:50]:
            rows = rt.db.read(
                "SELECT message_id, status, retry_count, last_error FROM messages WHERE message LIKE :p",
                {"p": f"%{lbl} %"},
            )
            out[lbl] = [dict(r) for r in rows] or "never queued"
        return out

    def report(
        self, tg: FakeTelegram, dc: FakeDiscord, api: ChaosApi, rt: Runtime, window: float, took: float
    ) -> dict[str, Any]:
        args = self.args
        tally = soak_tally.count(self.sent, self.seen(tg, dc), api.calls(), self._dead(rt))
        kills = {kind: proc.kills for kind, proc in self.procs.items()}
        relative = {k: [t for t in v] for k, v in kills.items()}
        calls = api.calls()
        by_status: dict[str, int] = {}
        for call in calls:
            by_status[str(call.status)] = by_status.get(str(call.status), 0) + 1
        return {
            "command": " ".join(["bench/soak.py", *sys.argv[1:]]),
            "settings": {k: v for k, v in vars(args).items() if k not in ("json", "workdir", "keep")},
            "load_seconds": round(window),
            "total_seconds": round(took),
            "messages_sent": tally.sent,
            "answered": tally.answered,
            "finals_received": tally.finals_received,
            "told_could_not_answer": len(tally.told),
            "told_messages": self._db_state(rt, tally.told),
            "lost": len(tally.lost),
            "lost_messages": self._db_state(rt, tally.lost),
            "duplicate_finals": len(tally.duplicate_finals),
            "duplicate_final_messages": tally.duplicate_finals[:50],
            "repeated_chunks": soak_tally.repeats_per_kill(tally.repeated_chunks, relative, platform_of),
            "out_of_order": {"chats": tally.out_of_order_chats, "pairs": tally.out_of_order_pairs},
            "latency_ms": soak_tally.summary(tally.latency_ms),
            "overhead_ms": soak_tally.summary(tally.overhead_ms),
            "api_calls": {"total": len(calls), "by_status": by_status},
            "kills": {kind: len(v) for kind, v in kills.items()},
            "unplanned_exits": {k: p.unplanned_exits for k, p in self.procs.items() if p.unplanned_exits},
            "faults": sorted(self.faults.log, key=lambda f: float(f["at_s"])),
            "web_probes": {"total": self.web_probes, "failed": len(self.web_down)},
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }


def table(report: dict[str, Any]) -> str:
    """The report as a two-column text table."""
    rc = report["repeated_chunks"]
    rows = [
        ("messages sent", report["messages_sent"]),
        ("answered (a final reply shown)", report["answered"]),
        ("finals received", report["finals_received"]),
        ("told 'could not answer' (failed for good)", report["told_could_not_answer"]),
        ("lost", report["lost"]),
        ("duplicate finals", report["duplicate_finals"]),
        *(
            (
                f"repeated chunks, {k} ({v['kills']} kills)",
                f"{v['repeated_chunks']} (per kill {v['per_kill']})",
            )
            for k, v in rc.items()
        ),
        (
            "out-of-order replies (chats / pairs)",
            f"{report['out_of_order']['chats']} / {report['out_of_order']['pairs']}",
        ),
        ("latency p50 / p99 ms", f"{report['latency_ms']['p50']} / {report['latency_ms']['p99']}"),
        ("overhead p50 / p99 ms", f"{report['overhead_ms']['p50']} / {report['overhead_ms']['p99']}"),
        ("API calls by status", report["api_calls"]["by_status"]),
        ("kills (kill -9, restarted)", report["kills"]),
        ("exits nobody caused (restarted)", report["unplanned_exits"] or "none"),
        ("web health probes failed", f"{report['web_probes']['failed']} of {report['web_probes']['total']}"),
    ]
    width = max(len(str(k)) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("faults:")
    lines += [
        f"  {f['at_s']:>7} s  {f['what']}: {f['detail']}" for f in report["faults"] if "kill" not in f["what"]
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=60.0, help="how long messages are sent (default 60)")
    p.add_argument("--chats", type=int, default=1000)
    p.add_argument("--agents", type=int, default=50)
    p.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument("--rate", type=float, default=0.35, help="messages per second on average (default 0.35)")
    p.add_argument(
        "--kill-every", type=float, default=300.0, help="seconds between kills of one kind, on average"
    )
    p.add_argument("--error-rate", type=float, default=0.01, help="share of API calls answered 500")
    p.add_argument("--slow-rate", type=float, default=0.05, help="share of replies streamed over 6-15 s")
    p.add_argument(
        "--burst-seconds", type=float, default=20.0, help="length of each 529 burst (one per 10 min)"
    )
    p.add_argument("--db-down-seconds", type=float, default=15.0)
    p.add_argument("--disk-full-seconds", type=float, default=20.0)
    p.add_argument("--disk-size", default="512m", help="the home's tmpfs")
    p.add_argument("--pg-restart", choices=("relay", "real"), default="relay")
    p.add_argument("--lease", type=float, default=0.0, help="[queue] lease_seconds (default: the setting's)")
    p.add_argument("--drain", type=float, default=300.0, help="seconds to wait for the last answers")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the report here as JSON")
    p.add_argument("--workdir", help="run folder, reachable by other users (default: a new one under /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the run folder (logs) afterwards")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # SIGTERM (kill, nohup's end) unwinds like Ctrl-C: the processes stopped, the tmpfs and database removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="agentpost-soak-"))
    # As root the agents run as a sandbox user who must walk to their workspace and CLI home by path. The
    # sandbox rebuilds /tmp, /var/tmp and /run with open folders; elsewhere a closed one on the way (/root is
    # 0700) lets first runs answer but no conversation be continued.
    path = Path(workdir).resolve()
    rebuilt = any(Path(top) in path.parents for top in ("/tmp", "/var/tmp", "/run"))
    closed = [p for p in path.parents if p.exists() and not os.stat(p).st_mode & 0o001]
    if closed and not rebuilt:
        raise SystemExit(f"soak: the run folder must be reachable by other users; {closed[0]} is not")
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        report = Soak(args, workdir).run()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["lost"] == 0 and report["duplicate_finals"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
