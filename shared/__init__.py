"""agentpost's shared core: settings, database, queue operations, event log, routing and wake-ups.

Every process (processor, channel adapters, web API, scheduler) stands on this package and talks to the
others only through the database it manages. Nothing here imports `workers`, `adapters` or `scheduler`.
"""

from __future__ import annotations

__version__ = "0.1.0"
