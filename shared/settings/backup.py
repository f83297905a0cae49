"""The ``[backup]`` section of settings.toml: how often the scheduler copies the database, how many copies
it keeps and where (``agentpost backup`` / ``restore`` are in :mod:`scheduler.backup_commands`)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_duration(value: object) -> float:
    """``"90s"``, ``"30m"``, ``"12h"``, ``"1d"``, ``"2w"`` or a number of seconds → seconds; a ValueError
    that shows the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; use e.g. 30m, 12h, 1d or 2w")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION_RE.match(str(value).lower())
        if match is None:
            raise ValueError(f"{value!r} is not a duration; use e.g. 30m, 12h, 1d or 2w")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as the largest whole unit: 86400 → ``1d``, 5400 → ``90m``."""
    for unit in ("w", "d", "h", "m"):
        size = _UNIT_SECONDS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


class BackupSettings(BaseModel):
    """``[backup]``: the scheduler takes a copy of the database every ``every`` (a duration such as ``"1d"``
    or ``"12h"``) into ``dir`` and keeps the newest ``keep`` of them; ``enabled = false`` stops it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    every: float = Field(default=86_400.0, description="seconds between scheduled backups (given as '1d')")
    keep: int = Field(default=7, ge=1, le=10_000, description="how many scheduled copies stay")
    dir: str = Field(default="", description="where the copies go (default: $AGENTPOST_HOME/backups)")

    @field_validator("every", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)

    def folder(self, home: Path) -> Path:
        """The folder the scheduled copies go to (a relative ``dir`` is relative to ``home``)."""
        if not self.dir:
            return home / "backups"
        path = Path(self.dir).expanduser()
        return path if path.is_absolute() else home / path
