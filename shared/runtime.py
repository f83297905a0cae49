"""What every process opens first: its settings, the shared database and the queue over it.

Settings are live: a process notices an edit of ``settings.toml`` (its size, modification time or inode
changed; looked at no more than about once a second) and reloads it. Agents, teams, the default agent and
the queue's tuning apply at once, in this process's routing and queue; the database, the web address and
the wake-up interval are read once at start and need ``agentpost restart``. A file that no longer validates
keeps the settings in force; the error is logged once per change (and shown by ``agentpost doctor``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from shared.events.log import SqlEventLog
from shared.queue.core import Queue
from shared.settings.model import Settings, SettingsError, load_settings
from shared.storage.db import Database
from shared.storage.schema import open_database

if TYPE_CHECKING:
    from shared.events.wake import Waker

log = logging.getLogger("agentpost.settings")

#: The settings file is looked at no more often than this (a ``stat`` call; nothing is read unless it changed).
SETTINGS_CHECK_INTERVAL_S = 1.0

_Signature = tuple[int, int, int] | None


def _signature(path: Path) -> _Signature:
    """What tells an edited file apart: modification time, size and inode (an editor's rename-over)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Runtime:
    """Settings, database, queue and event log of one process."""

    def __init__(self, settings: Settings, db: Database, queue: Queue, events: SqlEventLog) -> None:
        self._settings = settings
        self.db = db
        self.queue = queue
        self.events = events
        self._waker: Waker | None = None
        #: Grows by one each time new settings take effect (processes compare it to rebuild what they
        #: derived from the settings).
        self.settings_generation = 0
        #: Why the settings file on disk is not in force ("" when it is).
        self.settings_error = ""
        self._signature = _signature(settings.path)
        self._checked = time.monotonic()
        self._reload_lock = threading.Lock()
        self._watch_stop = threading.Event()
        self._watch: threading.Thread | None = None

    # -- settings ----------------------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        """The settings in force, reloaded first when the file changed (looked at about once a second)."""
        if time.monotonic() - self._checked >= SETTINGS_CHECK_INTERVAL_S:
            self.refresh_settings()
        return self._settings

    @settings.setter
    def settings(self, value: Settings) -> None:
        self._apply(value)

    def refresh_settings(self, *, force: bool = False) -> bool:
        """Reload ``settings.toml`` if it changed since the last look (or with ``force``). True when new
        settings took effect. A file that does not validate keeps the old settings: the reason is kept in
        :attr:`settings_error` and logged once per change of the file."""
        if not self._reload_lock.acquire(blocking=False):
            return False  # another thread is reloading right now
        try:
            self._checked = time.monotonic()
            current = self._settings
            signature = _signature(current.path)
            if signature == self._signature and not force:
                return False
            self._signature = signature
            try:
                fresh = load_settings(current.home, current.env)
            except SettingsError as exc:
                self.settings_error = str(exc)
                log.warning("settings not reloaded, the ones in force stay: %s", " ".join(str(exc).split()))
                return False
            self.settings_error = ""
            self._apply(fresh)
            log.info("settings reloaded from %s: agents %s", fresh.path, ", ".join(sorted(fresh.agents)))
            if fresh.database_url != current.database_url or fresh.api != current.api:
                log.warning("database or api settings changed: they take effect after `agentpost restart`")
            return True
        finally:
            self._reload_lock.release()

    def _apply(self, fresh: Settings) -> None:
        # The queue's routing (agents, teams, default agent) and tuning follow the new settings; the
        # database connection and the event log stay.
        self.queue.follow(fresh)
        self._settings = fresh
        self.settings_generation += 1

    def watch_settings(self) -> None:
        """Keep looking at the settings file in a background thread (about once a second), so routing in a
        process that never reads :attr:`settings` follows edits too. Long-running processes get this with
        their :attr:`waker`."""
        if self._watch is not None:
            return

        def loop() -> None:
            while not self._watch_stop.wait(SETTINGS_CHECK_INTERVAL_S):
                try:
                    self.refresh_settings()
                except Exception:  # never let a reload bug take the process down
                    log.exception("settings reload failed")

        self._watch = threading.Thread(target=loop, name="agentpost-settings", daemon=True)
        self._watch.start()

    # -- wake-ups and lifetime ---------------------------------------------------------------------------
    @property
    def waker(self) -> Waker:
        """This process's change signal (started on first use, with the settings watch)."""
        if self._waker is None:
            from shared.events.wake import Waker  # psycopg and the watch: only for processes that wait

            self._waker = Waker(self.db, interval_ms=self._settings.queue.wake_interval_ms).start()
            self.watch_settings()
        return self._waker

    def close(self) -> None:
        self._watch_stop.set()
        if self._watch is not None:
            self._watch.join(timeout=3)
            self._watch = None
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


def open_runtime(
    home: Path | None = None, env: Mapping[str, str] | None = None, *, quick: bool = False
) -> Runtime:
    """Load settings, open (and create if needed) the database, and build the queue. ``quick`` (for short
    commands): a database whose schema version is current is not inspected further (no SQLAlchemy)."""
    settings = load_settings(home, env)
    db = open_database(
        settings.database_url, busy_timeout_ms=settings.file.database.busy_timeout_ms, quick=quick
    )
    queue = Queue.from_settings(settings, db)
    rt = Runtime(settings=settings, db=db, queue=queue, events=SqlEventLog(db))
    rt.events = SqlEventLog(db, wait=lambda timeout: rt.waker.wait_for_change(timeout))
    return rt
