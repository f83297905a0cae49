"""Agent providers: how one agent CLI is started, what its output means, and when a run has failed.

One small interface, :class:`AgentProvider`, the subprocess runner they share (:class:`CliProvider`), and
three implementations, a module each (:mod:`workers.providers.claude`, ``.codex``, ``.command``):

- ``claude``: ``claude -p --output-format stream-json --verbose [-c | --resume ID] [--model M]
  [--fallback-model F] [--append-system-prompt S] [--permission-mode P]`` in the agent's workspace. The
  prompt goes on stdin, not in argv: a message that starts with ``-`` can then never be read as an option,
  and a 200 k-character message stays clear of the kernel's per-argument limit.
- ``codex``: ``codex exec --json [resume ID] -`` (prompt on stdin); JSONL events.
- ``command``: any other CLI from an argv template (``{prompt}``, ``{workspace}``, ``{agent}``,
  ``{session}``, ``{model}``); without ``{prompt}`` the prompt goes on stdin. Its stdout is the reply.

Never a shell: argv lists only. Every run gets its own session and process group (so a timeout or a
shutdown kills the CLI *and* everything it started) and is launched through :mod:`workers.launch`, which
makes the CLI die with the processor, so a crashed processor leaves no agent running behind its lease.
A run fails on a non-zero exit, a timeout or a reported error; an error is never returned as a reply.

Some things the person waiting should hear while the run goes on, not only after it: Claude Code retries a
failed API call inside one run for minutes (an overloaded or rate-limited API, a refused connection), and says
so in ``system``/``api_retry`` lines. A provider turns such a line into a plain-words notice for the chat and
hands it to ``RunRequest.on_notice`` as soon as it is read.

What a run prints costs bounded memory however much it is (:mod:`workers.output_bounds`): a line is held
whole only up to ``LINE_KEEP`` bytes, a longer one is read in parts (a JSON line made short, its reply
string kept whole in a file); the reply is held in memory up to ``TEXT_KEEP`` characters and in an unnamed
file beyond (``RunResult.whole``); the live preview gets the first ``PREVIEW_KEEP`` characters; stderr keeps
its last 8,000 bytes.

Liveness is judged by output: any bytes on stdout or stderr count (Claude runs with
``--include-partial-messages``, so a streaming reply prints a line per delta). A run silent for
``RunRequest.idle_timeout`` seconds is killed (``stopped_by = "idle"``); ``RunRequest.timeout`` is the
ceiling for the whole run however busy it is (``stopped_by = "ceiling"``).
"""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio
from anyio.abc import ByteReceiveStream, Process

from shared.settings.model import AgentSettings
from workers.limits import Hold, LimitHit, hold_limits
from workers.output_bounds import CutString, Line, Lines, LongJsonLine, LongPart, PartialText, TextSpool
from workers.prompt_images import PromptImage
from workers.providers.permissions import AskFn, ToolAsk
from workers.sandbox import Sandboxed, SandboxError
from workers.steer import SteerInbox

#: Called with each piece of assistant text as it streams out.
ProgressFn = Callable[[str], Awaitable[None]]
#: Called with a notice for the person waiting ("Anthropic's servers are overloaded; trying again…").
NoticeFn = Callable[[str], None]
#: Called with the whole text of the assistant message being streamed, each time it grew (a live preview).
PartialFn = Callable[[str], None]

_LAUNCHER = Path(__file__).parents[1] / "launch.py"  # workers/launch.py, next to this package
_REPO_ROOT = Path(__file__).resolve().parents[2]
_STDERR_KEEP = 8_000
_CANNOT_EXEC = 127  # the exit code of workers/launch.py when the CLI cannot be executed


class ProviderError(Exception):
    """A run could not even start (the CLI is missing, the template is broken)."""


