"""Channel sections (shared.settings.channels): a third-party channel's section is checked with its plugin's own model."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings.model import SettingsError, load_settings
from tests.homes import write_settings

pytestmark = pytest.mark.unit


def test_a_third_party_channel_section_is_checked_with_its_plugin_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A channel installed by another package (an ``agentpost.channels`` entry point) brings its model."""
    from shared.settings import channels

    site = tmp_path / "site"
    (site / "roomchat-1.0.dist-info").mkdir(parents=True)
    (site / "roomchat-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: roomchat\nVersion: 1.0\n"
    )
    (site / "roomchat-1.0.dist-info" / "entry_points.txt").write_text(
        "[agentpost.channels]\nroomchat = roomchat_plugin:RoomChannel\n"
    )
    (site / "roomchat_plugin.py").write_text(
        "from shared.settings.channels import ChannelSettings\n"
        "class RoomSettings(ChannelSettings):\n    room: str = ''\n"
        "class RoomChannel:\n    settings_model = RoomSettings\n"
    )
    monkeypatch.syspath_prepend(str(site))
    channels._plugin_model.cache_clear()
    try:
        write_settings(tmp_path / "home", '[channels.roomchat]\nroom = "ops"\nbusy_policy = "followup"\n')
        s = load_settings(tmp_path / "home", env={})
        assert s.channels["roomchat"].model_dump()["room"] == "ops"
        write_settings(tmp_path / "home", '[channels.roomchat]\nrooom = "ops"\n')
        with pytest.raises(SettingsError, match=r"channels\.roomchat\.rooom: unknown key"):
            load_settings(tmp_path / "home", env={})
    finally:
        channels._plugin_model.cache_clear()
