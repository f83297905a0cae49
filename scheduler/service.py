"""The scheduler process (`agentpost run scheduler`): APScheduler running the maintenance jobs, the
heartbeats and the user schedules against the shared database.

Every job is also a method of :class:`SchedulerService` that tests and tools call directly;
:meth:`SchedulerService.run_once` runs them all once (the run-until-idle mode). Two schedulers may run at
once: maintenance jobs are idempotent transactions and timed messages fire once per slot.

Heartbeats and schedules follow edits of settings.toml without a restart (:meth:`SchedulerService.follow_settings`,
looked at every second); the maintenance intervals and the time zone are read at start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from apscheduler.jobstores.base import JobLookupError  # type: ignore[import-untyped]
from apscheduler.schedulers.background import BackgroundScheduler  # type: ignore[import-untyped]
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-untyped]

from scheduler import backups, dlq, jobs
from scheduler.config import (
    SchedulerConfig,
    load_heartbeats,
    load_scheduler_config,
    load_schedules,
    zone,
)
from scheduler.heartbeats import heartbeat_jobs
from scheduler.schedules import schedule_jobs
from scheduler.timed import Fired, TimedJob
from shared.queue import presence
from shared.runtime import Runtime, open_runtime
from shared.settings.model import SettingsError
from shared.worker_identity import new_worker_id

log = logging.getLogger("agentpost.scheduler")

#: How often the scheduler looks whether heartbeats or schedules were edited.
SETTINGS_LOOK_SECONDS = 1.0


@dataclass
class RunReport:
    """What one pass of every job did (see :meth:`SchedulerService.run_once`)."""

    recovered: dict[str, int] = field(default_factory=dict)
    pruned: dict[str, int] = field(default_factory=dict)
    unserved: int = 0
    previews_removed: int = 0
    events_removed: int = 0
    archived: int = 0
    retried_dead: list[str] = field(default_factory=list)
    fired: list[Fired] = field(default_factory=list)


class SchedulerService:
    """The scheduler's jobs over one runtime."""

    def __init__(self, rt: Runtime, *, start: datetime | None = None) -> None:
        self.rt = rt
        self.config: SchedulerConfig = load_scheduler_config(rt.settings)
        self.timed: list[TimedJob] = self._timed_jobs(self.config, start or datetime.now(UTC))
        self.dlq_dir = dlq.dlq_dir(rt.settings)
        self._generation = rt.settings_generation
        #: This process's name in its presence row (``host:pid:start``), which /metrics reads.
        self.worker = new_worker_id()

    def _timed_jobs(self, config: SchedulerConfig, start: datetime) -> list[TimedJob]:
        settings = self.rt.settings
        return heartbeat_jobs(
            self.rt.queue, settings, config, load_heartbeats(settings), start=start
        ) + schedule_jobs(self.rt.queue, config, load_schedules(settings), start=start)

    def follow_settings(self, sched: BackgroundScheduler | None = None) -> bool:
        """Take up edited heartbeats and schedules (and the scheduler section's other values, except the
        intervals and time zone an APScheduler already uses). True when the jobs were rebuilt. An edit that
        does not validate keeps the jobs in force; the reason is logged once per change."""
        settings = self.rt.settings  # looks at the file (about once a second)
        if self.rt.settings_generation == self._generation:
            return False
        self._generation = self.rt.settings_generation
        try:
            config = load_scheduler_config(settings)
            timed = self._timed_jobs(config, datetime.now(UTC))
        except SettingsError as exc:
            log.warning(
                "heartbeats and schedules not reloaded, the ones in force stay: %s",
                " ".join(str(exc).split()),
            )
            return False
        if sched is not None:
            for job in self.timed:
                with contextlib.suppress(JobLookupError):
                    sched.remove_job(job.name)
            for job in timed:
                self._add_timed(sched, job)
        self.config, self.timed = config, timed
        log.info("heartbeats and schedules reloaded: %s", ", ".join(j.name for j in timed) or "none")
        return True

    # -- the jobs, each callable directly ------------------------------------------------------------------
    def recover(self) -> dict[str, int]:
        recovered = jobs.recover_expired_leases(self.rt.queue)
        return {**recovered, "approvals_timed_out": jobs.end_overdue_approvals(self.rt.queue)}

    def prune(self) -> tuple[dict[str, int], int]:
        """Acknowledge stale replies on unserved channels, then prune finished rows."""
        unserved = jobs.ack_unserved_responses(self.rt.db, self.config)
        return jobs.prune_finished(self.rt.db, self.rt.settings), unserved.acked

    def prune_previews(self) -> int:
        return jobs.prune_previews(self.rt.db)

    def clean_events(self) -> int:
        return jobs.clean_events(self.rt.events, self.rt.settings)

    def archive(self) -> dlq.ArchiveResult:
        if not self.config.dlq.enabled:
            return dlq.ArchiveResult()  # [scheduler.dlq] enabled = false: dead letters stay in the database
        result = dlq.archive_dead_letters(
            self.rt.db,
            self.dlq_dir,
            older_than_ms=int(self.config.dlq_archive_age_hours * 3_600_000),
            batch=self.config.dlq_archive_batch,
            max_entries=self.config.dlq.max_entries,
        )
        if result.archived or result.already_in_file:
            log.info(
                "archived %d dead letter(s) to %s (%d were already in the file)",
                result.archived,
                ", ".join(result.files),
                result.already_in_file,
            )
        return result

    def backup(self, *, force: bool = False) -> backups.ScheduledBackup:
        """``[backup]``: a copy of the database into the backup folder when one is due (see
        :mod:`scheduler.backups`), keeping the newest ``keep``."""
        return backups.backup_if_due(self.rt.db, self.rt.settings, force=force)

    def retry_dead(self) -> list[str]:
        """``[scheduler.dlq] auto_retry``: dead letters back to pending after their delay, within budget."""
        retried = dlq.retry_dead_letters(self.rt.queue, self.config.dlq)
        if retried:
            log.info("retried %d dead letter(s) automatically: %s", len(retried), ", ".join(retried))
        return retried

    def fire_due(self, now: datetime | None = None) -> list[Fired]:
        """Fire every heartbeat and schedule whose latest slot up to ``now`` has not been looked at."""
        now = now or datetime.now(UTC)
        fired = []
        for job in self.timed:
            result = job.run(now)
            if result is not None:
                fired.append(result)
        return fired

    def run_once(self, now: datetime | None = None) -> RunReport:
        """Run every job once, in order (the run-until-idle mode tests use)."""
        report = RunReport()
        report.recovered = self.recover()
        report.pruned, report.unserved = self.prune()
        report.previews_removed = self.prune_previews()
        report.events_removed = self.clean_events()
        report.archived = self.archive().archived
        report.retried_dead = self.retry_dead()
        report.fired = self.fire_due(now)
        return report

    # -- the APScheduler process ------------------------------------------------------------------------------
    def build(self) -> BackgroundScheduler:
        """An APScheduler with every job added (not started)."""
        tz = zone(self.config.timezone)
        sched = BackgroundScheduler(
            timezone=tz,
            job_defaults={
                "coalesce": True,
                "max_instances": 1,
                "misfire_grace_time": int(self.config.misfire_grace_seconds),
            },
        )
        now = datetime.now(UTC)
        periodic: list[tuple[str, float, Any]] = [
            ("recover", self.config.recover_interval_seconds, self.recover),
            ("prune", self.config.prune_interval_seconds, self.prune),
            ("previews", self.config.prune_interval_seconds, self.prune_previews),
            ("events", self.config.events_cleanup_interval_seconds, self.clean_events),
            ("dlq-archive", self.config.dlq_archive_interval_seconds, self.archive),
            ("dlq-retry", min(60.0, self.config.dlq.retry_delay_seconds), self.retry_dead),
            ("backup", backups.look_seconds(self.rt.settings), self.backup),
            ("presence", presence.REFRESH_MS / 1000, self.announce),
        ]
        for name, seconds, func in periodic:
            sched.add_job(
                _guarded(name, func),
                IntervalTrigger(seconds=seconds, timezone=tz),
                id=name,
                name=name,
                next_run_time=now,
            )
        for job in self.timed:
            self._add_timed(sched, job)
        sched.add_job(
            _guarded("settings", lambda: self.follow_settings(sched)),
            IntervalTrigger(seconds=SETTINGS_LOOK_SECONDS, timezone=tz),
            id="settings",
            name="settings",
        )
        return sched

    @staticmethod
    def _add_timed(sched: BackgroundScheduler, job: TimedJob) -> None:
        sched.add_job(
            _guarded(job.name, lambda job=job: job.run(datetime.now(UTC))),
            job.trigger,
            id=job.name,
            name=job.name,
        )

    def announce(self) -> None:
        """Write (or refresh) this scheduler's presence row: /metrics shows it up while it is fresh."""
        presence.announce_scheduler(self.rt.db, self.worker, os.getpid())

    def serve(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set: catch up missed slots, then let APScheduler run the jobs."""
        self.rt.events.append(
            "scheduler",
            "scheduler_start",
            {"heartbeats_and_schedules": [j.name for j in self.timed]},
        )
        _guarded("catch-up", self.fire_due)()
        sched = self.build()
        sched.start()
        log.info("scheduler running: %s", ", ".join(j.id for j in sched.get_jobs()))
        try:
            stop.wait()
        finally:
            sched.shutdown(wait=True)
            with contextlib.suppress(Exception):  # left behind, it is known gone by this pid
                presence.withdraw(self.rt.db, self.worker, "scheduler")
            log.info("scheduler stopped")


def _guarded(name: str, func: Any) -> Any:
    # A job that fails (the database briefly unreachable, say) is logged and tried again at its next run;
    # it never takes the scheduler down.
    def run() -> Any:
        try:
            return func()
        except Exception:
            log.exception("job %s failed; it runs again at its next time", name)
            return None

    run.__name__ = f"job_{name}"
    return run


def main(home: Path | None = None) -> None:
    """Entry point of `agentpost run scheduler`: run until SIGTERM or SIGINT."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s scheduler %(levelname)s %(message)s"
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with open_runtime(home) as rt:
        SchedulerService(rt).serve(stop)
