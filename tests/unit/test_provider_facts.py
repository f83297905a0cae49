"""The facts about each provider kind (:mod:`shared.settings.providers`) agree with the settings literal and
with the tables derived from them."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from shared.settings.model import AgentSettings
from shared.settings.providers import PROVIDER_FACTS, ProviderKind
from shared.settings.starter import STARTER_SETTINGS

pytestmark = pytest.mark.unit


def test_the_literal_names_every_kind_with_facts_in_order() -> None:
    assert get_args(ProviderKind) == tuple(PROVIDER_FACTS)
    assert get_args(AgentSettings.model_fields["provider"].annotation) == tuple(PROVIDER_FACTS)


def test_each_kind_is_keyed_by_its_own_name() -> None:
    assert all(name == facts.name for name, facts in PROVIDER_FACTS.items())


def test_the_starter_settings_list_every_kind() -> None:
    assert 'provider = "claude"           # claude | codex | command\n' in STARTER_SETTINGS


def test_a_kind_with_a_cli_of_its_own_says_where_to_find_it() -> None:
    for facts in PROVIDER_FACTS.values():
        assert bool(facts.binary) == bool(facts.binary_env) == bool(facts.not_found)
        assert bool(facts.login_env or facts.login_files) == bool(facts.login_hint)


def test_every_kind_with_facts_has_a_provider_class_of_that_name() -> None:
    from workers.providers.registry import PROVIDERS

    assert tuple(PROVIDERS) == tuple(PROVIDER_FACTS)
    assert all(cls.name == name for name, cls in PROVIDERS.items())


def test_the_tables_derived_from_the_facts_hold_what_they_held_when_written_out() -> None:
    from adapters.web.dialect import TINYAGI_PROVIDER
    from adapters.web.manage import PROVIDERS
    from scheduler.process_plan import PROVIDER_PREFIXES

    assert TINYAGI_PROVIDER == {"claude": "anthropic", "codex": "openai"}
    assert PROVIDERS == {
        "anthropic": "claude",
        "claude": "claude",
        "openai": "codex",
        "codex": "codex",
        "command": "command",
    }
    assert sorted(PROVIDER_PREFIXES) == sorted(
        ("ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_", "AWS_", "VERTEX_REGION_", "AZURE_OPENAI_")
    )


def test_up_hands_the_processor_every_variable_an_agents_cli_may_get() -> None:
    # What passes_to_agent lets through must reach the processor under `up` first (Vertex's regions, Azure
    # OpenAI's settings, Claude Code's own names such as CLOUD_ML_REGION), or an agent gets it only when
    # the processor is started by hand.
    from scheduler.process_plan import PROVIDER_NAMES, PROVIDER_PREFIXES
    from workers.agent_env import passes_to_agent

    for name in ["VERTEX_REGION_CLAUDE_3_7_SONNET", "CLOUD_ML_REGION", "DISABLE_TELEMETRY"]:
        assert passes_to_agent(name, "claude")
        assert name in PROVIDER_NAMES or name.startswith(PROVIDER_PREFIXES), name
    assert passes_to_agent("AZURE_OPENAI_API_KEY", "codex")
    assert "AZURE_OPENAI_API_KEY".startswith(PROVIDER_PREFIXES)


def test_up_finds_a_cli_where_the_processor_does_and_says_what_is_missing(tmp_path: Path) -> None:
    from scheduler.process_plan import provider_problems
    from shared.settings.model import parse_settings

    text = '[agents.assistant]\nprovider = "claude"\n[agents.b]\nprovider = "codex"\n'
    path = tmp_path / "settings.toml"
    path.write_text(text)
    settings = parse_settings(tmp_path, path, text, {})
    env = {"PATH": str(tmp_path / "nowhere"), "HOME": str(tmp_path)}
    assert [p for p in provider_problems(settings, env) if p.startswith("agent b ")] == [
        "agent b (codex): the codex CLI was not found on PATH",
        "agent b (codex): not logged in; run `codex login` or set OPENAI_API_KEY",
    ]
    codex = tmp_path / "codex"
    codex.write_text("#!/bin/sh\n")
    codex.chmod(0o755)
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "auth.json").write_text("{}")
    env.update(AGENTPOST_CODEX_BIN=str(codex), AGENTPOST_CLAUDE_BIN=str(codex), ANTHROPIC_AUTH_TOKEN="token")
    assert provider_problems(settings, env) == []