@dataclass(frozen=True)
class RunRequest:
    """Everything one invocation needs."""

    agent: str
    settings: AgentSettings
    workspace: Path
    prompt: str
    system_prompt: str = ""
    # The recorded session to continue (None: start a fresh conversation). Claude resumes it as a fork
    # (a new session id), so a run that fails leaves the recorded conversation as it was.
    session_id: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # the child's whole environment
    timeout: float = 1800.0  # the ceiling of the whole run
    idle_timeout: float | None = None  # kill the run after this long without any output (None: never)
    orphan_guard: bool = True
    on_spawn: Callable[[int], None] | None = None  # told the CLI's pid (= its process group id)
    # Folders outside the workspace the agent may read (not write): the upload folder of the chat the run
    # answers, so the files a user sent (``[file: /abs/path]`` lines) can be opened. Claude gets a read
    # permission rule for each; codex's sandbox limits writes, not reads; a command template gets the
    # folder in ``$AGENTPOST_UPLOAD_DIR`` (set by the processor) and runs unsandboxed anyway.
    read_dirs: tuple[Path, ...] = ()
    on_notice: NoticeFn | None = None  # told each notice for the chat while the run goes on
    # Told the text of the assistant message being written, as it streams (claude's text deltas): the
    # whole text so far each time, starting again with each new message of the run. Must not block.
    on_partial: PartialFn | None = None
    # Where the CLI runs confined (workers/sandbox.py); None runs it with the processor's own rights.
    sandbox: Sandboxed | None = None
    # A warm session to run this turn in (claude_warm.py; claude only); None: a process per run.
    warm: WarmTurns | None = None
    # Messages of the same chat handed to this run while it goes on (the ``steer`` busy policy,
    # workers/steer.py); only a run in a warm session's stream-json input can take them.
    steer: SteerInbox | None = None
    # Images the chat sent, shown to the model beside the prompt (workers/prompt_images.py): claude only,
    # through its stream-json input, so a run with images always has ``warm`` set.
    images: tuple[PromptImage, ...] = ()
    # Where a reply too long to hold in memory is kept while the run goes on (an unnamed file: nothing is
    # left behind); None: the system's temporary folder.
    spool_dir: Path | None = None
    # Who answers the CLI's permission prompts (``permission_mode = "ask"``, claude only, in a stream-json
    # turn: workers/providers/permissions.py); None: nobody, the CLI decides by its permission mode.
    ask: AskFn | None = None


@dataclass
class RunUsage:
    """Tokens and cost of one run as its CLI reported them (claude's ``result`` line)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    model: str = ""


@dataclass
class RunResult:
    """What a run produced. ``ok`` is False for every kind of failure; ``text`` is then empty."""

    ok: bool
    text: str = ""
    error: str = ""
    session_id: str | None = None
    exit_code: int | None = None
    duration_ms: int = 0  # the run's working time: a wait for a person's answer is not counted
    waited_ms: int = 0  # how long the run waited for people to answer its permission prompts
    timed_out: bool = False
    rate_limited: bool = False  # a usage or rate limit (429): the agent waits until it resets
    overloaded: bool = False  # the AI service's servers are overloaded (529): not a limit of this account
    pid: int | None = None
    argv: list[str] = field(default_factory=list)
    stopped_by: str = ""  # "idle" or "ceiling" when the processor killed a run that did not end by itself
    status: int | None = None  # the HTTP status the AI service answered with, when the CLI reports it
    cannot_start: bool = False  # the CLI is missing or its command template is broken
    # The conversation to continue is not on this host (its CLI home: another host ran it, or it was removed).
    session_missing: bool = False
    # The conversation is here, but not the point a warm turn recorded to resume at (claude_warm.py):
    # its session file lost the line, e.g. a write a full disk refused.
    resume_point_missing: bool = False
    service: str = ""  # whose AI service the CLI talks to ("Anthropic"), for messages; "" when unknown
    usage: RunUsage | None = None  # tokens and cost as the CLI reported them; None when it reports none
    limit: LimitHit | None = None  # the agent's limit (memory, processes, disk) that stopped the run
    # The whole reply when it was too long to hold in memory (``text`` is then its start): the processor
    # attaches it to the reply and closes it (workers/run_outcome.py).
    whole: TextSpool | None = None

    def close(self) -> None:
        """Let go of the reply's file, if it has one."""
        if self.whole is not None:
            self.whole.close()


class WarmTurns(Protocol):
    """Where a provider that keeps its CLI running between runs sends a turn (:mod:`.claude_warm`)."""

    async def turn(
        self, provider: CliProvider, request: RunRequest, argv: list[str], progress: ProgressFn
    ) -> RunResult:
        """Run ``request`` as one turn of a kept CLI process (started from ``argv`` when none fits)."""
        ...


