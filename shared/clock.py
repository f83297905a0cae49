"""Time in the one unit the tables use: epoch milliseconds."""

from __future__ import annotations

import time


def now_ms() -> int:
    """The current wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000
