"""``python -m tests.netns down`` against the real PostgreSQL server when no two-host run left anything: it
changes nothing and reloads nothing (its editing of pg_hba.conf and its choice of ALTER SYSTEM statement are
tested in tests/unit/test_netns_down.py; a server whose configuration a run left is never made here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.netns import ADMIN_PG_URL, exclusive, restore_postgres
from tests.probes import service_unavailable

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.serial]


@pytest.fixture
def admin() -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    try:
        conn = psycopg.connect(ADMIN_PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        service_unavailable("PostgreSQL", exc)
    with conn:
        yield conn


def _state(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[object, ...]:
    return (
        conn.execute("SHOW listen_addresses").fetchone(),
        conn.execute("SELECT pg_conf_load_time()").fetchone(),
        conn.execute(
            "SELECT sourcefile, seqno, setting FROM pg_file_settings WHERE name = 'listen_addresses' ORDER BY seqno"
        ).fetchall(),
    )


def test_down_changes_and_reloads_nothing_when_no_run_left_anything(
    admin: psycopg.Connection[tuple[object, ...]], tmp_path: Path
) -> None:
    try:
        with exclusive(wait=False):  # a two-host run in progress has its addresses there, rightly
            listen = [
                str(r[0])
                for r in admin.execute(
                    "SELECT setting FROM pg_file_settings WHERE name = 'listen_addresses'"
                ).fetchall()
            ]
            if any(a.strip().startswith("10.231.0.") for v in listen for a in v.split(",")):
                pytest.skip(f"a killed two-host run left listen_addresses = {listen}: run tests.netns down")
            hba = tmp_path / "pg_hba.conf"  # a copy: the server's own file is never written by a test
            hba.write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
            before = _state(admin)
            done = restore_postgres(admin, hba)
            assert _state(admin) == before  # pg_conf_load_time too: no reload
            assert done == ["PostgreSQL's configuration holds nothing of a run: left as it is"]
            assert hba.read_text() == "local all all trust\nhost all all 127.0.0.1/32 trust\n"
    except BlockingIOError:
        pytest.skip("a two-host run holds the lock: its configuration is in use")
