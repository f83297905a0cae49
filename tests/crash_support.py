"""Helpers for the crash-accounting fault tests (issue 11): real ``agentpost run processor`` processes running
the real Claude Code CLI against a fake Anthropic API whose replies stream for a moment and name the
messages they answer, SIGKILL timed *during* runs, and a per-message tally at the end.

- Every message text carries a label ``lbl-c<chat>-m<n>``; :class:`LabelledApi` answers each main request
  with ``answered lbl-… lbl-…`` (the labels of the prompt), streamed in pieces over about
  :data:`STREAM_SECONDS`, and records when each request came and which labels it carried.
- :class:`ProcessorProcess` is one ``agentpost run processor`` OS process (run as ``python -m shared.cli.main``
  from this checkout) whose agent CLIs talk only to the fake.
- :func:`cli_pids` finds the claude CLI processes under a processor (whether the processor started the CLI
  directly or through a supervising launcher).
- :func:`kill_during_runs` lands SIGKILLs on processors while a CLI of theirs is streaming a reply, each
  kill confirmed afterwards from the database (the run's messages had not completed).
- :func:`tally` counts per message: completed, dead, covered by more than one final reply, lost.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.storage.db import Database
from tests.fakes.anthropic_api import Chunked, Computed, FakeAnthropic, Reply, last_user_text
from tests.fakes.claude_env import claude_binary, claude_env
from tests.homes import build_home

REPO_ROOT = Path(__file__).resolve().parents[1]
LABEL_RE = re.compile(r"\blbl-c(\d+)-m(\d+)\b")
#: How long the fake streams one reply; a kill within the first half of it lands mid-run.
STREAM_SECONDS = 1.3


def label(chat: int, number: int) -> str:
    """The label of message ``number`` of chat ``chat``."""
    return f"lbl-c{chat}-m{number}"


def chat_of(lbl: str) -> int:
    match = LABEL_RE.fullmatch(lbl)
    assert match is not None, lbl
    return int(match.group(1))


def labels_in(text: str) -> list[str]:
    """The labels in ``text``, in order, each once."""
    return list(dict.fromkeys(m.group(0) for m in LABEL_RE.finditer(text or "")))


@dataclass(frozen=True)
class ApiCall:
    """One main request the fake answered: when (``time.monotonic()``) and for which labels."""

    index: int
    at: float
    labels: tuple[str, ...]

    @property
    def chats(self) -> set[int]:
        return {chat_of(lbl) for lbl in self.labels}


class LabelledApi:
    """The fake Anthropic API answering every main request with the labels of its prompt, slowly."""

    def __init__(self, stream_seconds: float = STREAM_SECONDS, host: str = "127.0.0.1") -> None:
        self.stream_seconds = stream_seconds
        self.fake = FakeAnthropic(default=Computed(self._reply), host=host)
        self._lock = threading.Lock()
        self._calls: list[ApiCall] = []

    def __enter__(self) -> LabelledApi:
        self.fake.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.stop()

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    def _reply(self, body: dict[str, Any]) -> Reply:
        found = tuple(labels_in(last_user_text(body)))
        with self._lock:
            self._calls.append(ApiCall(len(self._calls), time.monotonic(), found))
        parts = ["answered", *(f" {lbl}" for lbl in found), " (end)"]
        return Chunked(parts, interval=self.stream_seconds / (len(parts) - 1))

    def calls(self) -> list[ApiCall]:
        with self._lock:
            return list(self._calls)


def write_home(
    tmp: Path,
    db_url: str,
    agents: Sequence[str],
    *,
    processor: Mapping[str, Any] | None = None,
    queue: Mapping[str, Any] | None = None,
) -> Path:
    """A home whose settings name only the database and the claude agents (everything else default, but for
    warm sessions: on, as by default, and kept :data:`KEPT_SECONDS`, since a scenario ends when no CLI is left)."""
    claude = {name: {"provider": "claude"} for name in agents}
    processor = {"session_idle_seconds": KEPT_SECONDS, **(processor or {})}
    return build_home(tmp, db_url, claude, processor=processor, queue=queue, fast=False)


#: How long the crash scenarios keep a chat's claude CLI after a reply (the default keeps it five minutes).
KEPT_SECONDS = 3.0


def processor_env(api: LabelledApi | FakeAnthropic, tmp: Path, home: Path) -> dict[str, str]:
    """The environment of a processor process whose claude CLIs reach nothing but the fake."""
    user_home = tmp / "user-home"
    user_home.mkdir(exist_ok=True)
    env = claude_env(api.base_url, user_home, max_retries=0)
    env["PATH"] = os.environ.get("PATH", env["PATH"])
    env.update(
        {
            "AGENTPOST_HOME": str(home),
            "AGENTPOST_CLAUDE_BIN": str(claude_binary()),
            "AGENTPOST_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


class ProcessorProcess:
    """One ``agentpost run processor`` process of this checkout, output appended to ``log``."""

    def __init__(self, env: Mapping[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "shared.cli.main", "run", "processor"],
                cwd=REPO_ROOT,
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return int(self.popen.pid)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL, and reap it (so its pid is gone, not a zombie)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 40.0) -> int | None:
        """SIGTERM and wait (the processor finishes or releases its runs); SIGKILL past ``timeout``."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        return self.popen.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _process_table() -> dict[int, int]:
    """pid → parent pid of every live (non-zombie) process."""
    table: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            table[int(entry.name)] = int(fields[1])
    return table


