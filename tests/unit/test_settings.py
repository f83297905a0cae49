"""Settings: defaults, environment overrides, and errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings.model import SettingsError, load_settings, write_starter_settings

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


# -- the sections one process reads are checked by every command --------------------------------------------
@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[processor]\nbusy_policy = "x"\n', "processor.busy_policy"),
        ('[processor]\nagents = ["nobody"]\n', "processor.agents: unknown agent 'nobody' (known: assistant)"),
        ('[processor]\nagents = ["Bad Name"]\n', "processor.agents: Value error, agent name 'Bad Name'"),
        (
            '[processor]\nagents = ["assistant", "assistant"]\n',
            "processor.agents: Value error, assistant listed more",
        ),
        ("[processor]\nmax_concurency = 2\n", "processor.max_concurency: unknown key"),
        ("[scheduler]\nprune_every = 5\n", "scheduler.prune_every: unknown key"),
        ("[scheduler.dlq]\nmax_entries = 0\n", "scheduler.dlq.max_entries"),
        ('[channels.telegram]\nparse_mode = "BBCode"\n', "channels.telegram.parse_mode"),
        ('[channels.telegram]\nbot_token = "123:abc"\n', "channels.telegram.bot_token: unknown key"),
        ("[channels.discord]\ncatch_up_windw_hours = 1\n", "channels.discord.catch_up_windw_hours"),
        ('[channels.whatsapp]\napi_version = "21"\n', "channels.whatsapp.api_version"),
        ('[channels.web]\nbusy_policy = "later"\n', "channels.web.busy_policy"),
        ("[channels]\ntelegram = 5\n", "channels.telegram: must be a table"),
        ("[heartbeats.nobody]\ninterval = 60\n", "heartbeats.nobody: unknown agent"),
        ('[heartbeats.assistant]\ncron = "99 * * * *"\n', "heartbeats.assistant.cron"),
        ('[[schedules]]\nagent = "ghost"\nmessage = "x"\ncron = "* * * * *"\n', "schedules.0.agent"),
        (
            '[[schedules]]\nagent = "assistant"\nmessage = "x"\ncron = "0 9 * * *"\n' * 2,
            "schedules.1: two schedules are the same",
        ),
    ],
)
def test_a_process_section_is_refused_when_loaded(tmp_path: Path, text: str, key: str) -> None:
    """What the processor, the scheduler or an adapter refuses at its start, every command refuses."""
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path, env={})
    assert str(path) in str(err.value) and key in str(err.value)
    assert err.value.fix == "correct the key(s) named above"


def test_every_bad_section_is_named_at_once(tmp_path: Path) -> None:
    write(
        tmp_path,
        '[processor]\nbusy_policy = "x"\n[scheduler]\ntimezone = "Mars/Olympus"\n'
        "[channels.telegram]\nparse_mod = 1\n[heartbeats.nobody]\ninterval = 5\n",
    )
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path, env={})
    assert [p.split(":")[0] for p in err.value.problems] == [
        "processor.busy_policy",
        "scheduler.timezone",
        "channels.telegram.parse_mod",
        "heartbeats.nobody",
    ]


def test_process_sections_are_given_to_the_processes_validated(tmp_path: Path) -> None:
    from adapters.telegram import TelegramChannel
    from scheduler.config import load_heartbeats, load_scheduler_config, load_schedules
    from workers.processor_config import ProcessorSettings

    write(
        tmp_path,
        '[processor]\nbusy_policy = "followup"\nmax_concurrency = 2\n'
        '[scheduler]\ntimezone = "Europe/Berlin"\n[heartbeats.assistant]\ninterval = 60\n'
        '[[schedules]]\nagent = "assistant"\nmessage = "standup"\ncron = "0 9 * * 1-5"\n'
        "[channels.telegram]\nenabled = false\nparse_mode = 'HTML'\n"
        "[channels.web]\nbusy_policy = 'interrupt'\n",
    )
    s = load_settings(tmp_path, env={})
    assert s.section("processor", ProcessorSettings) == s.processor
    assert (s.processor.busy_policy, s.processor.max_concurrency) == ("followup", 2)
    assert load_scheduler_config(s).timezone == "Europe/Berlin"
    assert load_heartbeats(s)["assistant"].interval == 60
    assert [e.message for e in load_schedules(s)] == ["standup"]
    # The adapter reads its section with the model the load checked it with (enabled = false included:
    # `agentpost up` reads it to leave the channel out).
    assert TelegramChannel.load_config(s) == s.channels["telegram"]
    assert s.channels["web"].model_dump()["busy_policy"] == "interrupt"


def test_an_edit_the_processor_would_refuse_is_refused(tmp_path: Path) -> None:
    from shared.settings.edit import merge_settings

    path = write(tmp_path, "# mine\n[queue]\nmax_retries = 4\n")
    settings = load_settings(tmp_path, env={})
    with pytest.raises(SettingsError, match=r"processor\.busy_policy"):
        merge_settings(settings, {"processor": {"busy_policy": "sometimes"}})
    with pytest.raises(SettingsError, match=r"channels\.telegram\.tokn_env"):
        merge_settings(settings, {"channels": {"telegram": {"tokn_env": "X"}}})
    assert path.read_text() == "# mine\n[queue]\nmax_retries = 4\n"
    merge_settings(settings, {"processor": {"busy_policy": "interrupt"}})
    assert load_settings(tmp_path, env={}).processor.busy_policy == "interrupt"


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
    path = write(tmp_path, text)
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

    write(tmp_path, "[processor]\nbusy_policy = ")
    settings, (found,) = check_settings(tmp_path)
    assert settings is None and found.level == "fail"
    assert "line 2, column 15" in found.detail and found.fix.startswith("fix the TOML syntax on line 2")
    write(tmp_path, '[processor]\nbusy_policy = "x"\n')
    settings, (found,) = check_settings(tmp_path)
    assert settings is None and found.level == "fail"
    assert "processor.busy_policy" in found.detail and found.fix == "correct the key(s) named above"


def test_the_example_settings_file_passes_every_section_check(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "settings.example.toml"
    write(tmp_path, example.read_text(encoding="utf-8"))
    s = load_settings(tmp_path, env={})
    assert s.heartbeats and s.schedules  # the sections the scheduler reads were checked, not skipped


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
        write(tmp_path / "home", '[channels.roomchat]\nroom = "ops"\nbusy_policy = "followup"\n')
        s = load_settings(tmp_path / "home", env={})
        assert s.channels["roomchat"].model_dump()["room"] == "ops"
        write(tmp_path / "home", '[channels.roomchat]\nrooom = "ops"\n')
        with pytest.raises(SettingsError, match=r"channels\.roomchat\.rooom: unknown key"):
            load_settings(tmp_path / "home", env={})
    finally:
        channels._plugin_model.cache_clear()
