"""``agentpost agent ...`` and ``agentpost team ...`` against a real settings file and database, and the
session bookkeeping a reset relies on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from shared.chat.sessions import clear_sessions, get_session, set_session
from shared.runtime import open_runtime
from shared.settings.model import load_settings
from shared.settings.starter import write_starter_settings
from workers.commands import register

pytestmark = pytest.mark.integration


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    write_starter_settings(home)
    return home


def _cli(home: Path, *args: str) -> tuple[int, str]:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, list(args), env={"AGENTPOST_HOME": str(home), "COLUMNS": "200"})
    return result.exit_code, result.output


def test_agent_and_team_commands_edit_settings_and_keep_comments(home: Path) -> None:
    assert _cli(home, "agent", "add", "coder", "--model", "sonnet", "--session-scope", "conversation")[0] == 0
    code, out = _cli(
        home, "agent", "add", "runner", "--provider", "command", "--command", "echo", "--command", "{prompt}"
    )
    assert code == 0, out
    assert _cli(home, "team", "add", "dev", "--agent", "assistant,coder", "--leader", "coder")[0] == 0
    text = (home / "settings.toml").read_text()
    assert (
        "# agentpost settings." in text and "# One block per agent." in text
    )  # the operator's comments stay
    settings = load_settings(home, env={})
    assert (
        settings.agents["coder"].model == "sonnet"
        and settings.agents["coder"].session_scope == "conversation"
    )
    assert settings.agents["runner"].command == ["echo", "{prompt}"]
    assert settings.teams["dev"].leader == "coder"
    code, out = _cli(home, "agent", "list", "--json")
    assert code == 0 and {a["agent"] for a in json.loads(out)} == {"assistant", "coder", "runner"}
    code, out = _cli(home, "team", "list", "--json")
    assert json.loads(out) == [{"team": "dev", "leader": "coder", "agents": ["assistant", "coder"]}]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("agent", "add", "Bad/Name"), "invalid agent name"),
        (("agent", "add", "assistant"), "already exists"),
        (("agent", "add", "x", "--provider", "bogus"), "agents.x.provider"),
        (("agent", "add", "y", "--provider", "command"), "needs a non-empty 'command'"),
        (("agent", "remove", "assistant"), "default agent"),
        (("agent", "remove", "ghost"), "no agent"),
        (("team", "add", "t1", "--agent", "ghost"), "unknown agent"),
        (("team", "add", "t2", "--agent", "assistant", "--leader", "other"), "must be one of the members"),
        (("team", "remove", "nope"), "no team"),
    ],
)
def test_commands_refuse_bad_input_and_leave_the_file_alone(
    home: Path, args: tuple[str, ...], message: str
) -> None:
    before = (home / "settings.toml").read_text()
    code, out = _cli(home, *args)
    assert code != 0
    assert message in " ".join(out.split()), out
    assert (home / "settings.toml").read_text() == before


def test_remove_agent_in_a_team_is_refused_until_the_team_goes(home: Path) -> None:
    _cli(home, "agent", "add", "coder")
    _cli(home, "team", "add", "dev", "--agent", "assistant", "--agent", "coder")
    code, out = _cli(home, "agent", "remove", "coder")
    assert code != 0 and "member of team" in out
    assert _cli(home, "team", "remove", "dev")[0] == 0
    assert _cli(home, "agent", "remove", "coder")[0] == 0
    assert set(load_settings(home, env={}).agents) == {"assistant"}


def test_reset_forgets_the_session_and_a_run_in_flight_cannot_bring_it_back(home: Path) -> None:
    with open_runtime(home, env={}) as rt:
        set_session(rt.db, "assistant", "", "sess-1")
        assert get_session(rt.db, "assistant") == "sess-1"
        started_at = 0  # a run that began before the reset below
        code, out = _cli(home, "agent", "reset", "assistant")
        assert code == 0 and "1 session(s) forgotten" in " ".join(out.split())
        assert get_session(rt.db, "assistant") is None
        assert not set_session(rt.db, "assistant", "", "sess-old", started_at=started_at)
        assert get_session(rt.db, "assistant") is None
        assert set_session(rt.db, "assistant", "", "sess-2", started_at=10**15)  # a run started after it
        assert get_session(rt.db, "assistant") == "sess-2"
        assert clear_sessions(rt.db, "assistant", "telegram:1") == 0
        assert get_session(rt.db, "assistant") == "sess-2"
        events = rt.db.read("SELECT type, payload FROM events WHERE type = 'agent_reset'")
        assert len(events) == 2
