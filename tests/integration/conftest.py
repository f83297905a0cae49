"""Fixtures the integration tests of several modules share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.runtime import Runtime
from tests.scheduler_support import open_scheduler_runtime


@pytest.fixture
def rt(tmp_path: Path, db_url: str) -> Iterator[Runtime]:
    """A scheduler test home's runtime that archives dead letters at once and acks unserved replies after 60 s."""
    runtime = open_scheduler_runtime(
        tmp_path, db_url, "[scheduler]\ndlq_archive_age_hours = 0\nunserved_response_age_seconds = 60\n"
    )
    yield runtime
    runtime.close()