class AgentProvider(Protocol):
    """One kind of agent CLI."""

    name: str

    def argv(self, request: RunRequest) -> list[str]:
        """The argv of one run (raises :class:`ProviderError` when the CLI cannot be found)."""
        ...

    async def run(self, request: RunRequest, progress: ProgressFn) -> RunResult:
        """Run the CLI once; stream assistant text to ``progress``; never raise for a failed run."""
        ...


# -- locating binaries ---------------------------------------------------------------------------------
def find_binary(name: str, request: RunRequest, env_var: str) -> str:
    """Find a CLI: the agent's ``command[0]``, then ``$env_var``, then ``PATH``, then ``node_modules/.bin``
    of the project (and of the current folder). The error names every place that was looked at."""
    looked: list[str] = []
    if request.settings.command:
        candidate = request.settings.command[0]
        found = (
            shutil.which(candidate, path=request.env.get("PATH")) if os.sep not in candidate else candidate
        )
        if found and os.access(found, os.X_OK):
            return found
        raise ProviderError(
            f"agent {request.agent!r}: agents.{request.agent}.command[0] = {candidate!r} is not an executable"
        )
    looked.append(f"agents.{request.agent}.command (unset)")
    from_env = request.env.get(env_var) or os.environ.get(env_var)
    if from_env:
        if os.access(from_env, os.X_OK):
            return from_env
        raise ProviderError(f"{env_var}={from_env!r} is not an executable file")
    looked.append(f"${env_var} (unset)")
    on_path = shutil.which(name, path=request.env.get("PATH", os.environ.get("PATH")))
    if on_path:
        return on_path
    looked.append("PATH")
    for root in (_REPO_ROOT, Path.cwd()):
        candidate_path = root / "node_modules" / ".bin" / name
        if os.access(candidate_path, os.X_OK):
            return str(candidate_path)
        looked.append(str(candidate_path))
    raise ProviderError(
        f"the {name!r} CLI was not found for agent {request.agent!r} (looked in: {', '.join(looked)}); "
        f"install it (for Claude Code: `npm ci` in {_REPO_ROOT}) or set {env_var}"
    )


# -- the shared subprocess runner ----------------------------------------------------------------------
@dataclass
class StreamState:
    """What a provider has learned from the output so far."""

    text: TextSpool = field(default_factory=TextSpool)  # the reply of a CLI whose output is the reply
    final_text: str | None = None
    final_whole: TextSpool | None = None  # the whole final text when it was cut from a long line
    error: str | None = None
    session_id: str | None = None
    rate_limited: bool = False
    overloaded: bool = False
    status: int | None = None
    session_missing: bool = False  # see RunResult.session_missing
    resume_point_missing: bool = False  # see RunResult.resume_point_missing
    notices: list[str] = field(default_factory=list)  # for RunRequest.on_notice, not yet handed over
    partial: PartialText = field(default_factory=PartialText)  # the assistant message being streamed
    partial_grew: bool = False  # ``partial`` changed since RunRequest.on_partial was last told
    usage: RunUsage | None = None
    last_output: float = 0.0  # time.monotonic() of the last byte the CLI wrote (stdout or stderr)
    spool_dir: Path | None = None  # see RunRequest.spool_dir
    newline: bool = True  # the line being handled ended with a newline (not so the output's last, maybe)
    long: LongJsonLine | None = None  # the long line being read, if any
    long_start: str = ""  # the start of that line (the command provider's progress)
    cuts: dict[str, CutString] = field(default_factory=dict)  # strings cut from the line being parsed
    asks: list[ToolAsk] = field(default_factory=list)  # permission prompts read, not yet handed on
    # Permission prompts waiting for a person now, and the seconds spent so in all: a run waiting for a
    # person is not idle, and the wait does not count against its ceiling (_watchdog).
    waiting: int = 0
    waited: float = 0.0
    wait_began: float = 0.0

    def begin_wait(self) -> None:
        """A permission prompt is handed to a person."""
        if self.waiting == 0:
            self.wait_began = time.monotonic()
        self.waiting += 1

    def end_wait(self) -> None:
        """A permission prompt was answered (or given up): the run's limits count again from now."""
        self.waiting -= 1
        if self.waiting == 0:
            now = time.monotonic()
            self.waited += now - self.wait_began
            self.last_output = now

    def __post_init__(self) -> None:
        self.text.folder = self.spool_dir

    def release(self, keep: TextSpool | None = None) -> None:
        """Let go of every file the run's output went to but ``keep`` (handed to the result)."""
        for spool in (self.text, self.final_whole, *(c.spool for c in self.cuts.values())):
            if spool is not None and spool is not keep:
                spool.close()
        if self.long is not None:
            self.long.close()


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a whole process group, ignoring one that is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _stopped_error(request: RunRequest, stopped_by: str) -> str:
    """Why the processor killed a run that did not end by itself (``stopped_by``: idle or ceiling)."""
    if stopped_by == "idle":
        return (
            f"no output for {request.idle_timeout:g} s (processor.idle_timeout_seconds); "
            "the CLI and its process group were killed"
        )
    return (
        f"timed out after {request.timeout:g} s (agents.{request.agent}.timeout_seconds); "
        "the CLI and its process group were killed"
    )


