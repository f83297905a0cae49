"""What this processor remembers about rate limits per agent: how many came in a row (the backoff grows with
them) and until when it paused the agent.

The pause itself is also written to the database (:meth:`shared.queue.Queue.pause_agent`), where every
processor respects it; the copy here lets the processor's own loop skip the agent without a read.
"""

from __future__ import annotations

import time


class RateLimitPauses:
    """Per-agent rate-limit strikes and pause ends (``time.monotonic`` seconds) of one processor."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._strikes: dict[str, int] = {}

    def strike(self, agent: str) -> int:
        """Count one more rate limit of ``agent`` in a row; returns the count (1 for the first)."""
        self._strikes[agent] = self._strikes.get(agent, 0) + 1
        return self._strikes[agent]

    def clear_strikes(self, agent: str) -> None:
        """A run of ``agent`` succeeded: the next rate limit starts the backoff over."""
        self._strikes.pop(agent, None)

    def pause(self, agent: str, seconds: float) -> None:
        """Skip ``agent`` for ``seconds`` from now."""
        self._until[agent] = time.monotonic() + seconds

    def until(self, agent: str) -> float:
        """When the pause of ``agent`` set here ends (monotonic seconds); 0.0 when none was set."""
        return self._until.get(agent, 0.0)
