"""Warm claude sessions: a chat's CLI process kept running after its run, fed the chat's next message.

A cold run starts ``claude -p`` for every message: 0.5-0.7 s of CLI start before the API request, more on a
busy box. With ``[processor] session_idle_seconds`` above 0 the claude provider starts the CLI with
``--input-format stream-json`` instead, writes the prompt as one stream-json user message, reads until that
turn's ``result`` line, and hands the still-running process back to the :class:`WarmPool`; the chat's next
message is written to the same process (one turn each) as long as it fits.

What the cold path guarantees holds, and how:

- **Launch**: the same argv plus ``--input-format stream-json``, started through
  :func:`workers.providers.base.launch_plan` — the same sandbox, allowlisted environment and orphan guard
  (:mod:`workers.launch`): a ``kill -9`` of the processor kills every warm process with it.
- **One run at a time per agent**: a process is taken out of the pool for a turn and put back after it,
  keyed by (agent, chat or the agent's session scope); the agent lease makes sure only one run of the agent
  is going on, so a process is never used by two turns.
- **The session advances only on success**: a turn that succeeded records ``<session>@<uuid>`` — the CLI's
  session and the uuid of that turn's last assistant message. A cold start resumes it with
  ``--resume <session> --resume-session-at <uuid> --fork-session``, so whatever a later turn left in the
  same session file (a refused request, a turn cut off by a crash or a ``/stop``) is not part of the
  conversation the next run continues. A failed, refused, stopped or timed-out turn kills the process; the
  next message starts cold from the last good point.
- **Reuse only when nothing changed**: a process is reused when the chat's recorded session is the one it
  ended its last turn on, and its argv (model, system prompt, permissions, readable folders), environment,
  workspace, sandbox and the agent's settings are the same as a fresh start would have. Anything else (a
  settings edit, ``/new``, another host ran the chat) closes it and starts cold.
- **Limits per turn**: the agent's ``timeout_seconds`` and ``idle_timeout_seconds`` count from the turn's
  start; a ``/stop``, an interrupt, a lost lease or a shutdown cancels the turn and kills the process.
- **Crash accounting**: unchanged — the run's start is written before its prompt reaches the process.

Idle processes exit after ``session_idle_seconds`` (:meth:`WarmPool.reap`, called by the processor loop,
which wakes for :meth:`WarmPool.next_expiry`); at most ``warm_sessions_per_agent`` per agent and
``warm_sessions_total`` in all are kept, the least recently used closed first. Only the claude provider has
a warm mode: codex and command agents start a process per run.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import Process, TaskGroup

from shared.settings.sections import ProcessorSettings
from workers.limits import Hold
from workers.output_bounds import Line, Lines, LongPart
from workers.prompt_images import user_content
from workers.providers.base import (
    CliProvider,
    ProgressFn,
    RunRequest,
    RunResult,
    RunUsage,
    StreamState,
    _drain,
    _stopped_error,
    _watchdog,
    kill_group,
    start_cli,
)
from workers.providers.permissions import ToolAsk, ToolDecision, control_response
from workers.steer import SteerInbox, echoed_count

log = logging.getLogger("agentpost.processor")

#: (agent, session key): the chat, or the agent's own scope (``session_scope = "agent"``).
WarmKey = tuple[str, str]
#: Set per run by the processor, so it differs every run and says nothing about reusability.
_PER_RUN_ENV = ("AGENTPOST_MESSAGE_ID",)


def session_ref(session_id: str, message_uuid: str | None) -> str:
    """What a warm turn records as the chat's session: the CLI's session and the point to resume at."""
    return f"{session_id}@{message_uuid}" if message_uuid else session_id


def split_session_ref(ref: str) -> tuple[str, str | None]:
    """``(session id, resume-at message uuid or None)`` of a recorded session (see :func:`session_ref`)."""
    session, _, at = ref.partition("@")
    return session, at or None


def fingerprint(request: RunRequest, argv: list[str]) -> str:
    """What must be equal for a kept process to take ``request``: argv without the resume arguments (the
    conversation is checked on its own), the environment without per-run values, the workspace, the
    sandbox and the agent's settings."""
    kept: list[str] = []
    skip = 0
    for arg in argv:
        if skip:
            skip -= 1
        elif arg in ("--resume", "--resume-session-at"):
            skip = 1
        elif arg != "--fork-session":
            kept.append(arg)
    env = sorted((k, v) for k, v in request.env.items() if k not in _PER_RUN_ENV)
    parts = [kept, env, str(request.workspace), repr(request.sandbox), request.settings.model_dump_json()]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


