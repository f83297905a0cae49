"""An agent's whole process tree dies with the processor, however the processor died.

The agent is a ``command`` agent running ``sh -c`` that leaves a background ``sleep`` in its process group,
a ``sleep`` that left the group with ``setsid`` and whose parent already exited, and a foreground ``sleep``.
The processor is the real ``agentpost run processor`` process. Before the fix, ``kill -9`` of the processor
killed only the direct child; the sleeps were reparented to init and kept running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from tests.liveness_support import process_gone
from tests.processor_support import make_home, open_home, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))

#: Three kinds of descendants: one in the CLI's group, one in its own session whose parent is gone (so it is
#: an orphan: only a subreaper can still see it), and the shell's foreground child.
TREE_SCRIPT = "sleep 301 & (setsid sleep 302 &); sleep 303"


def _table() -> dict[int, tuple[int, str, str]]:
    """pid → (parent pid, state, command line) of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(name)] = (int(fields[1]), fields[0], cmd)
    return table


def _descendants(root: int) -> dict[int, str]:
    table = _table()
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, state, cmd) in table.items():
            if ppid == parent and pid not in found:
                todo.append(pid)
                if state != "Z":
                    found[pid] = cmd
    return found


@pytest.fixture
def processor(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    home = make_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'agentpost.db'}",
        {"tree": {"provider": "command", "command": ["sh", "-c", TREE_SCRIPT]}},
    )
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "AGENTPOST_HOME": str(home)}
    out = open(tmp_path / "processor.out", "wb")  # noqa: SIM115 - closed right after the start
    proc = subprocess.Popen([AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT)
    out.close()
    yield proc, home
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    # Whatever a failed assertion left behind is ours to end (by pid, each one we saw start).
    for pid, cmd in _descendants(1).items():
        if cmd.startswith("sleep 30") and str(home) in _cwd(pid):
            os.kill(pid, signal.SIGKILL)


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def test_sigkill_of_the_processor_kills_every_descendant_of_the_agent(
    processor: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, home = processor
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "start the tree")

    def tree_is_up() -> dict[int, str] | None:
        # Found by working folder rather than by parentage, so a sleep that escaped the tree still counts.
        tree = {pid: cmd for pid, cmd in _descendants(1).items() if str(home) in _cwd(pid)}
        sleeps = {cmd for cmd in tree.values() if cmd.startswith("sleep 30")}
        return tree if sleeps == {"sleep 301", "sleep 302", "sleep 303"} else None

    tree = wait_for(tree_is_up, 30, "the agent's three sleeps to be running")
    # The orphan really is outside the CLI's process group and session: only reparenting keeps it findable.
    (orphan,) = [pid for pid, cmd in tree.items() if cmd == "sleep 302"]
    assert os.getsid(orphan) == orphan

    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(
        lambda: all(process_gone(pid) for pid in tree),
        5,
        f"every descendant of the killed processor to be gone: {tree}",
    )


LAUNCHER = Path(__file__).resolve().parents[2] / "workers" / "launch.py"


def _launch(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", str(LAUNCHER), str(os.getpid()), *argv],
        capture_output=True,
        text=True,
        timeout=30,
        start_new_session=True,
    )


def test_the_launcher_reports_the_cli_status_and_ends_what_the_cli_left_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "bg.pid"
    done = _launch("sh", "-c", f"sleep 304 & echo $! > {pid_file}; echo reply; exit 5")
    assert (done.returncode, done.stdout) == (5, "reply\n")
    # The background sleep did not outlive its run (it would otherwise escape every guard).
    assert process_gone(int(pid_file.read_text()))

    assert _launch("sh", "-c", "kill -TERM $$").returncode == -signal.SIGTERM
    missing = _launch(str(tmp_path / "no-such-cli"))
    assert missing.returncode == 127 and "cannot run" in missing.stderr


def _launch_with(options: list[str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", str(LAUNCHER), *options, str(os.getpid()), *argv],
        capture_output=True,
        text=True,
        timeout=30,
        start_new_session=True,
    )


@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "no-guard"])
def test_the_launcher_puts_the_cli_under_hard_rlimits_it_cannot_raise(guard: bool) -> None:
    """Soft and hard limit both: ``ulimit -H -f unlimited`` (raising the hard limit) fails for a process without
    CAP_SYS_RESOURCE; the CLI here drops to nobody first, as the sandbox drops to agentpost-agent."""
    options = ["--rlimit", "fsize=1048576", "--rlimit", "as=1073741824", *([] if guard else ["--no-guard"])]
    script = "ulimit -S -f; ulimit -H -f; ulimit -v; ulimit -H -f unlimited 2>/dev/null && echo raised || echo held"
    drop = (
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
        if os.geteuid() == 0
        else []
    )
    done = _launch_with(options, *drop, "bash", "-c", script)  # bash counts in KiB
    assert done.stdout.split() == ["1024", "1024", "1048576", "held"], done


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make cgroups")
@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "no-guard"])
def test_the_launcher_puts_the_cli_in_its_cgroup_before_it_runs_and_stays_out_itself(guard: bool) -> None:
    from workers.limits import find_place

    place = find_place().place
    if place is None or place.version != 1:
        pytest.skip("the cgroup v1 pids controller (this machine's)")
    folder = place.pids / f"agentpost-launch-test-{os.getpid()}"
    folder.mkdir()
    try:
        options = ["--cgroup", str(folder), *([] if guard else ["--no-guard"])]
        script = "grep :pids: /proc/$$/cgroup; grep :pids: /proc/$PPID/cgroup"
        done = _launch_with(options, "sh", "-c", script)
        mine, parents = done.stdout.splitlines()
        assert mine.endswith(f":pids:/{folder.name}"), done
        if guard:  # the guard itself stays outside, so the kernel's OOM killer never picks it
            assert not parents.endswith(f"/{folder.name}"), done
        # A cgroup that cannot be joined: the CLI does not run unconfined.
        refused = _launch_with(
            ["--cgroup", str(folder / "no-such-run"), *options[2:]], "sh", "-c", "echo ran"
        )
        assert refused.returncode == 126 and refused.stdout == "", refused
        assert "cannot put the run's limits in place" in refused.stderr, refused
    finally:
        folder.rmdir()
