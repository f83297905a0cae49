"""How each channel adapter's connection to its platform stands, for ``agentpost status`` and ``doctor``.

An adapter records its state when it connects, while it retries an unreachable platform at start, and when
it gives up; while it is connected it writes the same state again every :data:`REFRESH_MS`, so the row's time
is the adapter's heartbeat (``/metrics`` reports its age). One row per channel in ``kv`` (scope ``channel_health``, key = the channel, value = JSON). The
adapter's worker id (``host:pid:start``) is kept with it, so a reader on the same host can tell a record
left behind by an adapter that no longer runs from a live one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from shared.clock import now_ms
from shared.settings.model import Settings
from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope
from shared.worker_identity import Holder, holder_state

State = Literal["connecting", "retrying", "up", "stopped"]

#: How often a connected adapter writes its state again (one small write a minute, whatever the load).
REFRESH_MS = 60_000
#: A record of another host not written for this long is an adapter that died there (three refreshes missed).
STALE_MS = 3 * REFRESH_MS


@dataclass(frozen=True)
class ChannelHealth:
    """One channel's last recorded state. ``error`` is the last failure (empty once connected)."""

    channel: str
    state: State
    error: str
    attempts: int
    since: int
    next_try_at: int
    worker: str
    updated_at: int

    @property
    def adapter_gone(self) -> bool:
        """The adapter that wrote this record no longer runs (known only on its own host)."""
        return holder_state(self.worker) is Holder.GONE

    def running(self, now: int) -> bool:
        """Connected to its platform, as far as this host can tell: the state is ``up``, and the adapter runs
        (its own host knows by its worker id; another host by a refresh within :data:`STALE_MS`)."""
        if self.state != "up":
            return False
        state = holder_state(self.worker)
        return state is Holder.ALIVE or (state is Holder.UNKNOWN and now - self.updated_at < STALE_MS)

    def describe(self) -> str:
        """One plain line, e.g. ``retrying since 12:41:03 UTC (3 tries, next in 4 s): cannot connect ...``."""
        since = datetime.fromtimestamp(self.since / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if self.adapter_gone:
            last = f"; last error: {self.error}" if self.error else ""
            return f"the adapter is not running (it was {self.state} at {since}{last})"
        if self.state == "up":
            return f"connected since {since}"
        if self.state == "connecting":
            return f"connecting since {since}"
        if self.state == "retrying":
            wait = max(0, self.next_try_at - now_ms()) / 1000
            return (
                f"cannot reach the platform since {since} ({self.attempts} tries so far, "
                f"next in {wait:.0f} s): {self.error}"
            )
        return f"stopped at {since}: {self.error}" if self.error else f"stopped at {since}"


def report(
    db: Database,
    channel: str,
    state: State,
    *,
    worker: str,
    error: str = "",
    attempts: int = 0,
    next_try_at: int = 0,
) -> None:
    """Record ``channel``'s state (``since`` stays when the state is unchanged, e.g. retry after retry)."""
    now = now_ms()
    previous = read(db, channel)
    since = previous.since if previous is not None and previous.state == state else now
    value = {
        "state": state,
        "error": error[:500],
        "attempts": attempts,
        "since": since,
        "next_try_at": next_try_at,
        "worker": worker,
    }
    with db.transaction() as tx:
        kv.put(tx, Scope.CHANNEL_HEALTH, channel, json.dumps(value, separators=(",", ":")), now)


def read(db: Database, channel: str) -> ChannelHealth | None:
    """``channel``'s record, or None when its adapter never ran."""
    found = [h for h in read_all(db) if h.channel == channel]
    return found[0] if found else None


def read_all(db: Database) -> list[ChannelHealth]:
    """Every channel's record, by channel."""
    found = []
    for r in kv.entries(db, Scope.CHANNEL_HEALTH):
        try:
            v = json.loads(r.value)
            found.append(
                ChannelHealth(
                    channel=r.key,
                    state=v["state"],
                    error=str(v.get("error") or ""),
                    attempts=int(v.get("attempts") or 0),
                    since=int(v.get("since") or 0),
                    next_try_at=int(v.get("next_try_at") or 0),
                    worker=str(v.get("worker") or ""),
                    updated_at=r.updated_at,
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return found


def read_from_settings(settings: Settings) -> list[ChannelHealth] | None:
    """Every channel's record from the configured database, or None when it cannot be read (the database
    checks say why)."""
    from shared.storage.schema import open_database

    try:
        db = open_database(settings.database_url, create=False)
    except Exception:
        return None
    try:
        return read_all(db)
    except Exception:
        return None
    finally:
        db.close()
