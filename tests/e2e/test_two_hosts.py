"""Two hosts over a real network (issue 30): agentpost on PostgreSQL with a processor and a Telegram adapter on
each of two hosts, and the network, a host or the database server failing under them.

Each host is a network namespace joined to this machine by a veth pair (tests/netns.py), with a host name of
its own (``hosta``, ``hostb``: the host part of its processes' worker ids). Inside it run the real
``agentpost run processor`` (the real Claude Code CLI against a fake Anthropic API whose replies stream for
a while and name the messages they answer) and ``agentpost run telegram`` (python-telegram-bot against one
fake Bot API, the same bot for both hosts). A host reaches only its own end of its link, where PostgreSQL
listens for the test and the fakes are served. The agents' workspaces are on storage both hosts see
(``workspace_shared``, docs/restarts.md), as is the CLI's conversation store, so either host can run any agent.

Chat users write to three agents in six chats through the fake Bot API. Scenarios:

(a) host A's link goes down while A runs an agent (its CLI child exists) and comes back after twice the lease:
    host B takes A's agents over within one lease; A's stale run is fenced (it records its lost lease and
    nothing of it reaches the chat: no second final, no second chunk); A rejoins and runs new work.
(b) host A is killed outright (``kill -9`` of its processor and adapter) while it runs an agent.
(c) the PostgreSQL server restarts (``pg_ctlcluster … restart``) while both hosts work.

Counted as the fake platform received them, per scenario, and printed (``-s``): messages, lost (no final
reply in the chat), duplicated (a message answered by more than one final), out of order (a final that
reached a chat after the final of a later message of that chat). Wanted: 0 lost, 0 duplicate finals.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shared.storage.db import Database
from shared.storage.schema import open_database
from tests.crash_support import LabelledApi, cli_pids, label, labels_in
from tests.fakes.claude_env import claude_binary, claude_env
from tests.fakes.telegram_api import FakeTelegram
from tests.fault_support import fresh_pg_database
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.homes import build_home
from tests.netns import Host, PgListen, TwoHosts, exclusive, restart_postgres, unavailable
from tests.probes import service_unavailable, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(300), pytest.mark.serial]

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENTS = ("alpha", "beta", "gamma")
CHATS = 6
#: Short leases so the scenarios take seconds: a takeover waits for one. Longer than the 5 s after which the
#: server ends a transaction a cut-off host left open (shared/storage/dialect.py), which holds the other
#: host back meanwhile (its row locks; events readable only below it).
LEASE = 6.0
RECOVER = 0.5
#: How long the fake API streams one reply: long enough to cut or kill a host in the middle of it.
STREAM = 2.5
SETTLE = 120.0
#: A chat's claude CLI is kept between messages (warm sessions, on by default) this long: the scenarios run
#: kept processes on both hosts, and settled() (no CLI left) follows the last reply within seconds.
KEPT_SECONDS = 3.0
CHANNELS = {
    "telegram": {
        "allowlist": [str(7000 + c) for c in range(CHATS)],
        "poll_timeout_seconds": 1,
        "typing_interval_seconds": 1,
    }
}


@pytest.fixture(scope="module")
def network() -> Iterator[TwoHosts]:
    """The two hosts, and the PostgreSQL server listening on their links, for the whole module."""
    reason = unavailable()
    if reason:
        service_unavailable("network namespaces", reason)
    with exclusive(), TwoHosts() as net, PgListen([h.outside for h in net.hosts]):
        yield net


class Site:
    """One host's processes: a processor and a Telegram adapter, each run inside the host."""

    def __init__(self, net: TwoHosts, host: Host, env: dict[str, str], logs: Path) -> None:
        self.net, self.host, self.env, self.logs = net, host, env, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        for kind in ("processor", "telegram"):
            with (self.logs / f"{self.host.name}-{kind}.log").open("ab") as out:
                self.procs[kind] = subprocess.Popen(
                    self.net.command(self.host, [sys.executable, "-m", "shared.cli.main", "run", kind]),
                    cwd=REPO_ROOT,
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )

    @property
    def processor(self) -> subprocess.Popen[bytes]:
        return self.procs["processor"]

    def clis(self) -> list[int]:
        """The claude CLIs running under this host's processor."""
        return cli_pids(self.processor.pid) if self.processor.poll() is None else []

    def kill9(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def output(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-4000:]
            for p in sorted(self.logs.glob(f"{self.host.name}-*.log"))
        )


