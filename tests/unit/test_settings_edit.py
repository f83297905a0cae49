"""Edits to settings.toml (shared.settings.edit): an edit a process would refuse is refused before it is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings.model import SettingsError, load_settings
from tests.homes import write_settings

pytestmark = pytest.mark.unit


def test_an_edit_the_processor_would_refuse_is_refused(tmp_path: Path) -> None:
    from shared.settings.edit import merge_settings

    path = write_settings(tmp_path, "# mine\n[queue]\nmax_retries = 4\n")
    settings = load_settings(tmp_path, env={})
    with pytest.raises(SettingsError, match=r"processor\.busy_policy"):
        merge_settings(settings, {"processor": {"busy_policy": "sometimes"}})
    with pytest.raises(SettingsError, match=r"channels\.telegram\.tokn_env"):
        merge_settings(settings, {"channels": {"telegram": {"tokn_env": "X"}}})
    assert path.read_text() == "# mine\n[queue]\nmax_retries = 4\n"
    merge_settings(settings, {"processor": {"busy_policy": "interrupt"}})
    assert load_settings(tmp_path, env={}).processor.busy_policy == "interrupt"