@dataclass
class WarmProcess:
    """One kept CLI process and what it holds."""

    key: WarmKey
    process: Process
    fingerprint: str
    #: The recorded session (:func:`session_ref`) its last good turn ended on; None before its first.
    session: str | None = None
    last_used: float = field(default_factory=time.monotonic)
    lines: Lines = field(default_factory=Lines)  # splits stdout, holding no line longer than it bounds
    ready: collections.deque[Line | LongPart] = field(default_factory=collections.deque)  # read, not handled
    hold: Hold | None = None  # its limits (workers/limits.py): one cgroup for the process's whole life
    #: One line at a time on stdin: a steered message and the answer to a permission prompt never interleave.
    write_lock: anyio.Lock = field(default_factory=anyio.Lock)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.returncode is None

    async def close(self) -> None:
        """Kill the process group and reap it; shielded, so a cancelled caller still cleans up."""
        with anyio.CancelScope(shield=True):
            kill_group(self.process.pid, signal.SIGKILL)
            with anyio.move_on_after(2):
                await self.process.wait()
            with contextlib.suppress(Exception):
                await self.process.aclose()
            if self.hold is not None:
                await self.hold.release_async()


#: What one kept claude process holds in memory (measured by bench/warm_sessions.py: about 210 MiB).
KEPT_PROCESS_BYTES = 210 * 1024 * 1024
#: Kept processes may use at most this share of the memory available when one is kept.
MEMORY_SHARE = 0.25
#: Never more than this many by the memory rule alone (an operator may set more).
MEMORY_CAP_MAX = 32
#: How many chats' reasons for a closed process the pool remembers (and the presence row carries).
CLOSED_KEPT = 64


