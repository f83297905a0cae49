"""What an agent CLI sees of the processor's environment: an allowlist, so the chat text an agent reads cannot
talk it into printing a channel token, an app secret or a database URL it was never given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from shared.settings.model import AgentSettings
from shared.settings.providers import PROVIDER_FACTS, switch_on

#: What every agent CLI may see of the processor's environment: what the OS, a shell and node need.
_BASE_ENV = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "COLORTERM", "NO_COLOR",
        "TMPDIR", "TZ", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
        "XDG_RUNTIME_DIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    }
)  # fmt: skip
_BASE_PREFIXES = ("LC_",)


def passes_to_agent(name: str, provider: str, switches: Mapping[str, str] | None = None) -> bool:
    """Whether the processor's variable ``name`` reaches an agent CLI of ``provider``.

    An allowlist: the base names above and the provider's own (its ``env_*`` facts in
    :mod:`shared.settings.providers`). Everything else — channel tokens, app
    secrets, the API token, database and Redis URLs, anything an operator set for agentpost itself — stays
    with the processor, since an agent reads untrusted chat text and may be talked into printing its
    environment. An agent that needs more gets it by name in its ``env`` table. ``switches`` is where the
    provider's switches are looked up (the CLI's environment): a cloud's credentials pass only while the CLI
    is switched to that cloud.
    """
    if name in _BASE_ENV or name.startswith(_BASE_PREFIXES):
        return True
    own = PROVIDER_FACTS.get(provider)
    if own is None:
        return False
    if name in own.env_names or name.startswith(own.env_prefixes):
        return True
    return any(
        name in names and switch_on((switches or {}).get(switch))
        for switch, names in own.switched_env.items()
    )


def runs_as_root() -> bool:
    """Whether this process (and so the agent CLI it starts) runs as root."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def sandbox_override(env: Mapping[str, str], agent: AgentSettings) -> str | None:
    """The ``IS_SANDBOX`` value the CLI needs but ``env`` lacks, or None when nothing is changed.

    As root, Claude Code refuses ``bypassPermissions`` unless ``IS_SANDBOX`` is exactly ``1`` (``yes``,
    ``true`` and the like are refused too, measured with 2.1.332); agentpost sets it then, replacing any
    other value the environment or the agent's ``env`` table holds.
    """
    needed = agent.permission_mode == "bypassPermissions" and runs_as_root()
    return "1" if needed and env.get("IS_SANDBOX") != "1" else None


def child_env(
    base: Mapping[str, str], agent: AgentSettings, extra: Sequence[tuple[str, str]] = ()
) -> dict[str, str]:
    """The CLI's environment: the allowed part of the processor's (:func:`passes_to_agent`), then the
    agent's ``env`` table, then ``extra``; ``IS_SANDBOX=1`` when running as root with permission bypass
    (:func:`sandbox_override`)."""
    switches = {**base, **agent.env}
    env = {k: v for k, v in base.items() if passes_to_agent(k, agent.provider, switches)}
    env.update(agent.env)
    env.update(dict(extra))
    if sandbox_override(env, agent) is not None:
        env["IS_SANDBOX"] = "1"
    return env
