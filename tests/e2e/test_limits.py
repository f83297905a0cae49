"""Limits per agent that a run cannot lift (workers/limits.py, workers/launch.py), tried for real: a real
processor process runs a command agent with ``limits = { memory = "512MiB", processes = 64, disk = "200MiB" }``
that tries to use 1.5 GB of memory, to run 300 processes and to write a 400 MB file — with the sandbox
(root → bubblewrap → setpriv → ``agentpost-agent``) and with ``sandbox = "none"``. Each attempt is stopped at
its limit (measured by the agent itself as it goes, and by the cgroup), the chat is told in plain words which
limit stopped it, the message is dead after that one run (no retries into the same wall), and the run's cgroup
is gone afterwards — also after a ``kill -9`` of the processor, once the next processor starts. The real
claude CLI still answers under the default limits, inside its cgroup with the file size limit set."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.e2e.test_sandbox import _as_service_user, _give, _service_user
from tests.fakes.anthropic_api import (
    JSON,
    Computed,
    FakeAnthropic,
    Reply,
    ToolUse,
    last_user_text,
    tool_results,
)
from tests.fakes.claude_env import claude_binary, claude_env
from tests.homes import open_home
from tests.probes import service_unavailable, wait_for
from tests.processor_support import make_home, write_settings
from workers.limits import CgroupPlace, find_place, sweep

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240), pytest.mark.serial]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))
MIB = 1 << 20
LIMITS = {"memory": "512MiB", "processes": 64, "disk": "200MiB"}
#: The system's interpreter: the sandbox user can run it (this machine's own Python lives under /root, 0700).
PYTHON = "/usr/bin/python3"

#: The greedy agent. It reads its task on stdin and records what it reached in ``reached.json`` in its
#: workspace after every step (a run the kernel kills cannot report at the end).
GREEDY = r"""
import json, os, resource, sys, time
task = sys.stdin.read().split()[0]
reached = {}
def note(**values):
    reached.update(values, maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    with open("reached.json.tmp", "w") as f:
        json.dump(reached, f)
    os.replace("reached.json.tmp", "reached.json")
if task == "memory":  # 1.5 GB, in touched 32 MiB pieces (untouched pages would cost nothing)
    hoard = []
    while sum(map(len, hoard)) < 1_500_000_000:
        hoard.append(b"\x01" * (32 << 20))
        note(allocated=sum(map(len, hoard)))
elif task == "processes":  # 300 processes alive at once
    children = []
    for _ in range(300):
        pid = os.fork()
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        children.append(pid)
        note(started=len(children))
elif task == "disk":  # a 400 MB file, from the shell
    # Python ignores SIGXFSZ (a write past the limit fails with EFBIG); most programs are killed by it instead,
    # silently: restore that for the shell, as the processor's own children have it.
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    os.execvp("/bin/sh", ["sh", "-c", "head -c 400000000 /dev/zero > big.bin || exit $?; echo written"])
print(f"done: {task} {reached}")
"""


@pytest.fixture
def service_tmp() -> Iterator[Path]:
    """A folder the service user can reach (pytest's own temporary folders are 0700, root's)."""
    folder = Path(tempfile.mkdtemp(prefix="agentpost-limits-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _place() -> CgroupPlace:
    place = find_place().place
    if place is None:
        service_unavailable("cgroups", "this process may not make memory and pids cgroups (run as root)")
    return place


def _run_folders(place: CgroupPlace, processor_pid: int) -> list[Path]:
    """The run cgroups of the processor ``processor_pid`` that exist now (both hierarchies)."""
    found: list[Path] = []
    for base in {place.memory, place.pids}:
        for folder in base.glob(f"agentpost-{processor_pid}-*"):
            found += [p for p in folder.iterdir() if p.is_dir()]
    return found


def _home(tmp: Path, sandbox: str, agents: dict[str, Any]) -> Path:
    home = make_home(
        tmp, f"sqlite:///{tmp / 'home' / 'agentpost.db'}", agents, processor={"sandbox": sandbox}
    )
    home.chmod(0o755)
    return home


@contextmanager
def _processor(
    home: Path, env: dict[str, str], log: Path, prefix: list[str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*(prefix or []), AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=15)


def _env(home: Path, tmp: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "LANG": "C.UTF-8",
        "AGENTPOST_HOME": str(home),
    }


def _answer(rt: Runtime, message_id: str, proc: subprocess.Popen[bytes], log: Path) -> str:
    def answered() -> object:
        assert proc.poll() is None, f"the processor exited: {log.read_text(errors='replace')[-3000:]}"
        return rt.db.read_scalar("SELECT message FROM responses WHERE message_id = :m", {"m": message_id})

    return str(wait_for(answered, 120, f"the answer to {message_id}"))


def _events(rt: Runtime, message_id: str, kind: str) -> list[dict[str, Any]]:
    rows = rt.db.read("SELECT type, payload FROM events WHERE type = :t ORDER BY id", {"t": kind})
    payloads = [json.loads(r["payload"]) for r in rows]
    return [p for p in payloads if message_id in (p.get("message_ids") or [p.get("message_id")])]


@pytest.mark.skipif(os.geteuid() != 0, reason="the root service, which may make cgroups")
@pytest.mark.parametrize("sandbox", ["namespaces", "none"])
@pytest.mark.parametrize("task", ["memory", "processes", "disk"])
def test_a_run_cannot_pass_its_limits_and_the_chat_is_told_which_stopped_it(
    tmp_path: Path, sandbox: str, task: str
) -> None:
    place = _place()
    script = tmp_path / "greedy.py"
    script.write_text(GREEDY)
    tmp_path.chmod(0o755)
    agents = {"greedy": {"provider": "command", "command": [PYTHON, str(script)], "limits": LIMITS}}
    home = _home(tmp_path, sandbox, agents)
    log = tmp_path / "processor.out"
    with open_home(home) as rt, _processor(home, _env(home, tmp_path), log) as proc:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), task, agent="greedy")
        told = _answer(rt, sent.message_id, proc, log)
        status, retries, error = rt.db.read(
            "SELECT status, retry_count, last_error FROM messages WHERE message_id = :m",
            {"m": sent.message_id},
        )[0].values()
        runs = _events(rt, sent.message_id, "chain_step_start")
        answers = rt.db.read("SELECT message FROM responses WHERE message_id = :m", {"m": sent.message_id})
        leftovers = _run_folders(place, proc.pid)
    workspace = home / "workspace" / "greedy"
    reached = json.loads((workspace / "reached.json").read_text()) if task != "disk" else {}
    expected = {
        "memory": "the agent ran out of memory (limit 512 MiB)",
        "processes": "the agent tried to run more processes at once than it may (limit 64)",
        "disk": "the agent tried to write a file larger than it may (limit 200 MiB)",
    }[task]
    assert expected in told, told
    assert f"[agents.greedy] limits.{task}" in told, told
    # One run, one explanation, dead at once: not retried into the same wall.
    assert (status, retries, len(runs), len(answers)) == ("dead", 1, 1, 1), (status, retries, runs, answers)
    assert f"stopped by a limit: {expected}" in str(error), error
    trace = subprocess.run(
        [AGENTPOST, "trace", sent.message_id],
        env=_env(home, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"stopped by a limit: {expected}" in trace.stdout, trace.stdout
    assert leftovers == [], leftovers  # the run's cgroup went with the run
    if task == "memory":
        # It got near the limit and never past it; the cgroup's own peak says the same.
        assert 256 * MIB < reached["allocated"] <= 512 * MIB, reached
        assert reached["maxrss"] <= 512 * MIB, reached
    elif task == "processes":
        assert 32 < reached["started"] < 64, reached
    else:
        size = (workspace / "big.bin").stat().st_size
        assert size == 200 * MIB, size  # written up to the limit, not a byte past it
    print(f"\n{task} {sandbox}: reached {reached or size}\n  told: {told}\n  error: {error}")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create the service user it runs as")
@pytest.mark.parametrize("task", ["memory", "processes", "disk"])
def test_a_service_that_may_not_make_cgroups_holds_runs_by_rlimits(service_tmp: Path, task: str) -> None:
    """A processor running as a normal user (no delegated cgroup): RLIMIT_AS, RLIMIT_NPROC and RLIMIT_FSIZE,
    with the CLI in bubblewrap's user namespace. RLIMIT_NPROC counts every process of the service user
    (the processor's own threads too), so the agent gets fewer than 64."""
    tmp_path = service_tmp
    uid, gid = _service_user()
    script = tmp_path / "greedy.py"
    script.write_text(GREEDY)
    agents = {"greedy": {"provider": "command", "command": [PYTHON, str(script)], "limits": LIMITS}}
    home = _home(tmp_path, "namespaces", agents)
    log = tmp_path / "processor.out"
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), task, agent="greedy")
        _give(home, (uid, gid))
        with _processor(home, _env(home, tmp_path), log, _as_service_user(uid, gid)) as proc:
            told = _answer(rt, sent.message_id, proc, log)
            status, error = rt.db.read(
                "SELECT status, last_error FROM messages WHERE message_id = :m", {"m": sent.message_id}
            )[0].values()
    workspace = home / "workspace" / "greedy"
    reached = json.loads((workspace / "reached.json").read_text()) if task != "disk" else {}
    assert status == "dead", (status, error)
    assert f"[agents.greedy] limits.{task}" in told, (told, error)
    if task == "memory":
        assert "ran out of memory (limit 512 MiB)" in told and "RLIMIT_AS" in str(error), error
        assert reached["allocated"] < 512 * MIB and reached["maxrss"] <= 512 * MIB, reached
    elif task == "processes":
        assert "(limit 64)" in told, told
        assert 0 < reached["started"] < 64, reached
    else:
        assert (workspace / "big.bin").stat().st_size == 200 * MIB
    print(f"\n{task} rlimits: reached {reached}\n  error: {error}")


