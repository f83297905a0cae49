"""What one agent run may use — memory, processes, the size of a file it writes — and how it is held to it.

``[agents.X] limits = { memory = "2GiB", processes = 256, disk = "5GiB" }`` (the defaults). A run is held to
them in a way it cannot undo, whatever it runs:

- **a cgroup per run**, where this process may make one: cgroup v2 inside the subtree systemd delegated to
  the service (``Delegate=memory pids``; the processor's own cgroup, or its parent when the unit puts the
  processor in a leaf with ``DelegateSubgroup=``, must list ``memory`` and ``pids`` in
  ``cgroup.subtree_control``), or the v1 ``memory`` and ``pids`` controllers where the machine has those
  (a root service). The run's folder is made under the processor's own cgroup (the service's own limits
  still cover it) as ``agentpost-<pid>-<start>/<agent>-<n>``, limited (v1: ``memory.limit_in_bytes`` and
  ``memory.memsw.limit_in_bytes`` so swap does not dodge it, ``pids.max``; v2: ``memory.max``,
  ``memory.swap.max`` 0, ``pids.max``), and the CLI joins it in :mod:`workers.launch` before it execs. The
  agent cannot leave or raise it: moving a process needs write access to a ``cgroup.procs`` and the
  folders are root's (or the service user's, who is not the sandbox user).
- **rlimits** where no cgroup can be had: ``RLIMIT_AS`` for memory and ``RLIMIT_NPROC`` for processes. Both
  are weaker: RLIMIT_AS bounds each process's address space, not the run's sum, and RLIMIT_NPROC counts
  every process of the user — the sandbox user is shared by every agent, so it is a cap for all runs at
  once (and does not apply to a root service's unsandboxed runs at all). ``agentpost doctor`` says which is
  in force. RLIMIT_AS rather than RLIMIT_DATA: the claude CLI (a Bun binary) starts and answers under the
  default 2 GiB of address space (tests/e2e/test_limits.py), and RLIMIT_DATA would not count shared
  anonymous mappings.
- **the size of a file**: always ``RLIMIT_FSIZE`` (a write past it fails with SIGXFSZ or "File too large").
  It bounds each file, not the total a run writes: many files under the limit can still fill the disk. A
  total would need a quota or a size-limited file system for the workspace, which agentpost does not set up.

Every rlimit is set as soft *and* hard limit before the CLI starts (in :mod:`workers.launch`, before bwrap
and the switch to the sandbox user), so the agent, which has no CAP_SYS_RESOURCE, cannot raise it.

After the run, :meth:`Hold.verdict` tells whether a limit stopped it (the cgroup's OOM kills and refused
forks, the exit status of SIGXFSZ, the CLI's own words under rlimits), and :meth:`Hold.release` kills what is
left in the cgroup and removes it. A processor that was killed leaves its folders behind; the next processor
to start on the host removes those of processors that are gone (:func:`sweep`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from functools import cache
from itertools import count
from pathlib import Path
from typing import Literal, Protocol

import anyio
import anyio.to_thread

from shared.settings.model import AgentLimits
from workers.launch import RLIMITS

log = logging.getLogger("agentpost.processor")

LimitName = Literal["memory", "processes", "disk"]
_FOLDER = re.compile(r"^agentpost-(\d+)-(\d+)$")
_SIGXFSZ_EXIT = 128 + signal.SIGXFSZ  # a shell's or bubblewrap's report of a process killed by SIGXFSZ
#: The words a CLI or its tools print when an rlimit refused them memory or a new process.
_NO_MEMORY = re.compile(
    r"MemoryError|Cannot allocate memory|out of memory|bad_alloc|ENOMEM|allocation failed", re.IGNORECASE
)
_NO_PROCESS = re.compile(
    r"fork: (?:retry|Resource temporarily unavailable)|can't fork|Cannot fork|BlockingIOError: \[Errno 11\]|"
    r"EAGAIN.*spawn|spawn.*EAGAIN",
    re.IGNORECASE,
)
_RELEASE_SECONDS = 5.0


def size_words(size: int) -> str:
    """``512 MiB``, ``2 GiB``, ``1.4 GiB``, ``200 KiB``, ``12 bytes``: a size as a person reads it."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            value = size / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) or value >= 100 else f"{value:.1f} {unit}"
    return f"{size} bytes"


