"""Rate-limit backoff: doubling up to its ceiling."""

from __future__ import annotations

import pytest

from workers.ratelimit import backoff_ms

pytestmark = pytest.mark.unit


def test_backoff_doubles_up_to_the_ceiling() -> None:
    assert [backoff_ms(n, 60, 300) for n in (1, 2, 3, 4)] == [60_000, 120_000, 240_000, 300_000]
