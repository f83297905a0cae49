"""What every process opens first: its settings, the shared database and the queue over it."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shared.db import Database, open_database
from shared.events import SqlEventLog
from shared.queue import Queue
from shared.settings import Settings, load_settings
from shared.wake import Waker


@dataclass
class Runtime:
    """Settings, database, queue and event log of one process."""

    settings: Settings
    db: Database
    queue: Queue
    events: SqlEventLog
    _waker: Waker | None = None

    @property
    def waker(self) -> Waker:
        """This process's change signal (started on first use)."""
        if self._waker is None:
            self._waker = Waker(self.db, interval_ms=self.settings.queue.wake_interval_ms).start()
        return self._waker

    def close(self) -> None:
        if self._waker is not None:
            self._waker.stop()
            self._waker = None
        with contextlib.suppress(Exception):
            self.events.close()
        self.db.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def open_runtime(home: Path | None = None, env: Mapping[str, str] | None = None) -> Runtime:
    """Load settings, open (and create if needed) the database, and build the queue."""
    settings = load_settings(home, env)
    db = open_database(settings.database_url, busy_timeout_ms=settings.file.database.busy_timeout_ms)
    queue = Queue.from_settings(settings, db)
    rt = Runtime(settings=settings, db=db, queue=queue, events=SqlEventLog(db))
    rt.events = SqlEventLog(db, wait=lambda timeout: rt.waker.wait_for_change(timeout))
    return rt
