"""The one retry-wait rule (shared/backoff.py)."""

from __future__ import annotations

import pytest

from shared.backoff import Backoff

pytestmark = pytest.mark.unit


def test_the_ceiling_doubles_per_attempt_up_to_the_cap() -> None:
    backoff = Backoff(base=2.0, cap=10.0)
    assert [backoff.ceiling(n) for n in (0, 1, 2, 3, 4, 5)] == [2.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_jitter_only_ever_shortens_the_wait_within_its_fraction() -> None:
    backoff = Backoff(base=4.0, cap=60.0, jitter=0.5)
    assert backoff.delay(2, rng=lambda: 0.0) == 8.0
    assert backoff.delay(2, rng=lambda: 1.0) == 4.0
    waits = [backoff.delay(3) for _ in range(500)]
    assert all(8.0 <= w <= 16.0 for w in waits)
    assert max(waits) - min(waits) > 1.0  # spread out, not in lockstep


def test_no_jitter_is_exactly_the_ceiling_in_milliseconds() -> None:
    assert [Backoff(60, 300, jitter=0).delay_ms(n) for n in (1, 2, 3, 4)] == [
        60_000,
        120_000,
        240_000,
        300_000,
    ]


@pytest.mark.parametrize(
    "bad", [{"base": -1, "cap": 1}, {"base": 1, "cap": -1}, {"base": 1, "cap": 1, "jitter": 1.5}]
)
def test_a_nonsense_backoff_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**bad)