@dataclass
class Counts:
    """What the chats received, per message (see the module docstring)."""

    messages: int
    completed: int
    dead: int
    lost: int
    duplicated: int
    out_of_order: int
    finals: int
    details: dict[str, list[str]] = field(default_factory=dict)

    def line(self) -> str:
        return (
            f"messages={self.messages} completed={self.completed} dead={self.dead} lost={self.lost} "
            f"duplicate_finals={self.duplicated} out_of_order={self.out_of_order} final_replies={self.finals}"
        )


@dataclass
class World:
    """One scenario's database, fakes and hosts."""

    net: TwoHosts
    url: str
    db: Database
    fake: FakeTelegram
    apis: list[LabelledApi]
    sites: dict[str, Site]
    sent: dict[str, int] = field(default_factory=dict)  # label → chat
    waves: int = 0

    def wave(self) -> None:
        """Every chat user writes one more message."""
        for chat in range(CHATS):
            self.send(chat, self.waves)
        self.waves += 1

    def idle(self) -> bool:
        """Every message sent is queued, and none waits or runs."""
        rows = self.rows()
        return set(self.sent) <= set(rows) and all(
            r["status"] in ("completed", "dead") for r in rows.values()
        )

    def reconnect(self) -> None:
        """A new connection for the test's own reads (after the server restarted under it)."""
        self.db.close()
        self.db = open_database(self.url)

    def send(self, chat: int, number: int) -> str:
        """A chat user writes message ``number`` of chat ``chat`` (to the chat's agent)."""
        lbl = label(chat, number)
        self.fake.push_text(7000 + chat, f"@{AGENTS[chat % len(AGENTS)]} {lbl} please answer")
        self.sent[lbl] = chat
        return lbl

    def rows(self) -> dict[str, dict[str, Any]]:
        """Every queued message by its label."""
        found: dict[str, dict[str, Any]] = {}
        for row in self.db.read(
            "SELECT message_id, message, status, claimed_by, run_started_at, last_error, retry_count FROM messages"
        ):
            for lbl in labels_in(str(row["message"])):
                found[lbl] = dict(row)
        return found

    def held_by(self, host: str) -> dict[str, dict[str, Any]]:
        """Messages whose run has started under ``host``'s processor and is going on."""
        return {
            lbl: r
            for lbl, r in self.rows().items()
            if r["status"] == "processing"
            and str(r["claimed_by"] or "").startswith(f"{host}:")
            and r["run_started_at"]
        }

    def events(self, type_: str) -> list[tuple[int, dict[str, Any]]]:
        rows = self.db.read(
            "SELECT created_at, payload FROM events WHERE type = :t ORDER BY id", {"t": type_}
        )
        return [(int(r["created_at"]), json.loads(r["payload"])) for r in rows]

    def settled(self) -> bool:
        """Every message sent is queued and finished, every reply delivered, no CLI running."""
        rows = self.rows()
        if set(rows) != set(self.sent) or any(
            r["status"] not in ("completed", "dead") for r in rows.values()
        ):
            return False
        open_replies = self.db.read_scalar(
            "SELECT COUNT(*) FROM responses WHERE status IN ('pending', 'delivering')"
        )
        return not open_replies and not any(site.clis() for site in self.sites.values())

    def counts(self) -> Counts:
        """Count from what the fake Bot API received (see the module docstring)."""
        last_text: dict[tuple[int, int], str] = {}
        became_final: dict[tuple[int, int], int] = {}
        for index, call in enumerate(self.fake.calls):
            if not call.ok or call.method not in ("sendMessage", "editMessageText"):
                continue
            if not isinstance(call.result, dict):
                continue
            key = (int(call.result["chat"]["id"]), int(call.result["message_id"]))
            text = call.text or ""
            last_text[key] = text
            if "(end)" in text:
                became_final.setdefault(key, index)
        finals = {k: labels_in(t) for k, t in last_text.items() if "(end)" in t}
        per_label = {lbl: 0 for lbl in self.sent}
        for labels in finals.values():
            for lbl in labels:
                if lbl in per_label:
                    per_label[lbl] += 1
        out_of_order: list[str] = []
        for chat in range(CHATS):
            mine = sorted((k for k in finals if k[0] == 7000 + chat), key=became_final.__getitem__)
            highest = -1
            for key in mine:
                for lbl in finals[key]:
                    number = int(lbl.rsplit("-m", 1)[1])
                    if number < highest:
                        out_of_order.append(lbl)
                    highest = max(highest, number)
        rows = self.rows()
        status = {lbl: str(r["status"]) for lbl, r in rows.items()}
        dead = [f"{lbl}: {r['last_error']}" for lbl, r in sorted(rows.items()) if r["status"] == "dead"]
        lost = sorted(lbl for lbl, n in per_label.items() if n == 0)
        dupes = sorted(lbl for lbl, n in per_label.items() if n > 1)
        return Counts(
            messages=len(self.sent),
            completed=sum(1 for s in status.values() if s == "completed"),
            dead=sum(1 for s in status.values() if s == "dead"),
            lost=len(lost),
            duplicated=len(dupes),
            out_of_order=len(out_of_order),
            finals=len(finals),
            details={"lost": lost, "duplicated": dupes, "out_of_order": out_of_order, "dead": dead},
        )


