"""``python -m tests.netns down`` puts back what a killed two-host run left in PostgreSQL's configuration:
the pg_hba.conf line (on a copy of a pg_hba file here, never the server's) and the addresses the run added
to ``listen_addresses``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.netns import HBA_MARK, SUBNET, _parser, listen_restore, remove_hba_lines

pytestmark = pytest.mark.unit

HBA = (
    "# TYPE  DATABASE  USER  ADDRESS  METHOD\n"
    "local all all trust\n"
    "host all all 127.0.0.1/32 trust\n"
    "# agentpost keeps its own lines apart\n"
)


def test_the_marked_lines_go_and_every_other_line_stays_as_it_was(tmp_path: Path) -> None:
    hba = tmp_path / "pg_hba.conf"
    # As PgListen adds it, twice (two killed runs), and once in the middle of the file.
    ours = f"host all all {SUBNET} trust {HBA_MARK}\n"
    hba.write_text(HBA[:40] + ours + HBA[40:] + ours + ours)
    hba.chmod(0o640)
    assert remove_hba_lines(hba) == 3
    assert hba.read_text() == HBA
    assert hba.stat().st_mode & 0o777 == 0o640


def test_a_file_without_the_mark_is_not_written(tmp_path: Path) -> None:
    hba = tmp_path / "pg_hba.conf"
    hba.write_text(HBA)
    before = hba.stat().st_mtime_ns
    assert remove_hba_lines(hba) == 0
    assert hba.read_text() == HBA and hba.stat().st_mtime_ns == before


@pytest.mark.parametrize(
    ("settings", "statement"),
    [
        ([("127.0.0.1", False)], None),  # never changed by ALTER SYSTEM
        ([("127.0.0.1", False), ("*", True)], None),  # someone's own ALTER SYSTEM value: not ours
        (
            [("127.0.0.1", False), ("127.0.0.1,10.231.0.1,10.231.0.5", True)],
            "ALTER SYSTEM RESET listen_addresses",
        ),
        ([("10.231.0.1,10.231.0.5", True)], "ALTER SYSTEM RESET listen_addresses"),
        (
            [("127.0.0.1", False), ("*,10.231.0.1,10.231.0.5", True)],
            "ALTER SYSTEM SET listen_addresses = '*'",
        ),
        ([("localhost,10.231.0.1", True)], "ALTER SYSTEM RESET listen_addresses"),  # the default stays
        # Only the newest line of each kind counts, as for the server.
        (
            [("127.0.0.1", False), ("localhost", False), ("localhost,10.231.0.5", True)],
            "ALTER SYSTEM RESET listen_addresses",
        ),
    ],
)
def test_listen_addresses_lose_only_the_links_addresses(
    settings: list[tuple[str, bool]], statement: str | None
) -> None:
    assert listen_restore(settings) == statement


def test_down_help_says_what_it_changes_and_that_it_never_restarts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--help"], ["down", "--help"]):
        with pytest.raises(SystemExit):
            _parser().parse_args(argv)
    text = " ".join(capsys.readouterr().out.split())
    assert "pg_hba.conf line" in text and "listen_addresses" in text and "never restarts it" in text
    assert "--hba-file" in text and "never restarts PostgreSQL" in text
