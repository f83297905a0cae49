"""The one retry-wait rule: a base wait doubled per attempt, capped, with optional jitter below the ceiling.

Every retry in agentpost (a failed run, a reply the platform did not take, a channel that cannot connect, a
Graph API throughput error, a rate-limited agent, the schema race at start) waits by this rule, so operators
reason about one formula: attempt ``n`` (1-based) may wait up to ``min(cap, base * 2 ** (n - 1))``.

Jitter only ever shortens the wait (to between ``1 - jitter`` and 1 of that ceiling): a herd of failures does
not retry in lockstep, and the cap an operator configured is never exceeded.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff in seconds. ``jitter`` is the fraction of the ceiling that may be taken off
    (0: exactly the ceiling, 0.5: anywhere in its upper half)."""

    base: float
    cap: float
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or not 0 <= self.jitter <= 1:
            raise ValueError(f"invalid backoff {self}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait before retry number ``attempt`` (1-based; 0 or less counts as 1)."""
        return min(self.cap, self.base * 2.0 ** max(0, attempt - 1))

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """The wait in seconds before retry number ``attempt``."""
        return self.ceiling(attempt) * (1 - self.jitter * rng())

    def delay_ms(self, attempt: int, rng: Callable[[], float] = random.random) -> int:
        """:meth:`delay` in whole milliseconds, for deadlines stored as epoch ms."""
        return int(self.delay(attempt, rng) * 1000)