async def _reap(process: Process, *, timed_out: bool) -> None:
    """After a run, however it ended: make sure nothing of the CLI's process group survives, then close
    the process's pipes. Every wait is shielded, so a cancelled run is still cleaned up."""
    if process.returncode is None:
        # Cancelled from outside (shutdown, lost lease) or timed out: nothing of the run may survive.
        kill_group(process.pid, signal.SIGTERM)
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            await process.wait()
        kill_group(process.pid)
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            await process.wait()
    elif timed_out:
        kill_group(process.pid)
    with contextlib.suppress(Exception), anyio.CancelScope(shield=True):
        await process.aclose()


def launch_plan(
    request: RunRequest, argv: list[str], hold: Hold | None = None
) -> tuple[list[str], dict[str, str]]:
    """How ``argv`` is started for ``request``: inside its sandbox, under the orphan guard
    (:mod:`workers.launch`) and ``hold``'s limits, with the environment it gets; the workspace is created if
    missing. Raises :class:`ProviderError` when the sandbox cannot be prepared (a workspace agentpost may not
    hand over)."""
    launch = argv
    env = dict(request.env)
    if request.sandbox is not None:
        try:
            request.sandbox.prepare()
        except SandboxError as exc:
            raise ProviderError(str(exc)) from None
        env = request.sandbox.environment(env)
        launch = request.sandbox.wrap(argv, env, request.settings.command)
    limits = hold.launcher_options() if hold is not None else []
    if (request.orphan_guard or limits) and sys.platform.startswith("linux"):
        guard = [] if request.orphan_guard else ["--no-guard"]  # limits without the guard: exec in place
        launch = [sys.executable, "-I", "-S", str(_LAUNCHER), *limits, *guard, str(os.getpid()), *launch]
    request.workspace.mkdir(parents=True, exist_ok=True)
    return launch, env


async def start_cli(
    request: RunRequest, argv: list[str], *, stdin: int, service: str
) -> tuple[Process, Hold] | RunResult:
    """Start one CLI process for ``request`` (cold runs and warm sessions alike): its limits held, its
    launch planned (sandbox, environment, :mod:`workers.launch`), the process started in a session of its
    own. Returns the process and its limits' hold, or the result saying why it could not start (the hold
    released)."""
    hold = hold_limits(request.agent, request.settings.limits)
    try:
        launch, env = launch_plan(request, argv, hold)
    except BaseException as exc:
        await hold.release_async()
        if not isinstance(exc, ProviderError):
            raise
        return RunResult(ok=False, error=str(exc), argv=argv, cannot_start=True, service=service)
    try:
        # Shielded: a cancellation (a /stop, a shutdown) landing mid-spawn would otherwise leave a started
        # CLI nobody kills; the caller gets it at its next checkpoint, once it holds the process.
        with anyio.CancelScope(shield=True):
            process = await anyio.open_process(
                launch, stdin=stdin, cwd=str(request.workspace), env=env, start_new_session=True
            )
    except OSError as exc:
        await hold.release_async()
        error = f"cannot start {argv[0]}: {exc.strerror or exc}"
        return RunResult(ok=False, error=error, argv=argv, cannot_start=True, service=service)
    return process, hold