@contextlib.contextmanager
def world(net: TwoHosts, tmp: Path, pins: dict[str, list[str]] | None = None) -> Iterator[World]:
    """A fresh database, the fakes served on each host's link, and each host's home and processes (with
    ``[processor] agents`` from ``pins`` by host name: all agents where none is given)."""
    with fresh_pg_database() as url, FakeTelegram() as fake, contextlib.ExitStack() as stack:
        name = url.rpartition("/")[2]
        workspaces, user_home = tmp / "workspaces", tmp / "user-home"  # on storage both hosts see
        user_home.mkdir()
        sites: dict[str, Site] = {}
        apis: list[LabelledApi] = []
        for host in net.hosts:
            api = stack.enter_context(LabelledApi(STREAM, host=host.outside))
            apis.append(api)
            home = build_home(
                tmp,
                f"postgresql://postgres@{host.outside}:5432/{name}",
                {a: {"provider": "claude", "workspace_shared": True} for a in AGENTS},
                queue={"lease_seconds": LEASE, "poll_interval_seconds": 1.0},
                processor={
                    "recover_interval_seconds": RECOVER,
                    "agents": (pins or {}).get(host.name, []),
                    # Warm sessions as by default, kept briefly: settled() waits for every CLI to exit.
                    "session_idle_seconds": KEPT_SECONDS,
                },
                channels=CHANNELS,
                extra={"workspace_dir": str(workspaces)},
                fast=False,
                folder=f"home-{host.name}",
            )
            env = claude_env(api.base_url, user_home, max_retries=0)
            env.update(
                {
                    "PATH": f"{Path(sys.executable).parent}:{env['PATH']}",
                    "AGENTPOST_HOME": str(home),
                    "AGENTPOST_CLAUDE_BIN": str(claude_binary()),
                    "AGENTPOST_LOG_LEVEL": "INFO",
                    "PYTHONUNBUFFERED": "1",
                    "PTB_TIMEDELTA": "1",
                    "TELEGRAM_BOT_TOKEN": fake.token,
                    "TELEGRAM_API_BASE_URL": fake.serve_also(host.outside),
                }
            )
            sites[host.name] = Site(net, host, env, tmp)
        db = open_database(url)
        w = World(net, url, db, fake, apis, sites)
        try:
            for site in sites.values():
                site.start()
            yield w
        finally:
            for site in sites.values():
                site.kill9()
            for host in net.hosts:
                net.mend(host)
            w.db.close()


