"""Shared fixtures: a fresh database per test, on a SQLite file or on the PostgreSQL server of this machine.

``AGENTPOST_TEST_PG_URL`` names a PostgreSQL server database to connect to for administration (default: the
local server's ``postgres`` database); each test session creates its own database there and drops it after.
In CI (``CI=true``) a missing server fails the run instead of skipping.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings as hypothesis_settings

from shared.queue.core import Directory, Queue
from shared.settings.model import QueueSettings
from shared.storage.db import Database
from shared.storage.models import SCHEMA_VERSION, TABLE_NAMES
from shared.storage.schema import open_database
from tests.probes import service_unavailable

# Property tests have no per-example deadline: tests run side by side (make test), and an example that takes
# longer on a loaded machine is not a failure. Per-test timeouts still bound each test.
hypothesis_settings.register_profile("agentpost", deadline=None)
hypothesis_settings.load_profile("agentpost")

ADMIN_PG_URL = os.environ.get("AGENTPOST_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("AGENTPOST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _with_db(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A PostgreSQL database created for this test session (dropped at the end)."""
    name = f"agentpost_test_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(ADMIN_PG_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        service_unavailable("PostgreSQL", exc)
    url = _with_db(ADMIN_PG_URL, name)
    open_database(url).close()
    yield url
    with psycopg.connect(ADMIN_PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reset_postgres(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        tables = ", ".join(t for t in TABLE_NAMES if t != "schema_version")
        conn.execute(f"TRUNCATE {tables} RESTART IDENTITY")
        conn.execute("DELETE FROM schema_version WHERE version <> %s", (SCHEMA_VERSION,))


@pytest.fixture
def pg_url(pg_server_url: str) -> str:
    """The session's PostgreSQL database, emptied for this test."""
    reset_postgres(pg_server_url)
    return pg_server_url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agentpost.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database URL: once on SQLite, once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentpost.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = open_database(db_url)
    yield database
    database.close()


@pytest.fixture
def queue(db: Database) -> Queue:
    """A queue with agents ``alpha`` (default), ``beta`` and ``gamma`` and a team ``dev`` led by beta."""
    from shared.settings.routing import Team

    directory = Directory(
        agents=frozenset({"alpha", "beta", "gamma"}),
        teams={"dev": Team(name="dev", agents=("beta", "gamma"), leader="beta")},
        default_agent="alpha",
    )
    config = QueueSettings(backoff_base_seconds=1, backoff_max_seconds=60, lease_seconds=30)
    return Queue(db, config, directory)


@pytest.fixture
def read_only_view(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``(writable, view)``: a folder and a read-only bind mount of it (root only; skipped elsewhere).
    Read-only at the mount, it stops root's writes too, unlike ``chmod``."""
    writable, view = tmp_path / "rw", tmp_path / "view"
    writable.mkdir()
    view.mkdir()
    made = subprocess.run(["mount", "--bind", str(writable), str(view)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {made.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        yield writable, view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test names its tier: an unmarked one is missed by ``make test-fast`` (``-m unit``) and by any run
    that selects tiers, so collection stops with the list of them instead."""
    del config
    unmarked = [item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)]
    if unmarked:
        shown = "\n  ".join(unmarked[:20])
        raise pytest.UsageError(f"tests without a tier marker ({', '.join(TIERS)}):\n  {shown}")


# The scripted agents of the suite report through files beside their script and their test's folder, which
# the agent sandbox hides on purpose: processors started by the tests (in process or as processes that
# inherit this environment) run agents unconfined. tests/e2e/test_sandbox.py gives its processors an
# environment without this variable, so the sandbox is tested as a user gets it.
os.environ.setdefault("AGENTPOST_SANDBOX", "none")
