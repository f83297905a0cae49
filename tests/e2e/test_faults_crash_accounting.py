"""Crash accounting with real processes (issue 11): ``kill -9`` of the processor timed *during* claude runs,
again and again, must cost no message more than the runs it was really part of.

40 messages in 8 chats go in through the queue's enqueue path (with the chat channels' debounce, so a
chat's waiting messages collect into one run): 3 per chat before the processors start, 2 more per chat
after the third kill. The real ``agentpost run processor`` runs the real claude CLI against a fake API whose
replies stream for about 1.3 s and name the messages they answer. Six times, when the fake has just
received a run's request and that run's CLI is alive under the processor, the processor is SIGKILLed (each
time in another chat, so no message could exhaust an interruption budget) and restarted. Each kill
is confirmed from the database: that run's messages had not completed.

At the end (every message finished, processors stopped), per message: completed, dead, covered by more
than one final reply, lost. Wanted: 40 completed, 0 dead, 0 duplicate finals, 0 lost.

(a) SQLite, the default settings, one processor, restarted at once after each kill. (b) PostgreSQL, the
default settings, two processors sharing the one agent: each kill hits the processor running it, the
two in turn, and the killed one is restarted once the survivor has taken the work over. The lease is the
default 30 s: a processor that had to wait it out would spend most of the test waiting.

The counts are printed (``-s`` shows them) for the closing note's before/after figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.crash_support import (
    Kill,
    KillLog,
    LabelledApi,
    ProcessorProcess,
    Tally,
    cli_pids,
    kill_during_runs,
    label,
    message_rows,
    processor_env,
    tally,
    write_home,
)
from tests.fault_support import fresh_pg_database
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.processor_support import open_home

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]

CHATS = 8
FIRST_WAVE = (0, 1, 2)  # message numbers per chat queued before the processors start
SECOND_WAVE = (3, 4)  # queued after the third kill
KILLS = 6
SECOND_WAVE_AFTER = 3
#: From the last kill to every message finished (a fixed processor needs well under a minute).
SETTLE_SECONDS = 150.0


@pytest.fixture
def api() -> Iterator[LabelledApi]:
    with LabelledApi() as fake:
        yield fake


def _enqueue(rt: Runtime, numbers: tuple[int, ...], agent_of: Callable[[int], str]) -> None:
    debounce = rt.settings.queue.debounce_ms
    for number in numbers:
        for chat in range(CHATS):
            rt.queue.intake.enqueue_message(
                ChatAddress(
                    "telegram", f"user{chat}", sender_id=str(7000 + chat), conversation=str(7000 + chat)
                ),
                f"{label(chat, number)} please answer this",
                agent=agent_of(chat),
                debounce_ms=debounce,
            )


def _settled(rt: Runtime, processors: list[ProcessorProcess]) -> bool:
    rows = message_rows(rt.db)
    finished = all(r["status"] in ("completed", "dead") for r in rows.values())
    return finished and not any(cli_pids(p.pid) for p in processors if p.alive())


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent's reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _crash_scenario(
    tmp_path: Path,
    api: LabelledApi,
    db_url: str,
    *,
    agents: tuple[str, ...],
    processors: int,
    processor_settings: dict[str, object] | None,
    name: str,
    takeover_timeout: float = 0.0,
) -> tuple[Tally, KillLog, float]:
    home = write_home(tmp_path, db_url, agents, processor=processor_settings)
    env = processor_env(api, tmp_path, home)
    started: list[ProcessorProcess] = []

    def start(index: int) -> ProcessorProcess:
        proc = ProcessorProcess(env, tmp_path / f"processor-{index}.log")
        started.append(proc)
        return proc

    def agent_of(chat: int) -> str:
        return agents[chat % len(agents)]

    begun = time.monotonic()
    rt = open_home(home)
    try:
        _enqueue(rt, FIRST_WAVE, agent_of)
        live = [start(i) for i in range(processors)]
        second_wave_sent = False

        def after_kill(kill: Kill) -> None:
            nonlocal second_wave_sent
            print(
                f"[{name}] kill {kill.number}: processor {kill.processor} pid {kill.pid}, chat {kill.chat}, "
                f"run of {list(kill.labels)}, CLI pids {kill.cli}, t={time.monotonic() - begun:.1f}s"
            )
            # Every claude CLI under the killed processor (its run's, and warm ones kept idle) dies with it.
            if not _wait(lambda: not any(_alive(pid) for pid in kill.cli), 10.0):
                raise AssertionError(f"kill {kill.number}: CLI processes outlived the processor: {kill.cli}")
            if kill.number == SECOND_WAVE_AFTER:
                _enqueue(rt, SECOND_WAVE, agent_of)
                second_wave_sent = True

        log = kill_during_runs(
            rt.db, api, live, start, kills=KILLS, takeover_timeout=takeover_timeout, after_kill=after_kill
        )
        if not second_wave_sent:
            _enqueue(rt, SECOND_WAVE, agent_of)
        settled = _wait(lambda: _settled(rt, live), SETTLE_SECONDS)
        for proc in live:
            proc.stop()
        result = tally(rt.db, api)
    finally:
        for proc in started:
            if proc.alive():
                proc.kill9()
        rt.close()
    elapsed = time.monotonic() - begun
    print(
        f"[{name}] kills landed={len(log.landed)} missed={log.missed} {log.gave_up or ''}\n"
        f"[{name}] {result.line()} settled={settled} elapsed={elapsed:.0f}s api_calls={len(api.calls())}\n"
        f"[{name}] dead={result.details['dead']}\n[{name}] duplicates={result.details['duplicates']} "
        f"lost={result.details['lost']} mismatched={result.details['mismatched']}"
    )
    return result, log, elapsed


def _check(result: Tally, log: KillLog, tmp_path: Path) -> None:
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(tmp_path.glob("processor-*.log")))
    assert len(log.landed) >= KILLS, f"only {len(log.landed)} kills landed during runs: {log.gave_up}\n{logs}"
    assert result.total == CHATS * (len(FIRST_WAVE) + len(SECOND_WAVE))
    assert (result.completed, result.dead, result.duplicate_finals, result.lost) == (result.total, 0, 0, 0), (
        result.line(),
        result.details,
    )
    assert result.mismatched_finals == 0, result.details["mismatched"]


def test_sqlite_defaults_one_processor_killed_during_runs_loses_and_kills_nothing(
    tmp_path: Path, api: LabelledApi
) -> None:
    result, log, _ = _crash_scenario(
        tmp_path,
        api,
        f"sqlite:///{tmp_path / 'agentpost.db'}",
        agents=("assistant",),
        processors=1,
        processor_settings=None,
        name="sqlite",
    )
    _check(result, log, tmp_path)


@pytest.mark.postgres
def test_postgres_two_processors_killed_in_turn_during_runs_lose_and_kill_nothing(
    tmp_path: Path, api: LabelledApi
) -> None:
    with fresh_pg_database() as url:
        result, log, _ = _crash_scenario(
            tmp_path,
            api,
            url,
            agents=("assistant",),
            processors=2,
            processor_settings=None,
            name="postgresql",
            takeover_timeout=60.0,
        )
    assert {k.processor for k in log.landed} == {0, 1}, "the kills should have hit both processors"
    _check(result, log, tmp_path)


def test_sqlite_warm_sessions_killed_during_runs_lose_nothing_and_leave_no_cli(
    tmp_path: Path, api: LabelledApi
) -> None:
    """The same with warm claude sessions on (workers/providers/claude_warm.py): each kill also takes the
    idle warm processes of other chats; a turn written to a warm process counts as a started run."""
    result, log, _ = _crash_scenario(
        tmp_path,
        api,
        f"sqlite:///{tmp_path / 'agentpost.db'}",
        agents=("assistant",),
        processors=1,
        processor_settings={"session_idle_seconds": 3},
        name="sqlite-warm",
    )
    _check(result, log, tmp_path)
