"""Provider arguments: how a chat's upload folder is made readable to the claude CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.provider_clis import read_access

pytestmark = pytest.mark.unit


def test_read_access_arguments() -> None:
    assert read_access(Path("/srv/agentpost/files/telegram/42")) == [
        "--allowedTools",
        "Read(//srv/agentpost/files/telegram/42/**)",
    ]
    # A path the permission-rule syntax cannot carry falls back to --add-dir.
    assert read_access(Path("/srv/my home/files/telegram/42")) == [
        "--add-dir",
        "/srv/my home/files/telegram/42",
    ]
    assert read_access(Path("/srv/a,b(c)/x")) == ["--add-dir", "/srv/a,b(c)/x"]
