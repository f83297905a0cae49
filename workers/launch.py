"""Tiny supervisor between the processor and one agent CLI: the CLI's whole process tree dies with the
processor, however the processor died.

Usage: ``python -I -S launch.py PARENT_PID ARGV...``. The processor starts it in a new session (so its pid is
the process group id a timeout or ``/stop`` kills). It then:

1. asks Linux to signal it when its parent dies (``PR_SET_PDEATHSIG``) and checks the parent did not die
   before that took effect — a ``kill -9`` of the processor cannot be caught by the processor itself, so the
   process that notices has to be a child;
2. becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a grandchild whose parent exits (``sh -c
   'sleep 300 &'``, a daemonising helper, even one that left the process group with ``setsid``) is
   reparented to this process instead of to init, so every descendant stays findable under it;
3. forks the CLI (itself armed to die with this process, for the case this one alone is SIGKILLed) and
   waits, reaping whatever orphans land on it;
4. when the processor dies: SIGKILLs every descendant and exits; when the CLI exits: kills what the CLI left
   behind (a run's processes end with the run; a leftover would otherwise outlive both guards) and exits
   with the CLI's own status (the same signal, or the same exit code), so the processor sees the CLI's fate.

A SIGTERM, SIGINT or SIGHUP sent to this pid alone is passed on to the CLI. Only the standard library and
no project imports: it runs with ``-S`` to start fast (a few ms on top of the interpreter's start).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from types import FrameType

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: Delivered to this process when the processor dies; a catchable one, so the tree can be killed first.
PARENT_DEATH_SIGNAL = signal.SIGUSR1
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: How long the final sweep keeps killing processes that were mid-fork when it started.
_SWEEP_SECONDS = 5.0


def _prctl(libc: ctypes.CDLL | None, option: int, value: int) -> bool:
    if libc is None:
        return False
    try:
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _process_table() -> dict[int, tuple[int, bool]]:
    """pid → (parent pid, is a zombie), from /proc."""
    table: dict[int, tuple[int, bool]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        fields = stat.rsplit(b")", 1)[1].split()
        table[int(name)] = (int(fields[1]), fields[0] == b"Z")
    return table


def descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of ``root``, parents before children."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            todo.append(child)
            if not table[child][1]:
                found.append(child)
    return found


def _reap_all() -> None:
    """Collect every exited child (orphans reparented here included) without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree(sig: int = signal.SIGKILL) -> None:
    """Kill every descendant until none is left. A process forking while we sweep has its new child
    reparented to us (we are the subreaper) when we kill it, so the next pass finds that child."""
    me = os.getpid()
    deadline = time.monotonic() + _SWEEP_SECONDS
    while True:
        alive = descendants(me)
        for pid in alive:
            try:  # noqa: SIM105 - contextlib is one more import on the start-up path
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        _reap_all()
        if not alive or time.monotonic() > deadline:
            return
        time.sleep(0.002)


def _exit_like(status: int) -> None:
    """Exit with the CLI's wait status: the same signal if it was killed, else the same exit code."""
    sys.stdout.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _spawn(argv: list[str], libc: ctypes.CDLL | None) -> int:
    """Fork and exec the CLI, tied to this process's life. Raises OSError when it cannot be executed."""
    read_end, write_end = os.pipe()  # close-on-exec: EOF tells the parent the exec happened
    me = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: only async-signal-safe-ish work until exec
        try:
            os.close(read_end)
            for sig in (*_FORWARDED, PARENT_DEATH_SIGNAL):
                signal.signal(sig, signal.SIG_DFL)
            _prctl(libc, PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != me:
                os._exit(137)
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(write_end, str(exc.errno or 0).encode())
        finally:
            os._exit(127)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        failure = pipe.read()
    if failure:
        os.waitpid(pid, 0)
        errno = int(failure)
        raise OSError(errno, os.strerror(errno))
    return pid


def main(args: list[str]) -> int:
    """Supervise ``args[1:]`` on behalf of the process ``args[0]``; 127 when the CLI cannot be run."""
    if len(args) < 2:
        sys.stderr.write("usage: launch.py PARENT_PID ARGV...\n")
        return 2
    parent, argv = int(args[0]), args[1:]
    libc = _libc()
    child = 0

    def on_parent_death(_sig: int, _frame: FrameType | None) -> None:
        # The signal also comes when only the processor's spawning *thread* ends: check it really is gone.
        if os.getppid() != parent:
            kill_tree()
            os._exit(137)

    def forward(sig: int, _frame: FrameType | None) -> None:
        if child:
            try:  # noqa: SIM105 - contextlib is one more import on the start-up path
                os.kill(child, sig)
            except ProcessLookupError:
                pass

    signal.signal(PARENT_DEATH_SIGNAL, on_parent_death)
    for sig in _FORWARDED:
        signal.signal(sig, forward)
    # Without prctl (not Linux) this is a plain wrapper: the processor still kills the group on timeout.
    _prctl(libc, PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL)
    _prctl(libc, PR_SET_CHILD_SUBREAPER, 1)
    if libc is not None and os.getppid() != parent:
        return 137  # the processor died before the signal was armed: do not start an orphan
    try:
        child = _spawn(argv, libc)
    except OSError as exc:
        sys.stderr.write(f"cannot run {argv[0]}: {exc.strerror}\n")
        return 127
    # The CLI holds the pipes now; this process keeps none, so the processor sees end-of-output exactly
    # when the CLI and what it started have closed theirs.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    while True:
        try:
            pid, status = os.wait()  # also reaps orphans reparented to us; retried after signal handlers
        except ChildProcessError:
            return 1
        if pid == child:
            break
    kill_tree()
    _exit_like(status)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
