"""Fixtures the integration tests of several modules share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.runtime import Runtime
from tests.scheduler_support import open_scheduler_runtime
from tests.web_support import LiveServer, home_runtime


@pytest.fixture
def scheduler_rt(tmp_path: Path, db_url: str) -> Iterator[Runtime]:
    """A scheduler test home's runtime that archives dead letters at once and acks unserved replies after 60 s."""
    runtime = open_scheduler_runtime(
        tmp_path, db_url, "[scheduler]\ndlq_archive_age_hours = 0\nunserved_response_age_seconds = 60\n"
    )
    yield runtime
    runtime.close()


@pytest.fixture
def api_rt(tmp_path: Path) -> Iterator[Runtime]:
    """The web API tests' home (agents alpha, beta, gamma, team dev) on a SQLite file."""
    yield from home_runtime(tmp_path)


@pytest.fixture
def api_server(api_rt: Runtime) -> Iterator[LiveServer]:
    """A real uvicorn server of the web app over :func:`api_rt`, bodies capped at 300 kB."""
    with LiveServer(api_rt, app_kwargs={"max_body_bytes": 300_000}) as live:
        yield live


@pytest.fixture
def api_client(api_server: LiveServer) -> Iterator[httpx.Client]:
    """An HTTP client of :func:`api_server` carrying its token."""
    with api_server.client() as c:
        yield c
