"""What the processor holds for one agent it drives: the work groups (the running one and those waiting), the
stop requests of waiting chats, whether the agent's lease was lost, paused or already given up, and the
renewal that keeps those leases; and the payload describing how a run ended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio

from shared.aio import call
from workers.busy import WorkGroup
from workers.liveness import RunInfo
from workers.providers.base import RunResult

log = logging.getLogger("agentpost.processor")


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
        """The groups held, the running one first."""
        return ([self.running] if self.running is not None else []) + list(self.groups)

    def held_ids(self) -> list[str]:
        """The ids of every message held."""
        return [i for g in self.held() for i in g.ids]

    def forget(self, group: WorkGroup) -> None:
        """Stop holding ``group`` (its outcome is written, or it was released)."""
        if self.running is group:
            self.running = None
        elif group in self.groups:
            self.groups.remove(group)

    async def keep_leases(
        self, renew: Callable[[list[str]], int], interval: float, scope: anyio.CancelScope
    ) -> None:
        """Every ``interval`` seconds, extend the leases of every message held (and the agent's lease):
        ``renew(ids)`` does it in a worker thread and returns how many it extended. One gone (the lease
        lapsed and another worker took it over) marks the drive lost and cancels ``scope``: the run is
        stopped and nothing of it is sent. A database hiccup is tried again next round."""
        while True:
            await anyio.sleep(interval)
            async with self.lock:
                ids = self.held_ids()
                try:
                    count = await call(renew, ids)
                except Exception as exc:
                    log.warning("agent %s: lease renewal failed: %s", self.agent, exc)
                    continue
                if count < len(ids):
                    self.lost = True
                    scope.cancel()
                    return


def step_done(run: RunInfo, result: RunResult) -> dict[str, Any]:
    """The payload of a run's ``chain_step_done`` event."""
    done: dict[str, Any] = {
        "agent": run.agent,
        "ok": result.ok and not run.reason,
        "exit_code": result.exit_code,
        "duration_ms": result.duration_ms,
        **({"waited_ms": result.waited_ms} if result.waited_ms else {}),
        "timed_out": result.timed_out,
        "pid": result.pid or run.pid,
        "message_ids": run.group.ids,
        "run_id": run.run_id,
    }
    if run.first_text_ms is not None:
        # Time to first text: how long the chat waited from the run's start for the CLI's first words.
        done["first_text_ms"] = run.first_text_ms
    if run.reason:
        done["stopped_by"] = run.reason
    elif not result.ok:
        done["error"] = result.error[:500]
        if result.stopped_by:
            done["stopped_by"] = result.stopped_by
    return done
