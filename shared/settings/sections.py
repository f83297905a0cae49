"""The sections of settings.toml that one process kind reads: ``[processor]``, ``[scheduler]``,
``[heartbeats.<agent>]`` and ``[[schedules]]`` (the channels' are in :mod:`shared.settings.channels`).

They live in `shared`, beside the core sections, so that every command checks them the way the process
does: :class:`shared.settings.model.Settings` validates each of them when the file is loaded (``doctor``,
``send``, an edit through the CLI or the web API), not only when the processor or the scheduler starts.
One model per section; the processes read theirs from here. Only what validation needs is here: how a
heartbeat or a schedule is run stays with the scheduler.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator, model_validator

from shared.settings.busy_policy import BusyPolicy
from shared.settings.routing import AGENT_NAME_RE

DEFAULT_HEARTBEAT_PROMPT = (
    "Heartbeat: check on your pending tasks and report anything that needs attention. Keep it brief."
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProcessorSettings(_Strict):
    """The ``[processor]`` section of settings.toml."""

    max_concurrency: int = Field(default=4, ge=1, le=256, description="agents running at the same time")
    agents: list[str] = Field(
        default_factory=list,
        description="run only these agents (empty: all): pins agents to the hosts that have their workspaces",
    )
    renew_interval_seconds: float | None = Field(default=None, gt=0, description="default: lease / 3")
    recover_interval_seconds: float = Field(default=5.0, gt=0)
    shutdown_grace_seconds: float = Field(default=20.0, ge=0)
    rate_limit_pause_seconds: float = Field(
        default=60.0, ge=0, description="first pause after a rate limit that states no reset time"
    )
    rate_limit_max_pause_seconds: float = Field(
        default=3600.0, ge=0, description="the backoff doubles per consecutive rate limit up to this"
    )
    progress_events: bool = True
    orphan_guard: bool = Field(default=True, description="make agent CLIs die with the processor")
    worker_id: str = ""
    busy_policy: BusyPolicy = Field(
        default="collect",
        description="what messages arriving during a chat's run become (see workers.busy, workers.steer)",
    )
    max_waiting: int = Field(
        default=20, ge=1, description="waiting messages per chat; the oldest beyond are dropped"
    )
    idle_timeout_seconds: float = Field(
        default=600.0, gt=0, description="stop a run whose CLI printed nothing for this long"
    )
    approval_timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        description='how long a permission prompt (permission_mode = "ask") waits for an answer; then: denied',
    )
    progress_note_seconds: float = Field(
        default=180.0, ge=0, description="a 'still working' note to the chat this often (0: none)"
    )
    control_interval_seconds: float = Field(
        default=1.0, gt=0, description="how often a run checks for /stop and interrupts without a wake-up"
    )
    silent_token: str = Field(
        default="HEARTBEAT_OK", description="a heartbeat reply equal to this is recorded but sent to no one"
    )
    silent_tokens: dict[str, str] = Field(default_factory=dict, description="per-agent silent tokens")
    sandbox: Literal["auto", "namespaces", "none"] = Field(
        default="auto",
        description="how agent CLIs are confined (workers/sandbox.py): auto = namespaces where they work",
    )
    session_idle_seconds: float = Field(
        default=300.0,
        ge=0,
        description="keep a chat's claude CLI running this long for its next message (0: one process per run)",
    )
    reply_max_chars: int = Field(
        default=100_000,
        ge=1000,
        le=1_000_000,  # workers/output_bounds.TEXT_KEEP: the start of a reply the processor holds in memory
        description="a longer reply is cut to this many characters, with a note, and sent whole as reply.txt",
    )
    warm_sessions_per_agent: int = Field(
        default=4,
        ge=1,
        le=256,
        description="warm claude processes kept per agent (least recently used go first)",
    )
    warm_sessions_total: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description=(
            "warm claude processes kept by one processor in all (~210 MiB each); unset: as many as a quarter "
            "of the machine's available memory holds, so a small host is never pushed into swap"
        ),
    )

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, value: list[str]) -> list[str]:
        # Whether each names a configured agent is checked with the whole file (Settings), which knows them.
        for name in value:
            if not AGENT_NAME_RE.match(name):
                raise ValueError(f"agent name {name!r} must match {AGENT_NAME_RE.pattern}")
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} listed more than once")
        return value


class DlqConfig(_Strict):
    """``[scheduler.dlq]``: AICP's dead-letter settings (its ``dlq:`` block, docs/compatibility.md) on top
    of the archive.

    ``enabled = false`` keeps every dead letter in the database (no archive files). ``max_entries`` bounds
    how many stay in the database: beyond it the oldest are archived early, whatever their age (archived,
    never dropped). ``auto_retry`` (off by default) puts a dead letter back ``retry_delay_seconds`` after
    it died, at most ``max_retries`` times each (apart from the manual retry budget)."""

    enabled: bool = True
    max_entries: int = Field(default=10_000, ge=1, le=10_000_000)
    auto_retry: bool = False
    retry_delay_seconds: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=1, ge=0, le=100)


def zone(name: str) -> ZoneInfo:
    """A time zone by IANA name (``UTC``, ``Europe/Berlin``), or a ValueError naming it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r} (use an IANA name such as 'UTC' or 'Europe/Berlin')"
        ) from None