def descendants(root: int) -> list[int]:
    """Live descendants of ``root``."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _process_table().items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _is_claude(pid: int) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    return Path(argv0).name.startswith("claude") or Path(exe).name.startswith("claude")


def cli_pids(processor_pid: int) -> list[int]:
    """The claude CLI processes running under a processor (child or grandchild)."""
    return [pid for pid in descendants(processor_pid) if _is_claude(pid)]


def worker_pid(worker: str | None) -> int | None:
    """The pid in a worker id (``host:pid:…``)."""
    parts = (worker or "").split(":")
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


def message_rows(db: Database) -> dict[str, dict[str, Any]]:
    """Every message by its label."""
    rows = db.read(
        "SELECT message_id, message, status, retry_count, last_error, claimed_by, conversation FROM messages"
    )
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        found = labels_in(str(row["message"]))
        assert len(found) == 1, row
        out[found[0]] = dict(row)
    return out


@dataclass
class Kill:
    """One SIGKILL that landed during a run."""

    number: int
    processor: int  # index into the processor list
    pid: int
    chat: int
    labels: tuple[str, ...]
    cli: list[int]


@dataclass
class KillLog:
    landed: list[Kill] = field(default_factory=list)
    missed: int = 0  # kills whose run completed between the look and the kill (not counted)
    gave_up: str = ""  # why the rounds stopped before enough kills landed


def kill_during_runs(
    db: Database,
    api: LabelledApi,
    processors: list[ProcessorProcess],
    restart: Callable[[int], ProcessorProcess],
    *,
    kills: int,
    max_per_chat: int = 1,
    round_timeout: float = 75.0,
    takeover_timeout: float = 0.0,
    after_kill: Callable[[Kill], None] | None = None,
) -> KillLog:
    """SIGKILL processors ``kills`` times, each time during a run, and restart each one at once.

    A round targets the processor after the one killed last (another one only when the target holds no
    claims for ``3 s``). It waits for a main request the fake received less than half a stream ago
    whose chat has been interrupted fewer than ``max_per_chat`` times (so no message can use up an
    interruption budget here), whose messages are ``processing`` under the target's pid, while a claude CLI
    runs under the target; then kills the target. The kill counts when none of that run's messages had
    completed by then. Rounds stop early when a round finds nothing to kill within ``round_timeout``.

    With ``takeover_timeout`` (several processors), the killed one is restarted only once another processor
    has taken work over (a message ``processing`` under its pid), or nothing is left, or that time passed:
    the survivor has to notice the death and take the claims back itself.
    """
    killed_chats: dict[int, int] = {}
    log = KillLog()
    last = -1
    while len(log.landed) < kills:
        want = (last + 1) % len(processors)
        deadline = time.monotonic() + round_timeout
        idle_since: float | None = None
        chosen: tuple[int, ApiCall, list[int]] | None = None
        while chosen is None:
            if time.monotonic() > deadline:
                log.gave_up = f"round {len(log.landed) + 1}: no run to kill within {round_timeout:g} s"
                return log
            rows = message_rows(db)
            if rows and all(r["status"] in ("completed", "dead") for r in rows.values()):
                log.gave_up = f"round {len(log.landed) + 1}: every message had finished"
                return log
            holders = {worker_pid(r["claimed_by"]) for r in rows.values() if r["status"] == "processing"}
            target_idle = processors[want].pid not in holders
            now = time.monotonic()
            idle_since = (idle_since or now) if target_idle else None
            allowed = {want} if idle_since is None or now - idle_since < 3.0 else set(range(len(processors)))
            for call in reversed(api.calls()):
                if now - call.at > api.stream_seconds / 2 or not call.labels or len(call.chats) != 1:
                    continue
                (chat,) = call.chats
                if killed_chats.get(chat, 0) >= max_per_chat:
                    continue
                states = [rows.get(lbl) for lbl in call.labels]
                if any(s is None or s["status"] != "processing" for s in states):
                    continue
                pids = {worker_pid(s["claimed_by"]) for s in states if s is not None}
                for index in allowed:
                    if pids == {processors[index].pid}:
                        clis = cli_pids(processors[index].pid)
                        if clis:
                            chosen = (index, call, clis)
                            break
                if chosen is not None:
                    break
            if chosen is None:
                time.sleep(0.02)
        index, call, clis = chosen
        victim = processors[index]
        victim.kill9()
        rows = message_rows(db)
        if any(rows[lbl]["status"] == "completed" for lbl in call.labels):
            log.missed += 1
        else:
            (chat,) = call.chats
            killed_chats[chat] = killed_chats.get(chat, 0) + 1
            kill = Kill(len(log.landed) + 1, index, victim.pid, chat, call.labels, clis)
            log.landed.append(kill)
            if after_kill is not None:
                after_kill(kill)
        last = index
        if takeover_timeout > 0 and len(processors) > 1:
            others = {p.pid for i, p in enumerate(processors) if i != index}
            until = time.monotonic() + takeover_timeout
            while not _taken_over(db, others) and time.monotonic() < until:
                time.sleep(0.05)
        processors[index] = restart(index)
    return log


def _taken_over(db: Database, pids: set[int]) -> bool:
    """Whether one of ``pids`` holds a message now, or no message is left open."""
    open_rows = [r for r in message_rows(db).values() if r["status"] in ("pending", "processing")]
    return not open_rows or any(
        r["status"] == "processing" and worker_pid(r["claimed_by"]) in pids for r in open_rows
    )


@dataclass
class Tally:
    """The end state, per message."""

    total: int
    completed: int
    dead: int
    duplicate_finals: int  # messages covered by more than one final reply
    lost: int  # neither dead nor completed with a final reply
    dead_never_run: int  # dead messages no request to the API ever carried
    finals: int
    mismatched_finals: int  # final replies whose text does not name every message they are recorded for
    retry_counts: dict[int, int]
    details: dict[str, list[str]]

    def line(self) -> str:
        return (
            f"messages={self.total} completed={self.completed} dead={self.dead} "
            f"duplicate_finals={self.duplicate_finals} lost={self.lost} dead_never_run={self.dead_never_run} "
            f"final_replies={self.finals} mismatched_finals={self.mismatched_finals} "
            f"retry_counts={dict(sorted(self.retry_counts.items()))}"
        )


def tally(db: Database, api: LabelledApi) -> Tally:
    """Count, per message, how it ended; a final reply covers the messages its ``response_ready`` event
    names (and its own ``message_id``)."""
    rows = message_rows(db)
    by_id = {str(r["message_id"]): lbl for lbl, r in rows.items()}
    ready = {
        int(p["response_id"]): [str(m) for m in p.get("message_ids") or []]
        for p in (
            json.loads(r["payload"])
            for r in db.read("SELECT payload FROM events WHERE type = 'response_ready'")
        )
        if "response_id" in p
    }
    covered: dict[str, int] = {lbl: 0 for lbl in rows}
    finals = 0
    mismatched: list[str] = []
    for response in db.read("SELECT id, message_id, message, metadata FROM responses ORDER BY id"):
        if json.loads(response["metadata"] or "{}").get("kind") != "final":
            continue
        finals += 1
        ids = set(ready.get(int(response["id"]), [])) | {str(response["message_id"])}
        mine = {by_id[m] for m in ids if m in by_id}
        for lbl in mine:
            covered[lbl] += 1
        if not mine <= set(labels_in(str(response["message"]))):
            mismatched.append(f"response {response['id']}: {sorted(mine)} vs {response['message']!r}")
    ran = {lbl for call in api.calls() for lbl in call.labels}
    status = {lbl: str(r["status"]) for lbl, r in rows.items()}
    dead = sorted(lbl for lbl, s in status.items() if s == "dead")
    completed = sorted(lbl for lbl, s in status.items() if s == "completed")
    dupes = sorted(lbl for lbl, n in covered.items() if n > 1)
    lost = sorted(
        lbl for lbl in rows if status[lbl] != "dead" and not (status[lbl] == "completed" and covered[lbl])
    )
    retry_counts: dict[int, int] = {}
    for r in rows.values():
        retry_counts[int(r["retry_count"])] = retry_counts.get(int(r["retry_count"]), 0) + 1
    return Tally(
        total=len(rows),
        completed=len(completed),
        dead=len(dead),
        duplicate_finals=len(dupes),
        lost=len(lost),
        dead_never_run=len([lbl for lbl in dead if lbl not in ran]),
        finals=finals,
        mismatched_finals=len(mismatched),
        retry_counts=retry_counts,
        details={"dead": dead, "duplicates": dupes, "lost": lost, "mismatched": mismatched},
    )