@dataclass(frozen=True)
class LimitHit:
    """A limit that stopped a run: which, its size, and what was measured (for the operator)."""

    which: LimitName
    limit: int
    agent: str = ""
    measured: str = ""  # "peak 512 MiB, 1 process killed"

    @property
    def explanation(self) -> str:
        """What happened, in a chat user's words."""
        if self.which == "memory":
            return f"the agent ran out of memory (limit {size_words(self.limit)})"
        if self.which == "processes":
            return f"the agent tried to run more processes at once than it may (limit {self.limit})"
        return f"the agent tried to write a file larger than it may (limit {size_words(self.limit)})"

    @property
    def advice(self) -> str:
        """What the person can do: ask for less, or have the operator raise the limit."""
        key = f"[agents.{self.agent}] limits.{self.which}" if self.agent else f"limits.{self.which}"
        smaller = {
            "memory": "something that needs less memory (smaller inputs, one thing at a time)",
            "processes": "something that starts fewer programs at once",
            "disk": "a smaller file, or the output in parts",
        }[self.which]
        return f"Ask for {smaller}, or the operator can raise `{key}` in settings.toml; then type /retry."


class RunFailure(Protocol):
    """What :meth:`Hold.judge` marks: :class:`workers.providers.base.RunResult` (which imports this
    module)."""

    error: str
    limit: LimitHit | None


# -- where this processor may make cgroups -------------------------------------------------------------------
@dataclass(frozen=True)
class CgroupPlace:
    """The folders under which this process makes run cgroups: v1 one per controller, v2 one for both."""

    version: Literal[1, 2]
    memory: Path
    pids: Path

    @property
    def describe(self) -> str:
        if self.version == 2:
            return f"a cgroup v2 per run under {self.memory}"
        return f"a cgroup v1 per run (memory under {self.memory}, pids under {self.pids})"


@dataclass(frozen=True)
class Enforcement:
    """How runs are held to their limits on this host, found once (:func:`enforcement`)."""

    place: CgroupPlace | None
    #: Why there is no cgroup, in an operator's words ('' when there is one).
    why_not: str = ""

    @property
    def way(self) -> str:
        return f"cgroup v{self.place.version}" if self.place else "rlimits"


def _mounts() -> dict[str, Path]:
    """Controller ("memory", "pids", or "" for the v2 hierarchy) → where its hierarchy is mounted."""
    found: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, more = head.split(), tail.split()
        if len(fields) < 5 or len(more) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if more[0] == "cgroup2":
            found.setdefault("", point)
        elif more[0] == "cgroup":
            for option in more[2].split(","):
                if option in ("memory", "pids"):
                    found.setdefault(option, point)
    return found


def _own_cgroups() -> dict[str, str]:
    """Controller ("" for v2) → this process's cgroup path in that hierarchy (/proc/self/cgroup)."""
    own: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _lists(path: Path, *wanted: str) -> bool:
    try:
        return set(wanted) <= set(path.read_text().split())
    except OSError:
        return False


def _can_make_under(folder: Path) -> str:
    """'' when a cgroup can be made (and removed) under ``folder``, else why not."""
    probe = folder / f"agentpost-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot make a cgroup in {folder}: {exc.strerror}"
    with contextlib.suppress(OSError):
        probe.rmdir()
    return ""


def find_place() -> Enforcement:
    """Where this process may make run cgroups (see the module docstring), or why it may not."""
    mounts, own = _mounts(), _own_cgroups()
    reasons: list[str] = []
    if "" in mounts and "" in own:
        mine = mounts[""] / own[""].lstrip("/")
        found = _v2_base(mine) if _lists(mine / "cgroup.controllers", "memory", "pids") else None
        if found is not None:
            problem = _can_make_under(found)
            if not problem:
                return Enforcement(CgroupPlace(2, found, found))
            reasons.append(problem)
        else:
            reasons.append(
                f"cgroup v2, but memory and pids are not delegated to {mine} (systemd: Delegate=memory pids "
                "and DelegateSubgroup=processor in the unit)"
            )
    if "memory" in mounts and "pids" in mounts:
        memory = mounts["memory"] / own.get("memory", "/").lstrip("/")
        pids = mounts["pids"] / own.get("pids", "/").lstrip("/")
        problem = _can_make_under(memory) or _can_make_under(pids)
        if not problem:
            return Enforcement(CgroupPlace(1, memory, pids))
        reasons.append(f"cgroup v1: {problem}")
    elif not reasons:
        reasons.append("no cgroup hierarchy with the memory and pids controllers is mounted")
    return Enforcement(None, "; ".join(reasons))


