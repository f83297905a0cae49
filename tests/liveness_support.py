"""Helpers for the liveness tests (issue 8): a home for the real Claude CLI against the fake API, a processor
run beside a thread that acts while a run is going, and readers for responses and events."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

from shared.runtime import Runtime
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.claude_env import claude_env
from tests.processor_support import make_home
from workers.processor import Processor, ProcessorStats

#: Fast timings for the processor section; tests override single values.
FAST_PROCESSOR: dict[str, Any] = {
    "control_interval_seconds": 0.3,
    "progress_note_seconds": 0,
    "rate_limit_pause_seconds": 1.5,
}


def cli_env(api: FakeAnthropic, tmp: Path) -> dict[str, str]:
    """The environment of the real CLI, talking only to ``api`` (no retries of its own)."""
    home = tmp / "user-home"
    home.mkdir(exist_ok=True)
    return claude_env(api.base_url, home, max_retries=0)


def claude_home(
    tmp: Path,
    db_url: str,
    *,
    agent: Mapping[str, Any] | None = None,
    processor: Mapping[str, Any] | None = None,
    queue: Mapping[str, Any] | None = None,
    channels: Mapping[str, Any] | None = None,
) -> Path:
    """A home with one Claude agent ``coder`` and fast processor timings."""
    return make_home(
        tmp,
        db_url,
        {"coder": {"provider": "claude", "timeout_seconds": 60, **(agent or {})}},
        processor={**FAST_PROCESSOR, **(processor or {})},
        queue=queue,
        channels=channels,
    )


def run_with(
    rt: Runtime,
    env: Mapping[str, str],
    action: Callable[[], None],
    *,
    include_delayed: bool = False,
    timeout: float = 60.0,
) -> ProcessorStats:
    """Run a processor until idle while ``action`` runs in a thread (it usually waits for a run to start,
    then acts); re-raise what the action raised."""
    processor = Processor(rt, env=env)
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            action()
        except BaseException as exc:  # reported in the test's thread below
            errors.append(exc)

    thread = threading.Thread(target=guarded, name="test-action")
    thread.start()
    try:
        anyio.run(lambda: processor.run_until_idle(include_delayed=include_delayed, timeout=timeout))
    finally:
        thread.join(timeout=30)
    if errors:
        raise errors[0]
    return processor.stats


@contextmanager
def serving(rt: Runtime, env: Mapping[str, str]) -> Iterator[Processor]:
    """A processor serving in a background thread until the block ends (for acting at any moment)."""
    processor = Processor(rt, env=env)
    with anyio.from_thread.start_blocking_portal() as portal:
        future = portal.start_task_soon(processor.serve)
        try:
            yield processor
        finally:
            portal.call(processor.stop)
            future.result(timeout=30)


def responses(rt: Runtime) -> list[dict[str, Any]]:
    """All responses, oldest first, with metadata parsed."""
    rows = rt.db.read("SELECT * FROM responses ORDER BY id")
    return [dict(r) | {"metadata": json.loads(r["metadata"] or "{}")} for r in rows]


def of_kind(rt: Runtime, kind: str) -> list[dict[str, Any]]:
    """Responses whose metadata ``kind`` is ``kind``."""
    return [r for r in responses(rt) if r["metadata"].get("kind") == kind]


def payloads(rt: Runtime, type_: str) -> list[dict[str, Any]]:
    """Payloads of the events of one type, oldest first."""
    rows = rt.db.read("SELECT payload FROM events WHERE type = :t ORDER BY id", {"t": type_})
    return [json.loads(r["payload"]) for r in rows]


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (or is a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def group_gone(pgid: int) -> bool:
    """Whether no live process is left in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return False
    return True


def elapsed_since(start: float) -> float:
    """Seconds since ``start`` (``time.monotonic()``)."""
    return time.monotonic() - start
