"""The UTC periods budgets and ``agentpost usage --since`` count over."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shared.reads.usage import day_of, day_start, month_start, next_day_start, next_month_start, parse_since

pytestmark = pytest.mark.unit


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("moment", "start", "reset"),
    [
        (ms(2026, 12, 2, 2, 14, 5), ms(2026, 12, 2), ms(2026, 12, 3)),
        (ms(2026, 12, 31, 23, 59, 59), ms(2026, 12, 31), ms(2027, 1, 1)),
        (ms(2028, 2, 28, 12), ms(2028, 2, 28), ms(2028, 2, 29)),  # a leap day follows
        (ms(2026, 3, 1), ms(2026, 3, 1), ms(2026, 3, 2)),  # midnight itself begins the day
    ],
)
def test_a_day_runs_from_utc_midnight_to_the_next(moment: int, start: int, reset: int) -> None:
    assert day_start(moment) == start
    assert next_day_start(moment) == reset


@pytest.mark.parametrize(
    ("moment", "start", "reset"),
    [
        (ms(2026, 12, 2, 2, 14), ms(2026, 12, 1), ms(2027, 1, 1)),  # December rolls into a new year
        (ms(2027, 2, 28, 23, 59), ms(2027, 2, 1), ms(2027, 3, 1)),
        (ms(2028, 2, 29, 8), ms(2028, 2, 1), ms(2028, 3, 1)),  # leap February
        (ms(2026, 4, 30, 23, 59, 59), ms(2026, 4, 1), ms(2026, 5, 1)),  # a 30-day month
        (ms(2026, 1, 1), ms(2026, 1, 1), ms(2026, 2, 1)),
    ],
)
def test_a_month_runs_from_its_first_to_the_next_first(moment: int, start: int, reset: int) -> None:
    assert month_start(moment) == start
    assert next_month_start(moment) == reset


def test_day_of_names_the_utc_date() -> None:
    assert day_of(ms(2026, 12, 31, 23, 59, 59)) == "2026-12-31"
    assert day_of(ms(2027, 1, 1)) == "2027-01-01"


def test_since_reads_spans_and_named_periods() -> None:
    now = ms(2026, 12, 2, 2, 14)
    assert parse_since("7d", now) == now - 7 * 86_400_000
    assert parse_since(" 24h ", now) == now - 86_400_000
    assert parse_since("30m", now) == now - 30 * 60_000
    assert parse_since("2w", now) == now - 14 * 86_400_000
    assert parse_since("today", now) == ms(2026, 12, 2)
    assert parse_since("month", now) == ms(2026, 12, 1)
    for bad in ("", "7", "d", "-1d", "7 days", "yesterday"):
        with pytest.raises(ValueError, match="30m, 24h, 7d"):
            parse_since(bad, now)