def _finish(w: World, name: str, extra: str = "") -> Counts:
    """Wait until everything settled, stop the hosts, count, print, and check the counts."""
    try:
        wait_for(w.settled, SETTLE, f"[{name}] every message answered")
    except AssertionError:
        rows = {lbl: (r["status"], r["claimed_by"]) for lbl, r in sorted(w.rows().items())}
        logs = "\n".join(site.output() for site in w.sites.values())
        raise AssertionError(f"[{name}] not settled: {rows} sent={sorted(w.sent)}\n{logs}") from None
    for site in w.sites.values():
        site.stop()
    counts = w.counts()
    print(f"\n[{name}] {counts.line()}{extra}\n[{name}] {counts.details}")
    if counts.lost or counts.duplicated or counts.dead:
        logs = "\n".join(site.output() for site in w.sites.values())
        raise AssertionError(f"[{name}] {counts.line()} {counts.details}\n{logs}")
    assert counts.completed == counts.messages == len(w.sent)
    return counts


def _run_on(w: World, host: str, timeout: float = 90.0) -> dict[str, dict[str, Any]]:
    """Until ``host`` runs an agent (a message of its is in a run and its claude CLI exists): chat users
    write a wave of messages whenever everything is answered (the other host may have taken every agent)."""
    site = w.sites[host]
    deadline = time.monotonic() + timeout
    while not (site.clis() and (held := w.held_by(host))):
        assert time.monotonic() < deadline, f"nothing ran on {host} within {timeout:g} s\n{site.output()}"
        assert all(p.poll() is None for p in site.procs.values()), f"{host} exited:\n{site.output()}"
        if w.idle():
            w.wave()
        time.sleep(0.05)
    return held


def _taken_by(w: World, labels: set[str], host: str) -> Callable[[], bool]:
    """Whether every one of ``labels`` is claimed by ``host`` now, or finished."""

    def taken() -> bool:
        rows = w.rows()
        return all(
            str(rows[lbl]["claimed_by"] or "").startswith(f"{host}:") or rows[lbl]["status"] == "completed"
            for lbl in labels
        )

    return taken


def _released_by(w: World, labels: set[str], host: str) -> Callable[[], bool]:
    """Whether none of ``labels`` is claimed by ``host`` any more (another host's recovery took them back), or
    finished (a run that ended just before the cut)."""

    def released() -> bool:
        rows = w.rows()
        return all(
            not str(rows[lbl]["claimed_by"] or "").startswith(f"{host}:")
            or rows[lbl]["status"] == "completed"
            for lbl in labels
        )

    return released


def _takeover(w: World, held: set[str], a: str, b: str, began: float) -> tuple[float, float]:
    """Seconds from ``began`` until host ``b`` took ``held`` back from host ``a`` (recovery: A's claims and
    agent leases lapsed), and until B had claimed them (or finished them): a claim can wait a moment longer
    for the chat's debounce when more messages of the chat arrive meanwhile."""
    wait_for(_released_by(w, held, a), 3 * LEASE, f"host {b} to take {sorted(held)} back", interval=0.05)
    released = time.monotonic() - began
    wait_for(_taken_by(w, held, b), 30, f"host {b} to claim {sorted(held)}", interval=0.05)
    return released, time.monotonic() - began


