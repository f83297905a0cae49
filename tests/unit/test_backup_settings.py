"""The ``[backup]`` settings: durations as the operator writes them, and clear errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings.backup import BackupSettings, format_duration, parse_duration
from shared.settings.model import SettingsError, parse_settings
from shared.storage.backup import Counts, Progress

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1d", 86_400),
        ("12h", 43_200),
        ("30m", 1_800),
        ("90s", 90),
        ("2w", 1_209_600),
        ("1.5h", 5_400),
        (600, 600),
    ],
)
def test_durations_read_as_written(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "1 day", "-1d", "0", "0h", True, "1y"])
def test_a_bad_duration_is_refused_with_the_forms_that_work(text: object) -> None:
    with pytest.raises(ValueError, match=r"duration|longer than zero"):
        parse_duration(text)


def test_durations_are_shown_in_their_largest_whole_unit() -> None:
    assert [format_duration(s) for s in (86_400, 43_200, 5_400, 90, 1_209_600)] == [
        "1d",
        "12h",
        "90m",
        "90s",
        "2w",
    ]


def test_the_backup_section_defaults_and_its_folder(tmp_path: Path) -> None:
    home = tmp_path / "home"
    default = BackupSettings()
    assert (default.enabled, default.every, default.keep) == (True, 86_400.0, 7)
    assert default.folder(home) == home / "backups"
    assert BackupSettings(dir="copies").folder(home) == home / "copies"
    assert BackupSettings(dir="/srv/b").folder(home) == Path("/srv/b")
    settings = parse_settings(home, home / "settings.toml", '[backup]\nevery = "6h"\nkeep = 3\n', {})
    assert settings.file.backup.every == 21_600 and settings.file.backup.keep == 3


def test_a_wrong_backup_setting_names_the_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with pytest.raises(SettingsError, match=r"backup\.every") as err:
        parse_settings(home, home / "settings.toml", '[backup]\nevery = "daily"\n', {})
    assert "1d" in str(err.value)
    with pytest.raises(SettingsError, match=r"backup\.keep"):
        parse_settings(home, home / "settings.toml", "[backup]\nkeep = 0\n", {})
    with pytest.raises(SettingsError, match=r"backup\.often"):
        parse_settings(home, home / "settings.toml", "[backup]\noften = 1\n", {})


def test_counts_and_progress_read_as_a_person_reads_them() -> None:
    counts = Counts(
        messages={"completed": 100, "pending": 20}, responses={"acked": 80}, events=500, agents=2, chats=5
    )
    assert counts.lines()[0] == "messages: 120 (completed 100, pending 20)"
    assert counts.lines()[1] == "replies: 80 (acked 80)"
    assert not counts.empty and Counts().empty and Counts().lines()[0] == "messages: 0"
    assert Progress(1, 4, "pages").percent == 25 and Progress(0, 0, "tables").percent == 100
