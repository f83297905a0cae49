"""Which hosts an agent's run may reach (workers/egress_policy.py): the names an operator writes, the AI
service each provider gets by default, and the rule that the machine's own services stay closed unless named
by their exact ``host:port``."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from shared.settings.hosts import HostRule, parse_rule, rule_from_url
from shared.settings.model import AgentSettings, SettingsError, load_settings
from workers.doctor import checks
from workers.egress_policy import EgressPolicy, is_public, policy_for
from workers.sandbox import hand_over_refusal

pytestmark = pytest.mark.unit


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("github.com", HostRule("github.com")),
        ("GitHub.com.", HostRule("github.com")),
        ("*.pypi.org", HostRule("*.pypi.org")),
        ("127.0.0.1:8080", HostRule("127.0.0.1", 8080)),
        ("[::1]:8080", HostRule("::1", 8080)),
    ],
)
def test_host_names_as_an_operator_writes_them(text: str, rule: HostRule) -> None:
    assert parse_rule(text) == rule


@pytest.mark.parametrize(
    "text", ["", "https://github.com", "a b", "git*hub.com", "*", "host:0", "host:99999", "::1:80", "u@h"]
)
def test_what_is_not_a_host_name_is_refused_with_a_reason(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_rule(text)


def test_the_settings_refuse_a_bad_network_entry_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "settings.toml").write_text(
        '[queue]\ndefault_agent = "a"\n[agents.a]\nnetwork = ["https://github.com"]\n'
    )
    with pytest.raises(SettingsError, match=r"agents\.a\.network"):
        load_settings(tmp_path, {})


def test_a_base_url_names_its_exact_host_and_port() -> None:
    assert rule_from_url("http://127.0.0.1:4010") == HostRule("127.0.0.1", 4010)
    assert rule_from_url("https://api.example.com/v1") == HostRule("api.example.com", 443)
    assert rule_from_url("not a url") is None


def test_a_claude_agent_reaches_its_base_url_and_nothing_else_by_default() -> None:
    policy = policy_for("coder", AgentSettings(), {"ANTHROPIC_BASE_URL": "http://127.0.0.1:4010"})
    assert policy.refuse_name("127.0.0.1", 4010) is None
    assert policy.refuse_addresses("127.0.0.1", 4010, [_ip("127.0.0.1")]) is None
    for host, port in [("127.0.0.1", 5432), ("127.0.0.1", 3777), ("github.com", 443), ("localhost", 4010)]:
        assert policy.refuse_name(host, port) is not None, (host, port)


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_the_bedrock_switch_opens_amazons_hosts_only_when_the_cli_gets_it_on(value: str) -> None:
    on = policy_for("coder", AgentSettings(), {"CLAUDE_CODE_USE_BEDROCK": value})
    assert on.refuse_name("bedrock-runtime.us-east-1.amazonaws.com", 443) is None
    # Read as the agent's environment reads it: a switch the CLI is not given as on opens nothing.
    for off in ["0", "false", "FALSE", "no", "off", ""]:
        policy = policy_for("coder", AgentSettings(), {"CLAUDE_CODE_USE_BEDROCK": off})
        assert policy.refuse_name("bedrock-runtime.us-east-1.amazonaws.com", 443) is not None, off


def test_without_a_base_url_claude_reaches_anthropics_hosts_on_web_ports_only() -> None:
    policy = policy_for("coder", AgentSettings(), {})
    assert policy.refuse_name("api.anthropic.com", 443) is None
    assert policy.refuse_name("api.anthropic.com", 22) is not None
    assert policy.refuse_name("api.openai.com", 443) is not None
    # A name that resolves to the machine itself is refused by its address (DNS rebinding).
    why = policy.refuse_addresses("api.anthropic.com", 443, [_ip("127.0.0.1")])
    assert why is not None and "local or private" in why


def test_the_agents_own_env_table_names_its_service_before_the_processors() -> None:
    agent = AgentSettings(env={"ANTHROPIC_BASE_URL": "http://10.0.0.5:8000"})
    policy = policy_for("coder", agent, {"ANTHROPIC_BASE_URL": "http://127.0.0.1:4010"})
    assert policy.refuse_addresses("10.0.0.5", 8000, [_ip("10.0.0.5")]) is None
    assert policy.refuse_name("127.0.0.1", 4010) is not None


def test_codex_and_command_agents() -> None:
    codex = policy_for("w", AgentSettings(provider="codex"), {})
    assert codex.refuse_name("api.openai.com", 443) is None
    assert codex.refuse_name("api.anthropic.com", 443) is not None
    command = policy_for("c", AgentSettings(provider="command", command=["/bin/true"]), {})
    assert command.rules == () and command.refuse_name("api.anthropic.com", 443) is not None


def test_named_hosts_wildcards_and_exact_local_ports() -> None:
    agent = AgentSettings(network=["github.com", "*.pypi.org", "127.0.0.1:8080"])
    policy = policy_for("coder", agent, {})
    assert policy.refuse_name("github.com", 443) is None
    assert policy.refuse_name("files.pypi.org", 443) is None
    assert policy.refuse_name("pypi.org", 443) is not None  # *.pypi.org is the names under it
    assert policy.refuse_name("evilpypi.org", 443) is not None
    assert policy.refuse_addresses("127.0.0.1", 8080, [_ip("127.0.0.1")]) is None
    assert policy.refuse_name("127.0.0.1", 8081) is not None
    # github.com resolving to a private address is still refused: only an exact host:port opens one.
    assert policy.refuse_addresses("github.com", 443, [_ip("192.168.1.10")]) is not None


def test_open_lets_every_public_address_through_but_not_the_machines_own() -> None:
    policy = policy_for("coder", AgentSettings(network="open"), {})
    assert policy.open and policy.refuse_name("example.org", 8443) is None
    assert policy.refuse_addresses("example.org", 8443, [_ip("93.184.215.14")]) is None
    for local in ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.0.1", "169.254.169.254", "::1", "fd00::1",
                  "::ffff:127.0.0.1", "0.0.0.0", "100.64.0.1"]:  # fmt: skip
        assert policy.refuse_addresses("x.example", 443, [_ip(local)]) is not None, local


def test_public_means_global() -> None:
    assert is_public(_ip("1.1.1.1")) and is_public(_ip("2606:4700::1111"))
    assert not is_public(_ip("224.0.0.1")) and not is_public(_ip("::ffff:10.0.0.1"))


def test_an_empty_policy_refuses_everything() -> None:
    assert EgressPolicy("gone").refuse_name("api.anthropic.com", 443) is not None


def test_doctor_names_what_each_agent_reaches_and_warns_about_open(tmp_path: Path) -> None:
    (tmp_path / "settings.toml").write_text(
        '[queue]\ndefault_agent = "coder"\n[processor]\nsandbox = "namespaces"\n'
        '[agents.coder]\nnetwork = ["github.com"]\n[agents.wide]\nnetwork = "open"\n'
        '[agents.cmd]\nprovider = "command"\ncommand = ["/bin/true"]\n'
    )
    env = {"PATH": "/usr/bin:/bin", "ANTHROPIC_API_KEY": "k", "HOME": str(tmp_path)}
    found = {c.name: c for c in checks(load_settings(tmp_path, env))}
    if found["sandbox"].level != "ok":
        pytest.skip(f"no sandbox here: {found['sandbox'].detail}")
    assert "network: its own, out only through the egress proxy" in found["sandbox"].detail
    coder = found["network of coder"]
    assert coder.level == "ok" and coder.detail == (
        "reaches only api.anthropic.com, console.anthropic.com, platform.claude.com, claude.ai, github.com"
    )
    assert (
        found["network of wide"].level == "warn" and "every public address" in found["network of wide"].detail
    )
    assert found["network of cmd"].detail.startswith("reaches nothing")


def test_no_setting_makes_agentpost_hand_the_system_or_its_home_to_an_agent(tmp_path: Path) -> None:
    home = tmp_path / "ap" / "home"
    home.mkdir(parents=True)
    for folder in ["/", "/etc", "/etc/ssh", "/usr/lib", "/var/lib/postgresql", "/root", "/home/alice", "/srv",
                   str(tmp_path / "ap"), str(home)]:  # fmt: skip
        assert hand_over_refusal(Path(folder), home) is not None, folder
    for folder in [
        str(home / "workspace" / "a"),
        "/srv/shared/ws",
        "/home/alice/projects/x",
        str(tmp_path / "ws"),
    ]:
        assert hand_over_refusal(Path(folder), home) is None, folder