@pytest.mark.skipif(os.geteuid() != 0, reason="the root service, which may make cgroups")
def test_a_killed_processors_cgroups_are_removed_by_the_next_one(tmp_path: Path) -> None:
    place = _place()
    agents = {"sleeper": {"provider": "command", "command": ["/bin/sleep", "300"], "limits": LIMITS}}
    home = _home(tmp_path, "namespaces", agents)
    log = tmp_path / "processor.out"
    env = _env(home, tmp_path)
    with open_home(home) as rt:
        with _processor(home, env, log) as first:
            rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "sleep", agent="sleeper")

            def running() -> list[Path]:
                folders = _run_folders(place, first.pid)
                busy = [f for f in folders if (f / "cgroup.procs").read_text().split()]
                return folders if len(busy) == 2 else []

            left = wait_for(running, 60, "the sleeper's run to be in its cgroups")
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=15)
        # The orphan guard killed the run; its cgroups stay behind until a processor starts here again.
        wait_for(
            lambda: all(not (f / "cgroup.procs").read_text().split() for f in left), 30, "the run to die"
        )
        assert all(f.is_dir() for f in left)
        with _processor(home, env, log) as second:
            wait_for(lambda: not any(f.exists() for f in left), 60, "the next processor to remove them")
            assert not any(f.parent.exists() for f in left)
            assert second.poll() is None