def test_a_partitioned_host_is_taken_over_fenced_and_rejoins(network: TwoHosts, tmp_path: Path) -> None:
    a, b = network.hosts
    with world(network, tmp_path) as w:
        held = set(_run_on(w, a.name))
        cut = time.monotonic()
        network.cut(a)
        w.wave()  # people keep writing; only host B hears them now
        takeover, claimed = _takeover(w, held, a.name, b.name, cut)
        time.sleep(max(0.0, cut + 2 * LEASE - time.monotonic()))  # the partition lasts twice the lease
        network.mend(a)
        mended = time.time()
        # Host A finds out that its run was taken over: it records the lost lease (and sends nothing of it).
        wait_for(
            lambda: any(str(p.get("worker", "")).startswith(f"{a.name}:") for _, p in w.events("lease_lost")),
            30,
            "host A to record its lost lease",
        )
        # A rejoins: new messages until one of them runs on host A.
        waves = w.waves

        def a_ran_after_mend() -> bool:
            return any(
                at / 1000 >= mended and str(p.get("worker", "")).startswith(f"{a.name}:")
                for at, p in w.events("chain_step_start")
            )

        deadline = time.monotonic() + 90
        while not a_ran_after_mend():
            assert time.monotonic() < deadline, (
                "host A ran nothing after it came back\n" + w.sites[a.name].output()
            )
            if w.idle():
                w.wave()
            time.sleep(0.2)
        counts = _finish(
            w,
            "partition",
            f" taken back {takeover:.1f}s and claimed by B {claimed:.1f}s after the cut (lease {LEASE:g}s);"
            f" held_by_a_at_cut={sorted(held)} rejoin_waves={w.waves - waves}",
        )
    assert takeover <= LEASE + RECOVER + 1.0, f"host B took {takeover:.1f} s to take over (lease {LEASE:g} s)"
    assert counts.messages >= 2 * CHATS


def test_a_host_killed_outright_is_taken_over(network: TwoHosts, tmp_path: Path) -> None:
    a, b = network.hosts
    with world(network, tmp_path) as w:
        held = set(_run_on(w, a.name))
        killed = time.monotonic()
        w.sites[a.name].kill9()
        w.wave()
        takeover, claimed = _takeover(w, held, a.name, b.name, killed)
        _finish(
            w,
            "killed",
            f" taken back {takeover:.1f}s and claimed by B {claimed:.1f}s after the kill (lease {LEASE:g}s);"
            f" held_by_a_at_kill={sorted(held)}",
        )
    assert takeover <= LEASE + RECOVER + 1.0, f"host B took {takeover:.1f} s to take over (lease {LEASE:g} s)"


def test_the_database_server_restarts_while_both_hosts_work(network: TwoHosts, tmp_path: Path) -> None:
    a, b = network.hosts
    # Each host has an agent of its own and shares one ([processor] agents): with traffic that never stops,
    # an unpinned host keeps every agent it holds, and only one host would be working.
    pins = {a.name: ["alpha", "beta"], b.name: ["beta", "gamma"]}
    with world(network, tmp_path, pins) as w:
        restarted = threading.Event()

        def keep_writing() -> None:  # a wave every 2 s until one more after the restart (8 at most)
            for _ in range(8):
                w.wave()
                if restarted.wait(2.0):
                    w.wave()
                    return

        writer = threading.Thread(target=keep_writing)
        writer.start()
        try:
            wait_for(lambda: w.held_by(a.name) and w.held_by(b.name), 60, "both hosts running agents at once")
            running = sorted(w.held_by(a.name)) + sorted(w.held_by(b.name))
            away = restart_postgres()
            w.reconnect()
        finally:
            restarted.set()
            writer.join(30)
        counts = _finish(w, "pg-restart", f" restart took {away:.1f}s; in a run at it: {running}")
        ran = {(str(p["worker"]).split(":")[0], str(p["agent"])) for _, p in w.events("chain_step_start")}
    assert (a.name, "gamma") not in ran and (b.name, "alpha") not in ran, ran  # each host ran only its agents
    assert {host for host, _ in ran} == {a.name, b.name}
    assert counts.messages >= 2 * CHATS
