"""Which hosts an agent's run may reach: the rule the egress proxy (:mod:`workers.egress`) applies to every
connection a sandboxed run asks for.

A run has no network of its own (its own network namespace, loopback only); the proxy is its one way out,
and it lets through:

- the agent's AI service: the host of ``ANTHROPIC_BASE_URL`` (the agent's ``env`` table, else the
  processor's environment) or, without one, Anthropic's API and login hosts; codex's likewise
  (``OPENAI_BASE_URL``, else OpenAI's); a command agent has none (each kind's hosts and variables are
  its facts in :mod:`shared.settings.providers`);
- what the operator adds for the agent: ``network = ["github.com", "*.pypi.org", "127.0.0.1:8080"]``, or
  ``network = "open"`` for every public address.

A name without a port admits ports 443 and 80 only; ``host:port`` admits that port. Whatever the names say,
an address that is not public — loopback, private ranges, link-local, the machine's own services
(agentpost's API, PostgreSQL, Redis) — is refused unless the operator (or the AI service's URL) names that
exact ``host:port``. The check is made on the addresses the name resolves to, and the proxy connects to
those very addresses, so a name that resolves to 127.0.0.1 cannot smuggle a connection to the machine.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.settings.hosts import HostRule, bracketed, normalize_host, parse_rule, rule_from_url
from shared.settings.model import AgentSettings
from shared.settings.providers import PROVIDER_FACTS, switch_on

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def ip_of(host: str) -> IPAddress | None:
    """The address ``host`` is written as (``127.0.0.1``, ``[::1]``), or None for a name."""
    try:
        return ipaddress.ip_address(normalize_host(host))
    except ValueError:
        return None


def is_public(address: IPAddress) -> bool:
    """Whether an address is on the public internet (not loopback, private, link-local, reserved, ...)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class EgressPolicy:
    """What one agent's runs may reach (see the module docstring)."""

    agent: str
    rules: tuple[HostRule, ...] = ()
    #: ``network = "open"``: every public address (local and private ones still need their exact name).
    open: bool = False

    def refuse_name(self, host: str, port: int) -> str | None:
        """Why a connection to ``host:port`` is refused before any look-up (None: it may be asked)."""
        host = normalize_host(host)
        if not host or not 0 < port < 65536:
            return "not a valid host and port"
        if self.open or any(rule.matches(host, port) for rule in self.rules):
            return None
        return f"{bracketed(host)}:{port} is not on agent {self.agent}'s network list"

    def refuse_addresses(self, host: str, port: int, addresses: Sequence[IPAddress]) -> str | None:
        """Why the addresses ``host`` resolved to may not be reached (None: connect to them)."""
        host = normalize_host(host)
        if not addresses:
            return f"{host} has no address"
        if any(rule.names_exactly(host, port) for rule in self.rules):
            return None
        local = [a for a in addresses if not is_public(a)]
        if local:
            return (
                f"{bracketed(host)}:{port} is a local or private address ({local[0]}); the machine's own "
                f"services are closed to agents unless the operator names '{bracketed(host)}:{port}' in "
                f"[agents.{self.agent}] network"
            )
        return None

    def describe(self) -> str:
        """What the agent may reach, in words (``agentpost doctor``)."""
        named = ", ".join(str(rule) for rule in self.rules)
        if self.open:
            return "every public address" + (f", and {named}" if named else "")
        return named or "nothing (no AI service and no hosts named)"


def service_rules(agent: AgentSettings, env: Mapping[str, str]) -> tuple[HostRule, ...]:
    """The agent's AI service: the host its base URL names, else the provider's default hosts (and a cloud's,
    while the CLI is switched to it)."""
    facts = PROVIDER_FACTS.get(agent.provider)
    if facts is None:
        return ()
    for name in facts.base_url_variables:
        url = agent.env.get(name) or env.get(name)
        if url:
            rule = rule_from_url(url)
            if rule is not None:
                return (rule,)
    hosts = list(facts.service_hosts)
    switches = {**env, **agent.env}
    for switch, cloud in facts.switched_hosts.items():
        if switch_on(switches.get(switch)):
            hosts.extend(cloud)
    return tuple(HostRule(h) for h in hosts)


def policy_for(name: str, agent: AgentSettings, env: Mapping[str, str]) -> EgressPolicy:
    """The policy of agent ``name`` from its settings and the processor's environment."""
    extra: tuple[HostRule, ...] = ()
    network = agent.network
    if isinstance(network, list):
        extra = tuple(parse_rule(entry) for entry in network)
    rules = tuple(dict.fromkeys((*service_rules(agent, env), *extra)))
    return EgressPolicy(name, rules, open=network == "open")