@pytest.mark.skipif(os.geteuid() != 0, reason="the root service, which may make cgroups")
def test_processors_starting_together_sweep_the_same_leftovers_without_tripping() -> None:
    """Processors that start at once on one host (a restart of several, parallel tests) sweep the same dead
    processors' cgroups: a folder another sweep removed between the listing and the look inside is fine."""
    place = _place()
    gone = subprocess.Popen(["/bin/true"])
    gone.wait()
    left: list[Path] = []
    for n in range(60):
        for base in {place.memory, place.pids}:
            folder = base / f"agentpost-{gone.pid}-{990000 + n}"
            (folder / "run-1").mkdir(parents=True)
            left.append(folder)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def start_a_processor() -> None:
        barrier.wait()
        try:
            sweep()
        except BaseException as exc:  # any failure of any sweep is the test's to report
            errors.append(exc)

    sweepers = [threading.Thread(target=start_a_processor) for _ in range(8)]
    for sweeper in sweepers:
        sweeper.start()
    for sweeper in sweepers:
        sweeper.join(timeout=60)
    assert errors == []
    assert [f for f in left if f.exists()] == []


# -- the real claude CLI under the default limits ----------------------------------------------------------
def _inspect(body: JSON) -> str | Reply:
    """Ask the Bash tool where the CLI's processes run and under which file size limit; answer with that."""
    results = tool_results(body)
    if "inspect" in last_user_text(body) and not results:
        return ToolUse(
            "Bash", {"command": "cat /proc/self/cgroup; ulimit -f; ulimit -v", "description": "Look"}
        )
    return "\n".join(str(r.get("content", "")) for r in results) if results else "hello"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to make cgroups, or to create the service user)")