def available_memory() -> int | None:
    """The kernel's estimate of memory available without swapping (``MemAvailable``), in bytes."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_cap(kept: int, available: int | None) -> int:
    """How many processes may be kept in all, by memory: those kept now (their memory is already not
    available) plus as many more as ``MEMORY_SHARE`` of ``available`` holds. Without a reading: 4."""
    if available is None:
        return 4
    more = int(available * MEMORY_SHARE) // KEPT_PROCESS_BYTES
    return min(MEMORY_CAP_MAX, kept + more)


class WarmPool:
    """The warm processes of one processor (see the module docstring). ``config`` gives the ``[processor]``
    section in force."""

    def __init__(self, config: Callable[[], ProcessorSettings]) -> None:
        self.config = config
        self._idle: dict[WarmKey, WarmProcess] = {}
        self.started = 0  # processes started (a cold turn)
        self.reused = 0  # turns written to a kept process
        #: Why the last process was not kept, when memory was too short ("" otherwise).
        self.not_kept = ""
        #: Why a chat's process was closed last (idle, a cap, short memory, a failed turn), for ``/status``
        #: through the processor's presence row; a chat's entry goes when it is kept again.
        self.closed_why: dict[WarmKey, str] = {}

    @property
    def enabled(self) -> bool:
        return self.config().session_idle_seconds > 0

    def slot(self, agent: str, session_key: str) -> WarmSlot:
        """The turns of one chat (or the agent's scope) of ``agent``."""
        return WarmSlot(self, (agent, session_key))

    def pids(self) -> list[int]:
        """The pids (process groups) of the idle processes kept now."""
        return [p.pid for p in self._idle.values()]

    def take(self, key: WarmKey) -> WarmProcess | None:
        return self._idle.pop(key, None)

    async def put(self, warm: WarmProcess) -> None:
        """Keep ``warm`` for its chat's next message; close the least recently used past the caps."""
        warm.last_used = time.monotonic()
        config = self.config()
        total = config.warm_sessions_total
        if total is None:
            available = available_memory()
            total = memory_cap(len(self._idle), available)
            if total <= len(self._idle) and not self._idle:
                # Not even one fits in a quarter of what is left: this host needs its memory elsewhere.
                self.not_kept = (
                    f"not kept: {available // 2**20 if available else '?'} MiB available, a kept process needs "
                    f"about {KEPT_PROCESS_BYTES // 2**20} MiB"
                )
                log.info("chat %s of agent %s: %s", warm.key[1], warm.key[0], self.not_kept)
                self.note_closed(warm.key, self.not_kept)
                await warm.close()
                return
            total = max(total, 1)
        self._idle[warm.key] = warm
        self.closed_why.pop(warm.key, None)
        by_age = sorted(self._idle.values(), key=lambda p: p.last_used)
        agent_count = sum(1 for p in by_age if p.key[0] == warm.key[0])
        for old in by_age:
            over_agent = old.key[0] == warm.key[0] and agent_count > config.warm_sessions_per_agent
            if old is warm or not (over_agent or len(self._idle) > total):
                continue
            self._idle.pop(old.key, None)
            agent_count -= old.key[0] == warm.key[0]
            self.note_closed(
                old.key,
                f"closed for a more recent chat (at most {config.warm_sessions_per_agent} kept per agent)"
                if over_agent
                else f"closed for a more recent chat (at most {total} kept in all)",
            )
            await old.close()

    def next_expiry(self) -> float | None:
        """Seconds until the next idle process is due to exit (None: none kept)."""
        if not self._idle:
            return None
        idle = self.config().session_idle_seconds
        oldest = min(p.last_used for p in self._idle.values())
        return max(0.0, oldest + idle - time.monotonic())

    async def reap(self) -> None:
        """Close the processes idle for ``session_idle_seconds`` (all of them when it is 0) and the dead."""
        idle = self.config().session_idle_seconds
        now = time.monotonic()
        for key, warm in list(self._idle.items()):
            if idle <= 0 or now - warm.last_used >= idle or not warm.alive():
                self._idle.pop(key, None)
                if idle > 0:
                    self.note_closed(
                        key, "exited on its own" if not warm.alive() else f"idle for {idle:g} s, closed"
                    )
                await warm.close()

    def note_closed(self, key: WarmKey, why: str) -> None:
        """Remember why ``key``'s process is gone (the most recent :data:`CLOSED_KEPT` chats)."""
        self.closed_why.pop(key, None)
        self.closed_why[key] = why
        while len(self.closed_why) > CLOSED_KEPT:  # the oldest reasons go first (dicts keep their order)
            del self.closed_why[next(iter(self.closed_why))]

    def snapshot(self) -> dict[str, object]:
        """What is kept now and why recent chats' processes were not, for the processor's presence row
        (:mod:`shared.queue.presence`): ``kept`` as ``[agent, chat key]`` pairs, ``closed`` as
        ``[agent, chat key, why]``."""
        return {
            "kept": sorted([agent, key] for agent, key in self._idle),
            "closed": [[agent, key, why] for (agent, key), why in self.closed_why.items()],
        }

    async def close_agent(self, agent: str) -> None:
        for key in [k for k in self._idle if k[0] == agent]:
            await self._idle.pop(key).close()

    async def close_all(self) -> None:
        for key in list(self._idle):
            await self._idle.pop(key).close()


@dataclass
class WarmSlot:
    """:class:`workers.providers.base.WarmTurns` for one chat: takes its kept process (or starts one), runs
    the turn, and gives it back only when the turn succeeded."""

    pool: WarmPool
    key: WarmKey

    async def turn(
        self, provider: CliProvider, request: RunRequest, argv: list[str], progress: ProgressFn
    ) -> RunResult:
        started = time.monotonic()
        wanted = fingerprint(request, argv)
        warm = self.pool.take(self.key)
        if warm is not None and (
            not warm.alive() or warm.fingerprint != wanted or warm.session != request.session_id
        ):
            await warm.close()
            warm = None
        if warm is None:
            began = await start_cli(request, argv, stdin=subprocess.PIPE, service=provider.service)
            if isinstance(began, RunResult):
                return began
            process, hold = began
            warm = WarmProcess(self.key, process, wanted, hold=hold)
            self.pool.started += 1
        else:
            self.pool.reused += 1
        if request.on_spawn is not None:
            request.on_spawn(warm.pid)
        if warm.hold is not None:
            warm.hold.mark()  # a limit hit in an earlier (successful) turn is not this turn's
        try:
            result, last_uuid = await _one_turn(provider, warm, request, progress, started)
        except BaseException:
            await warm.close()  # a /stop, an interrupt, a lost lease, a shutdown: the turn ends here
            raise
        result.pid = warm.pid
        result.argv = argv
        result.service = provider.service
        result.duration_ms = max(0, int((time.monotonic() - started) * 1000) - result.waited_ms)
        if result.ok and result.session_id and warm.alive():
            result.session_id = session_ref(result.session_id, last_uuid)
            warm.session = result.session_id
            if self.pool.enabled:
                await self.pool.put(warm)
            else:  # a steer run with warm sessions off: the stream-json input was for this run only
                await warm.close()
        else:
            # Failed, refused or timed out: the process's conversation now holds the bad turn. Nothing of
            # it is recorded, and the next message starts cold from the last good point.
            if self.pool.enabled:
                self.pool.note_closed(self.key, "closed after a reply that did not succeed")
            await warm.close()
            if result.session_id and not result.ok:
                result.session_id = None
        return result


async def _one_turn(
    provider: CliProvider, warm: WarmProcess, request: RunRequest, progress: ProgressFn, started: float
) -> tuple[RunResult, str | None]:
    """Write the prompt, read until the turn's ``result`` line (or the process's end, or a limit); the files
    the turn's output went to are let go, but the reply's (``RunResult.whole``)."""
    state = StreamState(last_output=time.monotonic(), spool_dir=request.spool_dir)
    try:
        result, uuid = await _turn_in(provider, warm, request, progress, started, state)
    except BaseException:
        state.release()
        raise
    state.release(keep=result.whole)
    return result, uuid


async def _turn_in(
    provider: CliProvider,
    warm: WarmProcess,
    request: RunRequest,
    progress: ProgressFn,
    started: float,
    state: StreamState,
) -> tuple[RunResult, str | None]:
    process = warm.process
    assert process.stdin is not None and process.stdout is not None
    stderr_tail = bytearray()
    stopped_by: list[str] = []
    ended: list[str | None] = []  # [last assistant uuid] once the result line was read
    with anyio.CancelScope() as scope:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_watchdog, request, state, scope, started, stopped_by)
                tg.start_soon(_drain, process.stderr, stderr_tail, anyio.Event(), state)
                await _write_user_message(warm, user_content(request.prompt, request.images))
                if request.steer is not None:
                    tg.start_soon(_feed, warm, request.steer)
                await _read_until_result(provider, warm, state, progress, request, ended, tg)
                tg.cancel_scope.cancel()
        finally:
            if request.steer is not None:
                request.steer.close()
    if scope.cancelled_caught:
        why = stopped_by[0] if stopped_by else "ceiling"
        return RunResult(ok=False, timed_out=True, error=_stopped_error(request, why), stopped_by=why), None
    stderr = stderr_tail.decode(errors="replace")
    if not ended:
        with anyio.move_on_after(2):
            await process.wait()
        code = process.returncode if process.returncode is not None else 1
        result = provider.finish(state, code, stderr)
        result.exit_code = code
        if warm.hold is not None and not result.ok:
            warm.hold.judge(result, code, stderr)
    else:
        result = provider.finish(state, 0, stderr)
    result.session_id = state.session_id
    result.usage = state.usage
    result.waited_ms = int(state.waited * 1000)
    return result, ended[0] if ended else None


