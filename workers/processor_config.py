"""The ``[processor]`` settings and the processor's counters.

The section's model is :class:`shared.settings.sections.ProcessorSettings`: every command validates
``[processor]`` with it when it loads the settings, so a value the processor would refuse is refused by
``agentpost doctor`` and ``send`` too, not only when the processor starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.settings.sections import ProcessorSettings
from shared.worker_identity import new_worker_id

__all__ = ["ProcessorSettings", "ProcessorStats", "default_worker_id"]


@dataclass
class ProcessorStats:
    """Counters of one processor's life (handy for tests and the stop log line)."""

    invocations: int = 0
    completed: int = 0
    failed: int = 0
    released: int = 0
    lease_lost: int = 0
    stopped: int = 0
    interrupted: int = 0
    dropped: int = 0
    rate_limited: int = 0
    silent: int = 0


def default_worker_id() -> str:
    """``host:pid:start``, unique per process life (see :mod:`shared.worker_identity`)."""
    return new_worker_id()