@pytest.mark.parametrize(
    ("service", "sandbox", "warm"),
    [
        ("root", "namespaces", 0),
        ("root", "namespaces", 60),
        ("root", "none", 0),
        ("service-user", "namespaces", 0),
    ],
    ids=["root-sandbox-cold", "root-sandbox-warm", "root-none", "service-user-rlimits"],
)
def test_the_claude_cli_answers_under_the_default_limits(
    service_tmp: Path, service: str, sandbox: str, warm: int
) -> None:
    """As root, the CLI and its Bash tool run in the run's cgroups (a warm process too); as a service user
    that may not make cgroups, under RLIMIT_AS of the default 2 GiB, which the CLI (a Bun binary that
    reserves address space up front) starts and answers under. Both with RLIMIT_FSIZE of 5 GiB."""
    tmp_path = service_tmp
    owner = _service_user() if service == "service-user" else None
    if owner is None:
        _place()
    try:
        claude_binary()
    except FileNotFoundError as exc:
        service_unavailable("the claude CLI", exc)
    with FakeAnthropic(default=Computed(_inspect)) as api:
        agents = {"coder": {"provider": "claude", "permission_mode": "bypassPermissions"}}
        home = make_home(
            tmp_path,
            f"sqlite:///{tmp_path / 'home' / 'agentpost.db'}",
            agents,
            processor={"sandbox": sandbox, "session_idle_seconds": warm},
        )
        env = {**claude_env(api.base_url, tmp_path), "AGENTPOST_HOME": str(home), "IS_SANDBOX": "1"}
        log = tmp_path / "processor.out"
        with open_home(home) as rt:
            if owner is not None:
                _give(home, owner)
            prefix = _as_service_user(*owner) if owner else None
            with _processor(home, env, log, prefix) as proc:
                told = [
                    _answer(
                        rt,
                        rt.queue.intake.enqueue_message(chat, "inspect", agent="coder").message_id,
                        proc,
                        log,
                    )
                    for chat in (ChatAddress("cli", "me", conversation="me"),) * (2 if warm else 1)
                ]
                runs = rt.db.read("SELECT payload FROM events WHERE type = 'chain_step_done' ORDER BY id")
                pids = {json.loads(r["payload"])["pid"] for r in runs}
    for answer in told:
        lines = answer.splitlines()
        assert str(5 * (1 << 30) // 1024) in lines, answer  # ulimit -f counts 1024-byte blocks: 5 GiB
        memory = next(line for line in lines if ":memory:" in line)
        if owner is None:
            assert "/agentpost-" in memory and "/coder-" in memory, answer  # Bash ran in the run's cgroup
            assert "pids:/agentpost-" in answer, answer
            assert "unlimited" in lines, answer  # no RLIMIT_AS on top of the cgroup
        else:
            assert "/agentpost-" not in answer, answer
            assert str(2 * (1 << 30) // 1024) in lines, answer  # ulimit -v: 2 GiB of address space
    assert len(pids) == 1, pids  # warm: both turns went to the one kept (and still confined) process


def _doctor(home: Path, prefix: list[str] | None = None) -> dict[str, dict[str, str]]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "AGENTPOST_HOME": str(home), "NO_COLOR": "1"}
    out = subprocess.run(
        [*(prefix or []), AGENTPOST, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    return {c["name"]: c for c in json.loads(out.stdout) if c["area"] == "agents"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to make cgroups, and to create the service user)")
def test_doctor_says_each_agents_limits_and_how_they_are_held(service_tmp: Path) -> None:
    _place()
    agents = {
        "greedy": {"provider": "command", "command": ["/bin/true"], "limits": LIMITS},
        "plain": {"provider": "command", "command": ["/bin/true"]},
    }
    home = _home(service_tmp, "namespaces", agents)
    as_root = _doctor(home)
    assert as_root["limits"]["level"] == "ok", as_root["limits"]
    assert (
        "cgroup v1 per run" in as_root["limits"]["detail"] and "RLIMIT_FSIZE" in as_root["limits"]["detail"]
    )
    assert (
        as_root["agent greedy limits"]["detail"]
        == "memory 512 MiB, 64 processes, files up to 200 MiB (cgroup v1)"
    )
    assert (
        as_root["agent plain limits"]["detail"]
        == "memory 2 GiB, 256 processes, files up to 5 GiB (cgroup v1)"
    )
    assert "limits without a sandbox" not in as_root
    # Unconfined, a root service's agent runs as root: it could undo its own limits, and doctor says so.
    settings = tomllib.loads((home / "settings.toml").read_text())
    write_settings(home, {**settings, "processor": {"sandbox": "none"}})
    unconfined = _doctor(home)["limits without a sandbox"]
    assert unconfined["level"] == "warn", unconfined
    assert "as root: a run can leave or rewrite its cgroup" in unconfined["detail"], unconfined
    write_settings(home, settings)
    owner = _service_user()
    _give(home, owner)
    as_user = _doctor(home, _as_service_user(*owner))
    assert as_user["limits"]["level"] == "warn", as_user["limits"]
    assert (
        "RLIMIT_AS" in as_user["limits"]["detail"]
        and "RLIMIT_NPROC is per user" in as_user["limits"]["detail"]
    )
    assert "Delegate=memory pids" in as_user["limits"]["fix"]
    assert as_user["agent greedy limits"]["detail"].endswith("(rlimits)")
