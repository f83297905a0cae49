"""The ``[processor]`` settings and the processor's counters."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from shared.chat_prefs import BusyPolicy
from shared.worker_identity import new_worker_id


class ProcessorSettings(BaseModel):
    """The ``[processor]`` section of settings.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrency: int = Field(default=4, ge=1, le=256, description="agents running at the same time")
    agents: list[str] = Field(default_factory=list, description="run only these agents (empty: all)")
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
        default="collect", description="what messages arriving during a chat's run become (see workers.busy)"
    )
    max_waiting: int = Field(
        default=20, ge=1, description="waiting messages per chat; the oldest beyond are dropped"
    )
    idle_timeout_seconds: float = Field(
        default=600.0, gt=0, description="stop a run whose CLI printed nothing for this long"
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
