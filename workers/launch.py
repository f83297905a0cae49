"""Tiny supervisor between the processor and one agent CLI: the CLI's whole process tree dies with the
processor, however the processor died.

Usage: ``python -I -S launch.py [--cgroup DIR]... [--rlimit NAME=N]... [--no-guard] PARENT_PID ARGV...``.
The processor starts it in a new session (so its pid is the process group id a timeout or ``/stop`` kills). It
then:

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

The run's limits (:mod:`workers.limits`) are put on the CLI in the forked child before it execs, so they hold
from its first instruction and for everything it starts: it joins each ``--cgroup`` folder (made and limited
by the processor; this process itself stays outside, so the kernel's OOM killer never picks the guard) and
gets each ``--rlimit`` as both its soft and its hard limit (raising a hard limit takes CAP_SYS_RESOURCE,
which a sandboxed CLI never has). ``--no-guard`` (``[processor] orphan_guard = false``) applies them to this
process and execs the CLI in its place: limits without the guard.

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
#: ``--rlimit`` names (workers/limits.py uses the same) and their resource numbers (Linux, from <resource.h>;
#: the ``resource`` module is not imported for four constants on the start-up path).
RLIMITS = {"fsize": 1, "data": 2, "nproc": 6, "as": 9}
#: The exit status when the limits could not be put on the CLI: it does not run unconfined.
CANNOT_CONFINE = 126


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


class CannotConfine(OSError):
    """The run's limits could not be put on the CLI (``filename`` says which)."""


class Limits:
    """What ``--cgroup`` and ``--rlimit`` asked for (a plain class: dataclasses would add 15 ms of imports)."""

    def __init__(self, cgroups: tuple[str, ...] = (), rlimits: tuple[tuple[int, int], ...] = ()) -> None:
        self.cgroups = cgroups
        self.rlimits = rlimits


def _setrlimit(libc: ctypes.CDLL | None, resource: int, value: int) -> None:
    if libc is None:
        raise CannotConfine(0, "no C library to set limits with", f"rlimit {resource}")
    pair = (ctypes.c_ulong * 2)(value, value)  # struct rlimit { rlim_cur, rlim_max } on 64-bit Linux
    if int(libc.setrlimit(resource, pair)) != 0:
        errno = ctypes.get_errno()
        raise CannotConfine(errno, os.strerror(errno), f"rlimit {resource}")


def confine(limits: Limits, libc: ctypes.CDLL | None) -> None:
    """Put this process (and so whatever it execs and starts) in its cgroups and under its rlimits."""
    for folder in limits.cgroups:
        # v1 names the member list "tasks" too; cgroup.procs moves the whole process on both versions.
        try:
            with open(os.path.join(folder, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        except OSError as exc:
            raise CannotConfine(exc.errno or 0, exc.strerror or str(exc), folder) from None
    for resource, value in limits.rlimits:
        _setrlimit(libc, resource, value)


def _spawn(argv: list[str], libc: ctypes.CDLL | None, limits: Limits) -> int:
    """Fork and exec the CLI, tied to this process's life and under ``limits``. Raises OSError when it
    cannot be executed, :class:`CannotConfine` when the limits cannot be put on it."""
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
            try:
                confine(limits, libc)
            except CannotConfine as exc:
                os.write(write_end, f"{exc.errno or 0} {exc.filename}".encode())
                os._exit(CANNOT_CONFINE)
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(write_end, str(exc.errno or 0).encode())
        finally:
            os._exit(127)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        failure = pipe.read().decode()
    if failure:
        os.waitpid(pid, 0)
        errno_text, _, what = failure.partition(" ")
        errno = int(errno_text)
        if what:
            raise CannotConfine(errno, os.strerror(errno), what)
        raise OSError(errno, os.strerror(errno))
    return pid


def _options(args: list[str]) -> tuple[Limits, bool, list[str]]:
    """``--cgroup``, ``--rlimit`` and ``--no-guard`` from the front of ``args``; the rest is returned."""
    cgroups: list[str] = []
    rlimits: list[tuple[int, int]] = []
    guard = True
    while args and args[0].startswith("--"):
        option = args.pop(0)
        if option == "--no-guard":
            guard = False
        elif option == "--cgroup" and args:
            cgroups.append(args.pop(0))
        elif option == "--rlimit" and args:
            name, _, value = args.pop(0).partition("=")
            rlimits.append((RLIMITS[name], int(value)))
        else:
            raise ValueError(option)
    return Limits(tuple(cgroups), tuple(rlimits)), guard, args


def main(args: list[str]) -> int:
    """Supervise the CLI (after the options and the parent's pid) on behalf of the processor; 127 when the
    CLI cannot be run, 126 when it cannot be confined."""
    try:
        limits, guard, args = _options(list(args))
    except (ValueError, KeyError):
        args = []
    if len(args) < 2:
        sys.stderr.write(
            "usage: launch.py [--cgroup DIR]... [--rlimit NAME=N]... [--no-guard] PARENT_PID ARGV...\n"
        )
        return 2
    parent, argv = int(args[0]), args[1:]
    libc = _libc()
    if not guard:
        return _exec_confined(argv, libc, limits)
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
        child = _spawn(argv, libc, limits)
    except CannotConfine as exc:
        return _cannot_confine(exc)
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


def _cannot_confine(exc: CannotConfine) -> int:
    sys.stderr.write(f"cannot put the run's limits in place ({exc.filename}): {exc.strerror}\n")
    return CANNOT_CONFINE


def _exec_confined(argv: list[str], libc: ctypes.CDLL | None, limits: Limits) -> int:
    """Without the guard: confine this process and become the CLI."""
    try:
        confine(limits, libc)
    except CannotConfine as exc:
        return _cannot_confine(exc)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"cannot run {argv[0]}: {exc.strerror}\n")
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