def _v2_base(mine: Path) -> Path | None:
    """Where run cgroups go on v2: this process's own cgroup when memory and pids are handed down from it;
    else its parent when that is the delegated service cgroup and this process sits in a leaf below it
    (systemd's DelegateSubgroup=) — handing them down there ourselves if needed, which a cgroup without
    processes of its own allows and delegation lets the service do."""
    if _lists(mine / "cgroup.subtree_control", "memory", "pids"):
        return mine
    parent = mine.parent
    if _lists(parent / "cgroup.subtree_control", "memory", "pids"):
        return parent if os.access(parent / "cgroup.procs", os.W_OK) else None
    if not os.access(parent / "cgroup.subtree_control", os.W_OK) or _read(parent / "cgroup.procs").split():
        return None
    try:
        (parent / "cgroup.subtree_control").write_text("+memory +pids")
    except OSError:
        return None
    return parent


@cache
def enforcement() -> Enforcement:
    """:func:`find_place`, found once per process (the processor's cgroups do not move)."""
    return find_place()


# -- one run -----------------------------------------------------------------------------------------------
def _start_ticks(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of its stat), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


_serial = count(1)


def _folder_name() -> str:
    """This processor's folder: its pid and start time, so a leftover is known to be a dead processor's."""
    return f"agentpost-{os.getpid()}-{_start_ticks(os.getpid())}"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _keyed(text: str) -> dict[str, int]:
    """``key value`` lines (memory.events, pids.events, memory.oom_control) as a dict."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            found[key] = int(value)
    return found


def _number(path: Path) -> int:
    try:
        return int(_read(path).strip() or 0)
    except ValueError:
        return 0


@dataclass
class Hold:
    """One run's limits as they are put in place: its cgroup folders (none under rlimits) and the options
    that tell :mod:`workers.launch` to apply them. Made by :func:`hold_limits`."""

    agent: str
    limits: AgentLimits
    version: int = 0  # 1 or 2 with a cgroup, 0 under rlimits
    folders: tuple[Path, ...] = ()  # v1: (memory, pids); v2: (the one folder,)
    #: The counters at the start of the current turn: a warm process keeps its cgroup across turns.
    _base: dict[str, int] = field(default_factory=dict)

    def launcher_options(self) -> list[str]:
        """The options of :mod:`workers.launch` that put this run in its cgroup and under its rlimits."""
        out: list[str] = []
        for folder in self.folders:
            out += ["--cgroup", str(folder)]
        rlimits = {"fsize": self.limits.disk}
        if not self.folders:
            rlimits |= {"as": self.limits.memory, "nproc": self.limits.processes}
        for name, value in rlimits.items():
            assert name in RLIMITS
            out += ["--rlimit", f"{name}={value}"]
        return out

    def counters(self) -> dict[str, int]:
        """oom_kill (processes the memory limit killed), peak (bytes of memory), refused (forks the pids limit
        refused), pids (the most processes at once)."""
        if not self.folders:
            return {}
        if self.version == 2:
            folder = self.folders[0]
            return {
                "oom_kill": _keyed(_read(folder / "memory.events")).get("oom_kill", 0),
                "peak": _number(folder / "memory.peak"),
                "refused": _keyed(_read(folder / "pids.events")).get("max", 0),
                "pids": _number(folder / "pids.peak"),
            }
        memory, pids = self.folders
        return {
            "oom_kill": _keyed(_read(memory / "memory.oom_control")).get("oom_kill", 0),
            "peak": _number(memory / "memory.max_usage_in_bytes"),
            "refused": _keyed(_read(pids / "pids.events")).get("max", 0),
            "pids": _number(pids / "pids.peak"),
        }

    def mark(self) -> None:
        """Start counting from now (a turn of a kept process)."""
        self._base = self.counters()

    def verdict(self, exit_code: int | None, stderr: str) -> LimitHit | None:
        """The limit that stopped a failed run, if one did (see the module docstring)."""
        seen = self.counters()
        grew = {k: v - self._base.get(k, 0) for k, v in seen.items()}
        limits = self.limits
        if grew.get("oom_kill", 0) > 0:
            killed = grew["oom_kill"]
            measured = f"peak {size_words(seen['peak'])}, {killed} process{'es' if killed > 1 else ''} killed"
            return LimitHit("memory", limits.memory, self.agent, measured)
        if grew.get("refused", 0) > 0:
            refused = grew["refused"]
            measured = f"{refused} new process{'es' if refused > 1 else ''} refused"
            if seen.get("pids"):
                measured += f", at most {seen['pids']} at once"
            return LimitHit("processes", limits.processes, self.agent, measured)
        if exit_code in (_SIGXFSZ_EXIT, -signal.SIGXFSZ) or "File too large" in stderr:
            return LimitHit("disk", limits.disk, self.agent, "a write past the file size limit was refused")
        if not self.folders:
            if _NO_MEMORY.search(stderr):
                return LimitHit("memory", limits.memory, self.agent, "an allocation was refused by RLIMIT_AS")
            if _NO_PROCESS.search(stderr):
                return LimitHit(
                    "processes", limits.processes, self.agent, "a fork was refused by RLIMIT_NPROC"
                )
        return None

    def judge(self, result: RunFailure, exit_code: int | None, stderr: str) -> None:
        """Name the limit that stopped the failed run ``result``, if one did: ``result.limit``, and its words
        before the error (which ``agentpost trace`` shows)."""
        hit = self.verdict(exit_code, stderr)
        if hit is None:
            return
        result.limit = hit
        result.error = f"stopped by a limit: {hit.explanation} — {hit.measured}; {result.error}"

    async def release_async(self) -> None:
        """:meth:`release` in a worker thread, finished even when the caller is being cancelled."""
        if self.folders:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.release)

    def release(self) -> None:
        """Kill what is left in the run's cgroup and remove it (blocking: call it from a thread)."""
        for folder in self.folders:
            _remove(folder)
        self.folders = ()


