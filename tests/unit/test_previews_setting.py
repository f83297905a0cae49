"""``[channels.<name>] preview``: which chats the processor writes live previews for (workers/previews.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings.model import load_settings
from tests.homes import write_settings
from workers.previews import previews_on

pytestmark = pytest.mark.unit


def test_on_by_default_where_the_platform_edits_off_on_whatsapp(tmp_path: Path) -> None:
    write_settings(tmp_path, "")
    settings = load_settings(tmp_path, env={})
    assert previews_on(settings, "telegram") and previews_on(settings, "discord")
    assert previews_on(settings, "web") and previews_on(settings, "cli")
    assert not previews_on(settings, "whatsapp")


def test_turned_off_per_channel(tmp_path: Path) -> None:
    write_settings(tmp_path, "[channels.telegram]\npreview = false\n")
    settings = load_settings(tmp_path, env={})
    assert not previews_on(settings, "telegram") and previews_on(settings, "discord")