def check_cron(expr: str) -> str:
    """``expr`` when APScheduler's crontab parser takes it, else a ValueError naming it."""
    # Imported here: a command that loads settings without any cron expression need not pay for it.
    from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]

    try:
        CronTrigger.from_crontab(expr, timezone="UTC")
    except ValueError as exc:
        raise ValueError(f"invalid cron expression {expr!r}: {exc}") from None
    return expr


def parse_active_hours(value: str) -> tuple[int, int]:
    """``"08:00-22:30"`` as minutes of the day ``(start, end)``; raises ValueError naming the format."""
    try:
        start_text, end_text = value.split("-")
        minutes = []
        for part in (start_text, end_text):
            hours, mins = part.strip().split(":")
            h, m = int(hours), int(mins)
            if not (0 <= h <= 24 and 0 <= m < 60) or (h == 24 and m):
                raise ValueError
            minutes.append(h * 60 + m)
    except ValueError:
        raise ValueError(f"active_hours {value!r} must look like '08:00-22:00'") from None
    if minutes[0] == minutes[1]:
        raise ValueError(f"active_hours {value!r} is an empty window")
    return minutes[0], minutes[1]


class SchedulerConfig(_Strict):
    """``[scheduler]``: how often each maintenance job runs and the ages it acts on."""

    timezone: str = "UTC"
    recover_interval_seconds: float = Field(default=60.0, gt=0)
    prune_interval_seconds: float = Field(default=60.0, gt=0)
    completed_max_age_hours: float = Field(default=24.0, gt=0)
    acked_max_age_hours: float = Field(default=24.0, gt=0)
    events_cleanup_interval_seconds: float = Field(default=300.0, gt=0)
    dlq_archive_interval_seconds: float = Field(default=3600.0, gt=0)
    dlq_archive_age_hours: float = Field(default=168.0, ge=0)
    dlq_archive_batch: int = Field(default=500, ge=1, le=100_000)
    dlq: DlqConfig = DlqConfig()
    #: Channels no adapter delivers (the processor answers heartbeats and schedules there); their replies
    #: are acknowledged after this age so they do not pile up, and recorded in the event log.
    unserved_channels: list[str] = Field(default_factory=lambda: ["heartbeat", "schedule"])
    unserved_response_age_seconds: float = Field(default=3600.0, ge=0)
    #: A scheduler that starts (or restarts) fires the latest slot missed within this window, once.
    catchup_seconds: float = Field(default=300.0, ge=0)
    misfire_grace_seconds: float = Field(default=30.0, gt=0)
    default_heartbeat_prompt: str = DEFAULT_HEARTBEAT_PROMPT
    #: What `agentpost queue audit` compares the measured peak with (messages per second one SQLite file
    #: handles on this machine class; set it from your own `make bench` run).
    audit_sqlite_capacity_per_second: float = Field(default=1000.0, gt=0)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        zone(value)
        return value

    @field_validator("unserved_channels")
    @classmethod
    def _channel_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not AGENT_NAME_RE.match(name):
                raise ValueError(f"channel name {name!r} must match {AGENT_NAME_RE.pattern}")
        return value

    @model_validator(mode="after")
    def _catchup_within_dedupe_window(self) -> SchedulerConfig:
        # A slot is refused a second time only while its message is still in the table; completed messages
        # are pruned after completed_max_age_hours, so catching up further back could fire a slot twice.
        if self.catchup_seconds >= self.completed_max_age_hours * 3600:
            raise ValueError("catchup_seconds must be shorter than completed_max_age_hours")
        return self


class RetentionSettings(_Strict):
    """``[retention]``: how many days each kind of finished history stays before the scheduler prunes it, in
    batches of ``batch_rows`` rows (a short transaction each, ``pause_seconds`` apart, so that no prune holds
    the write lock long enough to hold up an enqueue). Unfinished rows are never pruned: pending and
    processing messages, replies not yet delivered, dead letters (those are archived, see ``[scheduler.dlq]``).

    ``messages_days``, ``replies_days`` and ``events_days`` unset keep the older settings in force
    (``[scheduler] completed_max_age_hours`` and ``acked_max_age_hours``, ``[events] ttl_hours``)."""

    messages_days: float | None = Field(default=None, gt=0, description="completed messages")
    replies_days: float | None = Field(default=None, gt=0, description="delivered replies")
    events_days: float | None = Field(default=None, gt=0, description="the event log (trace reads it)")
    chat_room_days: float = Field(default=90.0, gt=0, description="team chat-room posts (chat_messages)")
    agent_history_days: float = Field(default=90.0, gt=0, description="agents' turns (agent_messages)")
    # Budgets add up the current UTC month, so usage must outlive the longest month.
    usage_days: float = Field(default=730.0, ge=32, description="what each run cost (run_usage)")
    batch_rows: int = Field(default=500, ge=1, le=100_000, description="rows deleted per transaction")
    pause_seconds: float = Field(default=0.02, ge=0, le=10, description="between two batches")