def hold_limits(agent: str, limits: AgentLimits) -> Hold:
    """The limits of one run of ``agent``: a cgroup made and limited now where this host allows one (see
    :func:`enforcement`), else rlimits only. A cgroup that cannot be made falls back to rlimits, logged."""
    place = enforcement().place
    if place is None:
        return Hold(agent, limits)
    name = f"{agent}-{next(_serial)}"
    made: list[Path] = []
    try:
        if place.version == 2:
            folder = place.memory / _folder_name()
            _ensure_v2_parent(folder)
            run = folder / name
            run.mkdir()
            made.append(run)
            (run / "memory.max").write_text(str(limits.memory))
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to dodge through
                (run / "memory.swap.max").write_text("0")
            (run / "pids.max").write_text(str(limits.processes))
        else:
            memory = place.memory / _folder_name() / name
            memory.mkdir(parents=True)
            made.append(memory)
            (memory / "memory.limit_in_bytes").write_text(str(limits.memory))
            with contextlib.suppress(FileNotFoundError):  # swap accounting off: nothing to dodge through
                (memory / "memory.memsw.limit_in_bytes").write_text(str(limits.memory))
            pids = place.pids / _folder_name() / name
            pids.mkdir(parents=True)
            made.append(pids)
            (pids / "pids.max").write_text(str(limits.processes))
    except OSError as exc:
        log.warning("agent %s: cannot make the run's cgroup (%s); rlimits only for this run", agent, exc)
        for folder in made:
            _remove(folder)
        return Hold(agent, limits)
    return Hold(agent, limits, place.version, tuple(made))


def _ensure_v2_parent(folder: Path) -> None:
    """The processor's v2 folder, with memory and pids handed down to the runs made in it."""
    if folder.is_dir():
        return
    folder.mkdir(exist_ok=True)
    (folder / "cgroup.subtree_control").write_text("+memory +pids")


def _members(folder: Path) -> list[int]:
    return [int(pid) for pid in _read(folder / "cgroup.procs").split()]


def _remove(folder: Path) -> bool:
    """Kill every process left in the cgroup ``folder`` and remove it; False when it could not be removed
    within a few seconds (a process stuck in the kernel), so a later sweep tries again."""
    deadline = time.monotonic() + _RELEASE_SECONDS
    while True:
        for pid in _members(folder):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            folder.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("cannot remove the cgroup %s: %s", folder, exc.strerror)
                return False
        time.sleep(0.02)


def sweep() -> int:
    """Remove the run cgroups that processors which are gone left on this host (a ``kill -9``, a crash),
    killing anything still in them; returns how many run cgroups were removed. Called at processor start."""
    place = enforcement().place
    if place is None:
        return 0
    removed = 0
    for base in dict.fromkeys((place.memory, place.pids)):
        try:
            entries = list(base.iterdir())
        except OSError:
            continue
        for folder in entries:
            match = _FOLDER.match(folder.name)
            if not match or not folder.is_dir():
                continue
            pid, start = int(match.group(1)), match.group(2)
            if _start_ticks(pid) == start:
                continue  # its processor is alive: its runs are its own to clean up
            try:
                runs = [p for p in folder.iterdir() if p.is_dir()]
            except FileNotFoundError:
                continue  # another processor starting on this host swept it first
            for run in runs:
                removed += _remove(run)
            _remove(folder)
    if removed:
        log.info("removed %d run cgroup(s) left by processors that are gone", removed)
    return removed


def leave() -> None:
    """Remove this processor's own cgroup folder if no run is left in it (at a clean shutdown)."""
    place = enforcement().place
    if place is None:
        return
    for base in dict.fromkeys((place.memory, place.pids)):
        with contextlib.suppress(OSError):
            (base / _folder_name()).rmdir()