class CliProvider(abc.ABC):
    """Base of the subprocess providers: start, stream, time out, kill the group, judge the result."""

    name = "cli"
    service = ""  # whose AI service the CLI talks to, for RunResult.service
    stdin_prompt = True

    @abc.abstractmethod
    def argv(self, request: RunRequest) -> list[str]:
        """The CLI's argv for one run (never a shell string)."""

    @abc.abstractmethod
    def parse_line(self, line: str, state: StreamState) -> list[str]:
        """Update ``state`` from one stdout line; return assistant text to report as progress."""

    def finish(self, state: StreamState, exit_code: int, stderr: str) -> RunResult:
        """Judge a run that exited by itself."""
        if state.error is not None:
            return RunResult(
                ok=False,
                error=state.error,
                exit_code=exit_code,
                rate_limited=state.rate_limited,
                overloaded=state.overloaded,
                status=state.status,
                session_missing=state.session_missing,
                resume_point_missing=state.resume_point_missing,
            )
        if exit_code != 0:
            detail = stderr.strip().splitlines()[-1] if stderr.strip() else "no error output"
            return RunResult(
                ok=False,
                error=f"{self.name} exited with code {exit_code}: {detail}",
                exit_code=exit_code,
                # The orphan guard (workers/launch.py) could not exec the CLI: as missing as a failed spawn.
                cannot_start=exit_code == _CANNOT_EXEC and detail.startswith("cannot run "),
            )
        if state.final_text is not None:
            text, whole = state.final_text, state.final_whole
        else:
            text, whole = state.text.text(), state.text
        if whole is not None and whole.spilled:
            # Too long to hold: ``text`` is its start, the whole of it stays in its file for the attachment.
            return RunResult(ok=True, text=text.lstrip(), exit_code=exit_code, whole=whole)
        return RunResult(ok=True, text=text.strip(), exit_code=exit_code)

    async def run(self, request: RunRequest, progress: ProgressFn) -> RunResult:
        started = time.monotonic()
        try:
            argv = self.argv(request)
        except ProviderError as exc:
            return RunResult(ok=False, error=str(exc), cannot_start=True, service=self.service)
        stdin = subprocess.PIPE if self.stdin_prompt else subprocess.DEVNULL
        began = await start_cli(request, argv, stdin=stdin, service=self.service)
        if isinstance(began, RunResult):
            return began
        process, hold = began
        if request.on_spawn is not None:
            request.on_spawn(process.pid)
        state = StreamState(last_output=time.monotonic(), spool_dir=request.spool_dir)
        stderr_tail = bytearray()
        result: RunResult | None = None
        stopped_by: list[str] = []
        try:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._feed_stdin, process, request.prompt)
                    tg.start_soon(_watchdog, request, state, scope, started, stopped_by)
                    stdout_done, stderr_done = anyio.Event(), anyio.Event()
                    tg.start_soon(_drain, process.stderr, stderr_tail, stderr_done, state)

                    async def read() -> None:
                        await self._read_stdout(process, state, progress, request)
                        stdout_done.set()

                    tg.start_soon(read)
                    await process.wait()
                    # A background child may keep the pipes open after the CLI exited: read what is left
                    # for a moment, then stop listening instead of waiting for the timeout.
                    with anyio.move_on_after(2):
                        await stdout_done.wait()
                    with anyio.move_on_after(0.5):
                        await stderr_done.wait()
                    tg.cancel_scope.cancel()
            if scope.cancelled_caught:
                kill_group(process.pid)
                error = _stopped_error(request, stopped_by[0])
                result = RunResult(ok=False, timed_out=True, error=error, stopped_by=stopped_by[0])
            else:
                result = self.finish(
                    state, int(process.returncode or 0), stderr_tail.decode(errors="replace")
                )
        finally:
            state.release(keep=result.whole if result is not None else None)
            await _reap(process, timed_out=result is not None and result.timed_out)
            if result is not None and not result.ok:
                hold.judge(result, process.returncode, stderr_tail.decode(errors="replace"))
            await hold.release_async()
        result.session_id = result.session_id or state.session_id
        result.usage = result.usage or state.usage
        result.exit_code = process.returncode if result.exit_code is None else result.exit_code
        result.duration_ms = int((time.monotonic() - started) * 1000)
        result.pid = process.pid
        result.argv = argv
        result.service = self.service
        return result

    async def _feed_stdin(self, process: Process, prompt: str) -> None:
        if process.stdin is None:
            return
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.send(prompt.encode())
        with contextlib.suppress(Exception):
            await process.stdin.aclose()

    async def _read_stdout(
        self, process: Process, state: StreamState, progress: ProgressFn, request: RunRequest
    ) -> None:
        assert process.stdout is not None
        lines = Lines()
        while True:
            try:
                chunk = await process.stdout.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                break
            state.last_output = time.monotonic()
            for item in lines.feed(chunk):
                await self.take(item, state, progress, request)
        for item in lines.close():
            await self.take(item, state, progress, request)

    async def take(
        self, item: Line | LongPart, state: StreamState, progress: ProgressFn, request: RunRequest
    ) -> str | None:
        """Handle one line, or one part of a long line (see :mod:`workers.output_bounds`); returns the line
        handled (a long JSON line in its short form) or None (a part, or nothing a caller looks at)."""
        state.newline = item.newline
        if isinstance(item, Line):
            line = item.data.decode(errors="replace")
            await self._handle(line, state, progress, request)
            return line
        return await self._long_part(item, state, progress, request)

    #: The keys of a long JSON line whose long strings are kept whole (the reply): see LongJsonLine.
    spool_keys: frozenset[str] = frozenset()

    async def _long_part(
        self, part: LongPart, state: StreamState, progress: ProgressFn, request: RunRequest
    ) -> str | None:
        """A part of a line too long to hold: read as a JSON line made short (JSON-lines CLIs)."""
        if state.long is None:
            state.long = LongJsonLine(self.spool_keys, state.spool_dir)
        state.long.feed(part.data)
        if not part.end:
            return None
        long, state.long = state.long, None
        short = long.finish()
        if not short:
            return None
        state.cuts = long.cuts
        await self._handle(short, state, progress, request)
        return short

    async def _handle(self, line: str, state: StreamState, progress: ProgressFn, request: RunRequest) -> None:
        try:
            texts = self.parse_line(line, state)
        finally:
            for cut in state.cuts.values():  # what parse_line did not take of a long line's strings
                if cut.spool is not None:
                    cut.spool.close()
            state.cuts = {}
        for text in texts:
            if text.strip():
                await progress(text)
        notices, state.notices = state.notices, []
        if request.on_notice is not None:
            for notice in notices:
                request.on_notice(notice)
        if state.partial_grew:
            state.partial_grew = False
            if request.on_partial is not None:
                request.on_partial(state.partial.shown())


