"""Settings: defaults, environment overrides, and errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings.model import SettingsError, load_settings
from shared.settings.starter import write_starter_settings
from tests.homes import write_settings

pytestmark = pytest.mark.unit


def test_defaults_without_a_file(tmp_path: Path) -> None:
    s = load_settings(tmp_path, env={})
    assert s.database_url == f"sqlite:///{tmp_path / 'agentpost.db'}"
    assert (s.api.host, s.api.port, s.api.token) == ("127.0.0.1", 3777, "")
    assert list(s.agents) == ["assistant"] and s.queue.max_retries == 5 and s.queue.manual_retry_budget == 3
    assert s.workspace("assistant") == tmp_path / "workspace" / "assistant"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    write_settings(tmp_path, '[api]\nport = 4000\ntoken = "file"\n[database]\nurl = "sqlite:////tmp/x.db"\n')
    env = {
        "AGENTPOST_DATABASE_URL": "postgresql://u@h/db",
        "AGENTPOST_API_PORT": "5111",
        "AGENTPOST_API_TOKEN": "secret",
    }
    s = load_settings(tmp_path, env=env)
    assert (s.database_url, s.api.port, s.api.token) == ("postgresql://u@h/db", 5111, "secret")
    assert load_settings(tmp_path, env={}).api.port == 4000


def test_home_comes_from_agentpost_home(tmp_path: Path) -> None:
    write_settings(tmp_path / "h", "[queue]\nmax_retries = 7\n")
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
    path = write_settings(tmp_path, text)
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path, env={})
    assert str(path) in str(err.value) and key in str(err.value)


def test_unknown_default_agent_and_bad_env_port(tmp_path: Path) -> None:
    write_settings(tmp_path, "[queue]\ndefault_agent = 'nobody'\n[agents.coder]\n")
    with pytest.raises(SettingsError, match="default_agent"):
        load_settings(tmp_path, env={})
    write_settings(tmp_path, "")
    with pytest.raises(SettingsError, match="AGENTPOST_API_PORT"):
        load_settings(tmp_path, env={"AGENTPOST_API_PORT": "http"})
    with pytest.raises(SettingsError, match="AGENTPOST_API_PORT"):
        load_settings(tmp_path, env={"AGENTPOST_API_PORT": "70000"})


def test_invalid_toml_is_reported_with_the_file(tmp_path: Path) -> None:
    path = write_settings(tmp_path, "[queue\n")
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
    from shared.settings.model import load_settings

    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text(
        'workspace_dir = "ws"\n[agents.a]\nprovider = "command"\ncommand = ["true"]\nworkspace = "rel/a"\n'
        '[agents.b]\nprovider = "command"\ncommand = ["true"]\n[queue]\ndefault_agent = "a"\n'
    )
    settings = load_settings(home, env={})
    assert settings.workspace("a") == home / "rel" / "a"
    assert settings.workspace("b") == home / "ws" / "b"


# -- a file that is not TOML ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "where", "shown"),
    [
        # The value is missing at the very end: tomllib says only "at end of document".
        ("[processor]\nbusy_policy = ", "line 2, column 15 (the end of the file)", "  2 | busy_policy = "),
        ("[processor]\nbusy_policy = \n\n", "line 2, column 15", "  2 | busy_policy = "),
        ("[queue]\nmax_retries = 3\nlease_seconds = 3O\n", "line 3, column 18", "  3 | lease_seconds = 3O"),
        ('[queue]\nlease_seconds = "x\n', "line 2, column 19", '  2 | lease_seconds = "x'),
        ("[queue\n", "line 1, column 7", "  1 | [queue"),
    ],
)
def test_a_toml_syntax_error_names_the_line_and_column(
    tmp_path: Path, text: str, where: str, shown: str
) -> None:
    path = write_settings(tmp_path, text)
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path, env={})
    message = str(err.value)
    assert message.startswith(f"{path} is not valid TOML at {where}: "), message
    assert "end of document" not in message
    source, caret = message.splitlines()[1:]
    assert source == shown
    column = int(where.split("column ")[1].split()[0])
    assert caret.index("^") - caret.index("|") - 1 == column  # the caret sits under the column
    line = where.split()[1].rstrip(",")
    assert err.value.fix == f"fix the TOML syntax on line {line} of {path}"
    assert "key" not in err.value.fix


def test_doctor_tells_how_to_fix_each_kind_of_settings_error(tmp_path: Path) -> None:
    from shared.cli.doctor import check_settings

    write_settings(tmp_path, "[processor]\nbusy_policy = ")
    settings, (found,) = check_settings(tmp_path)
    assert settings is None and found.level == "fail"
    assert "line 2, column 15" in found.detail and found.fix.startswith("fix the TOML syntax on line 2")
    write_settings(tmp_path, '[processor]\nbusy_policy = "x"\n')
    settings, (found,) = check_settings(tmp_path)
    assert settings is None and found.level == "fail"
    assert "processor.busy_policy" in found.detail and found.fix == "correct the key(s) named above"