class HeartbeatConfig(_Strict):
    """``[heartbeats.<agent>]``: every ``interval`` seconds or on a ``cron`` expression (exactly one)."""

    interval: float | None = Field(default=None, gt=0)
    cron: str | None = None
    enabled: bool = True
    # "HH:MM-HH:MM" in the scheduler's timezone (may wrap past midnight); empty: around the clock.
    active_hours: str = ""
    # A heartbeat while the agent is working (or has messages waiting) would only queue behind the work.
    skip_when_busy: bool = True

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        return None if value is None else check_cron(value)

    @field_validator("active_hours")
    @classmethod
    def _hours(cls, value: str) -> str:
        if value:
            parse_active_hours(value)
        return value

    @model_validator(mode="after")
    def _one_timing(self) -> HeartbeatConfig:
        if (self.interval is None) == (self.cron is None):
            raise ValueError("set exactly one of 'interval' (seconds) or 'cron'")
        return self


class Heartbeats(RootModel[dict[str, HeartbeatConfig]]):
    """All ``[heartbeats.*]`` tables, keyed by agent name."""


class ScheduleConfig(_Strict):
    """One ``[[schedules]]`` entry: a message to an agent on a ``cron`` expression or once ``at`` a time."""

    name: str = ""
    agent: str
    message: str = Field(min_length=1)
    cron: str | None = None
    at: datetime | None = None
    enabled: bool = True

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        return None if value is None else check_cron(value)

    @model_validator(mode="after")
    def _one_timing(self) -> ScheduleConfig:
        if (self.cron is None) == (self.at is None):
            raise ValueError("set exactly one of 'cron' or 'at' (a one-off date and time)")
        if not AGENT_NAME_RE.match(self.agent):
            raise ValueError(f"agent name {self.agent!r} must match {AGENT_NAME_RE.pattern}")
        return self

    @property
    def key(self) -> str:
        """A stable identity for slot ids: the name, else a digest of what the entry does."""
        if self.name:
            return self.name
        what = "\x1f".join(
            [self.agent, self.cron or "", self.at.isoformat() if self.at else "", self.message]
        )
        return "auto-" + hashlib.blake2b(what.encode(), digest_size=6).hexdigest()


class Schedules(RootModel[list[ScheduleConfig]]):
    """The ``[[schedules]]`` array."""


class VoiceSettings(_Strict):
    """The ``[voice]`` section: the speech-to-text service voice notes are transcribed by (any
    OpenAI-compatible ``POST …/audio/transcriptions``). Its key is ``AGENTPOST_VOICE_API_KEY``, and
    ``AGENTPOST_VOICE_API_URL`` wins over ``api_url``; no URL: voice notes are not transcribed (the chat is
    told so)."""

    api_url: str = Field(
        default="",
        description="the service's base URL, e.g. https://api.openai.com/v1 (…/audio/transcriptions is added)",
    )
    model: str = Field(default="whisper-1", min_length=1, description="the model field of the request")
    timeout_seconds: float = Field(
        default=30.0, gt=0, le=600, description="give up on one transcription after this long"
    )
    max_mb: float = Field(default=25.0, gt=0, description="longer recordings are not sent (OpenAI's limit)")

    @field_validator("api_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


class BudgetLimits(_Strict):
    """Spending limits in US dollars (0 or unset: no limit). Days and months are UTC."""

    sender_daily_usd: float | None = Field(default=None, ge=0, description="per person, per UTC day")
    sender_monthly_usd: float | None = Field(default=None, ge=0, description="per person, per UTC month")
    agent_daily_usd: float | None = Field(default=None, ge=0, description="per agent, per UTC day")
    agent_monthly_usd: float | None = Field(default=None, ge=0, description="per agent, per UTC month")


class BudgetSettings(BudgetLimits):
    """The ``[budgets]`` section: limits for every agent, ``[budgets.agents.<name>]`` overrides for one,
    and senders (``<channel>:<id>``, as ``agentpost usage --by sender`` shows them) who are never held."""

    agents: dict[str, BudgetLimits] = Field(default_factory=dict)
    exempt_senders: list[str] = Field(default_factory=list)

    def for_agent(self, agent: str) -> BudgetLimits:
        """The limits that hold for ``agent``: its own override's keys, the section's for the rest."""
        own = self.agents.get(agent)
        if own is None:
            return self
        mine = own.model_dump(exclude_unset=True)
        base = self.model_dump(include=set(BudgetLimits.model_fields))
        return BudgetLimits(**{**base, **mine})