async def _write_user_message(warm: WarmProcess, content: str | list[dict[str, Any]]) -> None:
    """Write ``content`` (a text, or content blocks: images and text) to the CLI as one stream-json user
    message."""
    message = {"type": "user", "message": {"role": "user", "content": content}}
    await _write_line(warm, (json.dumps(message) + "\n").encode())


async def _write_line(warm: WarmProcess, line: bytes) -> None:
    """Write one whole line to the CLI's stdin."""
    assert warm.process.stdin is not None
    # A process that exited cannot take it: reading then finds the end of its output.
    async with warm.write_lock:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await warm.process.stdin.send(line)


async def _feed(warm: WarmProcess, inbox: SteerInbox) -> None:
    """Write each message steered into the run to the CLI as it arrives (until the turn's reader ends)."""
    while True:
        await _write_user_message(warm, await inbox.take())


async def _answer(warm: WarmProcess, request: RunRequest, state: StreamState, ask: ToolAsk) -> None:
    """Ask a person about one tool use (``RunRequest.ask``) and write the answer to the CLI. The run's limits
    do not count the wait; a turn that ends first (a /stop) cancels the question."""
    state.begin_wait()
    try:
        if request.ask is None:
            decision = ToolDecision(False, "No one can be asked to allow this here, so it was not run.")
        else:
            decision = await request.ask(ask)
    finally:
        state.end_wait()
    await _write_line(warm, control_response(ask, decision))


