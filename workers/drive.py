"""What the processor holds for one agent it drives: the work groups (the running one and those waiting), the
stop requests of waiting chats, and whether the agent's lease was lost, paused or already given up; and the
payload describing how a run ended.
"""

from __future__ import annotations

from typing import Any

import anyio

from workers.busy import WorkGroup
from workers.liveness import RunInfo
from workers.providers import RunResult


class Drive:
    """One agent driven by this processor: the groups it holds (running and waiting) and its state."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.groups: list[WorkGroup] = []
        self.running: WorkGroup | None = None
        self.stops: set[str] = set()  # stop requests for chats that are waiting here
        self.lock = anyio.Lock()  # renewal and completion must not interleave (a completed id is not "lost")
        self.lost = False
        self.paused = False
        #: The agent lease went with the last completion (nothing else waited): no release is due.
        self.released = False

    def held(self) -> list[WorkGroup]:
        return ([self.running] if self.running is not None else []) + list(self.groups)

    def held_ids(self) -> list[str]:
        return [i for g in self.held() for i in g.ids]

    def forget(self, group: WorkGroup) -> None:
        if self.running is group:
            self.running = None
        elif group in self.groups:
            self.groups.remove(group)


def step_done(run: RunInfo, result: RunResult) -> dict[str, Any]:
    """The payload of a run's ``chain_step_done`` event."""
    done: dict[str, Any] = {
        "agent": run.agent,
        "ok": result.ok and not run.reason,
        "exit_code": result.exit_code,
        "duration_ms": result.duration_ms,
        "timed_out": result.timed_out,
        "pid": result.pid or run.pid,
        "message_ids": run.group.ids,
        "run_id": run.run_id,
    }
    if run.reason:
        done["stopped_by"] = run.reason
    elif not result.ok:
        done["error"] = result.error[:500]
        if result.stopped_by:
            done["stopped_by"] = result.stopped_by
    return done
