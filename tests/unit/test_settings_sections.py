"""The sections each process reads (shared.settings.sections): every command refuses what a process would refuse at its start, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings.model import SettingsError, load_settings
from tests.homes import write_settings

pytestmark = pytest.mark.unit


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
        ("[channels.whatsapp]\npreview = true\n", "channels.whatsapp.preview"),
        ('[channels.telegram]\npreview = "yes please"\n', "channels.telegram.preview"),
        ('[channels.web]\nbusy_policy = "later"\n', "channels.web.busy_policy"),
        ("[channels]\ntelegram = 5\n", "channels.telegram: must be a table"),
        ("[heartbeats.nobody]\ninterval = 60\n", "heartbeats.nobody: unknown agent"),
        ('[heartbeats.assistant]\ncron = "99 * * * *"\n', "heartbeats.assistant.cron"),
        ('[[schedules]]\nagent = "ghost"\nmessage = "x"\ncron = "* * * * *"\n', "schedules.0.agent"),
        (
            '[[schedules]]\nagent = "assistant"\nmessage = "x"\ncron = "0 9 * * *"\n' * 2,
            "schedules.1: two schedules are the same",
        ),
        ("[retention]\nusage_days = 7\n", "retention.usage_days"),
        ("[retention]\nkeep_days = 7\n", "retention.keep_days: unknown key"),
        ("[retention]\nbatch_rows = 0\n", "retention.batch_rows"),
        (
            "[retention]\nmessages_days = 0.001\n",
            "retention.messages_days: must be longer than scheduler.catchup_seconds",
        ),
    ],
)
def test_a_process_section_is_refused_when_loaded(tmp_path: Path, text: str, key: str) -> None:
    """What the processor, the scheduler or an adapter refuses at its start, every command refuses."""
    path = write_settings(tmp_path, text)
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path, env={})
    assert str(path) in str(err.value) and key in str(err.value)
    assert err.value.fix == "correct the key(s) named above"


def test_every_bad_section_is_named_at_once(tmp_path: Path) -> None:
    write_settings(
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
    from adapters.platform import channel_config
    from adapters.telegram import TelegramChannel
    from scheduler.config import load_heartbeats, load_scheduler_config, load_schedules
    from workers.processor_config import ProcessorSettings

    write_settings(
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
    assert channel_config(TelegramChannel, s) == s.channels["telegram"]
    assert s.channels["web"].model_dump()["busy_policy"] == "interrupt"


def test_the_example_settings_file_passes_every_section_check(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "settings.example.toml"
    write_settings(tmp_path, example.read_text(encoding="utf-8"))
    s = load_settings(tmp_path, env={})
    assert s.heartbeats and s.schedules  # the sections the scheduler reads were checked, not skipped


def test_retention_falls_back_to_the_older_settings_it_leaves_unset(tmp_path: Path) -> None:
    from shared.queue.retention import DAY_MS, RetentionPolicy, events_ttl_ms

    write_settings(tmp_path, "[scheduler]\ncompleted_max_age_hours = 48\n[retention]\nreplies_days = 3\n")
    settings = load_settings(tmp_path, env={})
    policy = RetentionPolicy.from_settings(settings)
    assert (policy.messages_ms, policy.replies_ms) == (2 * DAY_MS, 3 * DAY_MS)
    assert (policy.chat_room_ms, policy.usage_ms, policy.batch) == (90 * DAY_MS, 730 * DAY_MS, 500)
    assert events_ttl_ms(settings) == 3 * DAY_MS  # [events] ttl_hours = 72
