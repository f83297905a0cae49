"""An agent added or edited through the API may not take another user's folder as its workspace.

The red team of issue 37 added an agent whose workspace was a root-owned folder; the processor then handed
that folder to the agent user (the sandbox prepares a workspace by changing its owner). A real uvicorn server
and settings.toml on disk: the refusal is a 400 in plain words and leaves the file as it was."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from shared.runtime import Runtime
from tests.web_support import assert_refused

pytestmark = pytest.mark.integration

NOBODY = 65534


def _settings_text(rt: Runtime) -> str:
    return (rt.settings.home / "settings.toml").read_text(encoding="utf-8")


def test_an_existing_folder_of_another_user_is_refused_as_a_workspace(
    api_client: httpx.Client, api_rt: Runtime, tmp_path: Path
) -> None:
    others = tmp_path / "someone-elses"
    others.mkdir()
    if os.geteuid() == 0:
        os.chown(others, NOBODY, NOBODY)
    elif others.stat().st_uid == os.geteuid():
        pytest.skip("a folder of another user cannot be made without root")
    before = _settings_text(api_rt)
    for folder, owner in (("/etc", "root"), (str(others), "")):
        r = api_client.put("/api/agents/evil", json={"name": "Evil", "working_directory": folder})
        assert_refused(r, 400, f"the workspace {folder} of agent 'evil' belongs to {owner}")
        assert "choose a folder agentpost's user owns" in r.json()["error"].lower()
        # The other way in: the settings object, a new agent or an existing one moved.
        for patch in (
            {"agents": {"evil": {"workspace": folder}}},
            {"agents": {"alpha": {"workspace": folder}}},
        ):
            assert_refused(api_client.put("/api/settings", json=patch), 400, "belongs to")
    assert _settings_text(api_rt) == before
    assert "evil" not in api_client.get("/api/agents").json()


def test_own_and_new_folders_are_fine_and_unchanged_workspaces_are_not_rechecked(
    api_client: httpx.Client, api_rt: Runtime, tmp_path: Path
) -> None:
    made_by_agentpost = api_rt.settings.home / "workspace" / "later"
    made_by_agentpost.mkdir(parents=True)
    fresh = tmp_path / "not-there-yet"
    for folder in (str(made_by_agentpost), str(fresh), ""):
        r = api_client.put("/api/agents/coder", json={"name": "Coder", "working_directory": folder})
        assert r.status_code == 200, r.text
    if os.geteuid() != 0:
        mine = tmp_path / "mine"
        mine.mkdir()
        r = api_client.put("/api/agents/coder", json={"name": "Coder", "working_directory": str(mine)})
        assert r.status_code == 200, r.text
    # An agent the operator gave a system folder in settings.toml keeps it across unrelated API edits: the
    # check is about what the API changes.
    text = _settings_text(api_rt) + '\n[agents.ops]\nname = "Ops"\nworkspace = "/etc"\n'
    (api_rt.settings.home / "settings.toml").write_text(text, encoding="utf-8")
    api_rt.refresh_settings(force=True)
    r = api_client.put("/api/agents/ops/system-prompt", json={"content": "be careful"})
    assert r.status_code == 200, r.text
    r = api_client.put("/api/settings", json={"queue": {"max_hops": 6}})
    assert r.status_code == 200, r.text