async def _read_until_result(
    provider: CliProvider,
    warm: WarmProcess,
    state: StreamState,
    progress: ProgressFn,
    request: RunRequest,
    ended: list[str | None],
    tg: TaskGroup,
) -> None:
    """Hand each stdout line to the provider (a permission prompt to a task of ``tg`` that asks a person,
    so the output goes on being read meanwhile); stop after the run's last ``result`` line (noting the uuid of
    its last assistant message in ``ended``) or at the end of output.

    Without steered messages that is the first ``result``. With them (``request.steer``), it is the first
    ``result`` after the CLI echoed every message written to it: a message taken mid-turn is answered by
    that turn's result, one taken after it by a turn of its own; the answers of all turns make the run's
    text, in order, and their usage is added up (see :mod:`workers.steer`)."""
    assert warm.process.stdout is not None
    last_uuid: str | None = None
    echoed = 0  # user messages the CLI took in (its --replay-user-messages echo): the prompt, then steered
    answers: list[str] = []
    usages: list[RunUsage] = []
    shown = request  # what the provider tells of the text being written (see _after_answers)
    while True:
        if not warm.ready:
            try:
                chunk = await warm.process.stdout.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            state.last_output = time.monotonic()
            warm.ready.extend(warm.lines.feed(chunk))
            continue
        line = await provider.take(warm.ready.popleft(), state, progress, shown)
        while state.asks:
            tg.start_soon(_answer, warm, request, state, state.asks.pop(0))
        if line is None:  # a part of a long line
            continue
        kind, uuid, replay, echo = _kind(line)
        if kind == "assistant" and uuid:
            last_uuid = uuid
        elif kind == "user" and replay:
            written = [request.prompt, *(request.steer.written if request.steer is not None else [])]
            echoed += echoed_count(echo, written[echoed:])
        if kind != "result":
            continue
        if state.final_text:
            answers.append(state.final_text.strip())
        if state.usage is not None:
            usages.append(state.usage)
        steer = request.steer
        if state.error is not None or steer is None or steer.settle(echoed - 1):
            if len(answers) > 1 or len(usages) > 1:
                state.final_text = "\n\n".join(a for a in answers if a)
                if state.final_whole is not None:  # several answers: their starts make the reply
                    state.final_whole.close()
                    state.final_whole = None
                state.usage = _added(usages)
            ended.append(last_uuid)
            return
        state.final_text = None  # the next turn's result answers the messages steered in since
        shown = _after_answers(request, answers)


def _after_answers(request: RunRequest, answers: list[str]) -> RunRequest:
    """``request`` whose live preview of a later turn starts with the earlier turns' answers: the final
    reply holds them all, so the preview never shows less of it than it already did."""
    tell = request.on_partial
    if tell is None:
        return request
    done = "\n\n".join(a for a in answers if a)

    def partial(text: str) -> None:
        tell(f"{done}\n\n{text}" if done else text)

    return dataclasses.replace(request, on_partial=partial)


def _added(usages: list[RunUsage]) -> RunUsage | None:
    """The usage of a run of several turns: tokens and cost added up, the model of the costliest turn."""
    if not usages:
        return None
    costliest = max(usages, key=lambda u: u.cost_usd)
    return RunUsage(
        input_tokens=sum(u.input_tokens for u in usages),
        output_tokens=sum(u.output_tokens for u in usages),
        cache_read_tokens=sum(u.cache_read_tokens for u in usages),
        cache_write_tokens=sum(u.cache_write_tokens for u in usages),
        cost_usd=sum(u.cost_usd for u in usages),
        model=costliest.model,
    )


def _kind(line: str) -> tuple[str, str | None, bool, str]:
    """The ``type`` and ``uuid`` of one stream-json line, whether it is the CLI's echo of a user message it
    took in, and that message's text (``("", None, False, "")`` for anything else)."""
    if not line.startswith("{"):
        return "", None, False, ""
    try:
        event = json.loads(line)
    except ValueError:
        return "", None, False, ""
    if not isinstance(event, dict):
        return "", None, False, ""
    uuid = event.get("uuid")
    replay = event.get("isReplay") is True
    return (
        str(event.get("type") or ""),
        uuid if isinstance(uuid, str) else None,
        replay,
        _message_text(event) if replay else "",
    )


def _message_text(event: dict[str, object]) -> str:
    """The text of a user message event (a string, or text blocks joined by newlines)."""
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""