async def _watchdog(
    request: RunRequest, state: StreamState, scope: anyio.CancelScope, started: float, why: list[str]
) -> None:
    """Cancel ``scope`` at the run's ceiling, or once the CLI has been silent for ``idle_timeout``; the time
    spent waiting for a person to answer a permission prompt counts for neither."""
    while True:
        if state.waiting:
            await anyio.sleep(0.5)
            continue
        now = time.monotonic()
        ceiling = started + request.timeout + state.waited
        idle_at = state.last_output + request.idle_timeout if request.idle_timeout else float("inf")
        if now >= ceiling or now >= idle_at:
            why.append("ceiling" if now >= ceiling else "idle")
            scope.cancel()
            return
        await anyio.sleep(min(ceiling, idle_at) - now + 0.01)


async def _drain(
    stream: ByteReceiveStream | None, tail: bytearray, done: anyio.Event, state: StreamState | None = None
) -> None:
    # Read stderr continuously so a chatty CLI never blocks on a full pipe; keep only the end.
    try:
        while stream is not None:
            try:
                chunk = await stream.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            if state is not None:
                state.last_output = time.monotonic()
            tail += chunk
            if len(tail) > _STDERR_KEEP:
                del tail[: len(tail) - _STDERR_KEEP]
    finally:
        done.set()
