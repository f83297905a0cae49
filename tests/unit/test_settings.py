"""Settings: defaults, environment overrides, and errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings import SettingsError, load_settings, write_starter_settings

pytestmark = pytest.mark.unit


def write(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "settings.toml"
    path.write_text(text)
    return path


def test_defaults_without_a_file(tmp_path: Path) -> None:
    s = load_settings(tmp_path, env={})
    assert s.database_url == f"sqlite:///{tmp_path / 'agentpost.db'}"
    assert (s.api.host, s.api.port, s.api.token) == ("127.0.0.1", 3777, "")
    assert list(s.agents) == ["assistant"] and s.queue.max_retries == 5 and s.queue.manual_retry_budget == 3
    assert s.workspace("assistant") == tmp_path / "workspace" / "assistant"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    write(tmp_path, '[api]\nport = 4000\ntoken = "file"\n[database]\nurl = "sqlite:////tmp/x.db"\n')
    env = {
        "AGENTPOST_DATABASE_URL": "postgresql://u@h/db",
        "AGENTPOST_API_PORT": "5111",
        "AGENTPOST_API_TOKEN": "secret",
    }
    s = load_settings(tmp_path, env=env)
    assert (s.database_url, s.api.port, s.api.token) == ("postgresql://u@h/db", 5111, "secret")
    assert load_settings(tmp_path, env={}).api.port == 4000


def test_home_comes_from_agentpost_home(tmp_path: Path) -> None:
    write(tmp_path / "h", "[queue]\nmax_retries = 7\n")
    s = load_settings(env={"AGENTPOST_HOME": str(tmp_path / "h")})
    assert s.home == tmp_path / "h" and s.queue.max_retries == 7


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[queue]\nmax_retries = 0\n", "queue.max_retries"),
        ("[queue]\nmax_retrys = 3\n", "queue.max_retrys"),
        ("[api]\nport = 'x'\n", "api.port"),
        ("[agents.coder]\nprovider = 'gpt'\n", "agents.coder.provider"),
        ("[agents.Coder]\n", "agents"),
        ("[agents.c]\nprovider = 'command'\n", "agents.c"),
        ("[teams.dev]\nagents = ['a']\nleader = 'b'\n", "teams.dev"),
        ("[agents.a]\n[teams.dev]\nagents = ['a', 'zz']\nleader = 'a'\n", "(top level)"),
        ("bogus = 1\n", "bogus"),
    ],
)
def test_bad_settings_name_the_key_and_the_file(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path, env={})
    assert str(path) in str(err.value) and key in str(err.value)


def test_unknown_default_agent_and_bad_env_port(tmp_path: Path) -> None:
    write(tmp_path, "[queue]\ndefault_agent = 'nobody'\n[agents.coder]\n")
    with pytest.raises(SettingsError, match="default_agent"):
        load_settings(tmp_path, env={})
    write(tmp_path, "")
    with pytest.raises(SettingsError, match="AGENTPOST_API_PORT"):
        load_settings(tmp_path, env={"AGENTPOST_API_PORT": "http"})
    with pytest.raises(SettingsError, match="AGENTPOST_API_PORT"):
        load_settings(tmp_path, env={"AGENTPOST_API_PORT": "70000"})


def test_invalid_toml_is_reported_with_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[queue\n")
    with pytest.raises(SettingsError, match="not valid TOML") as err:
        load_settings(tmp_path, env={})
    assert str(path) in str(err.value)


def test_starter_file_is_valid_and_not_overwritten(tmp_path: Path) -> None:
    path = write_starter_settings(tmp_path)
    s = load_settings(tmp_path, env={})
    assert list(s.agents) == ["assistant"] and s.agents["assistant"].provider == "claude"
    assert "# " in path.read_text()
    with pytest.raises(SettingsError, match="already exists"):
        write_starter_settings(tmp_path)
    write_starter_settings(tmp_path, force=True)


def test_relative_workspaces_are_under_the_home_folder(tmp_path: Path) -> None:
    from shared.settings import load_settings

    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text(
        'workspace_dir = "ws"\n[agents.a]\nprovider = "command"\ncommand = ["true"]\nworkspace = "rel/a"\n'
        '[agents.b]\nprovider = "command"\ncommand = ["true"]\n[queue]\ndefault_agent = "a"\n'
    )
    settings = load_settings(home, env={})
    assert settings.workspace("a") == home / "rel" / "a"
    assert settings.workspace("b") == home / "ws" / "b"
