"""What an agent CLI sees of the processor's environment: an allowlist, so the chat text an agent reads cannot
talk it into printing a channel token, an app secret or a database URL it was never given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from shared.settings import AgentSettings

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

#: Each provider's own variables (its credentials and switches), passed on top of the base.
PROVIDER_ENV: Mapping[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "claude": (
        frozenset({"IS_SANDBOX", "MAX_THINKING_TOKENS", "USE_BUILTIN_RIPGREP"}),
        ("ANTHROPIC_", "CLAUDE_", "DISABLE_", "MCP_", "BASH_", "AWS_", "VERTEX_", "CLOUD_ML_"),
    ),
    "codex": (frozenset(), ("OPENAI_", "CODEX_", "AZURE_OPENAI_")),
    "command": (frozenset(), ()),
}


def passes_to_agent(name: str, provider: str) -> bool:
    """Whether the processor's variable ``name`` reaches an agent CLI of ``provider``.

    An allowlist: the base names above and the provider's own. Everything else — channel tokens, app
    secrets, the API token, database and Redis URLs, anything an operator set for agentpost itself — stays
    with the processor, since an agent reads untrusted chat text and may be talked into printing its
    environment. An agent that needs more gets it by name in its ``env`` table.
    """
    if name in _BASE_ENV or name.startswith(_BASE_PREFIXES):
        return True
    names, prefixes = PROVIDER_ENV.get(provider, (frozenset(), ()))
    return name in names or name.startswith(prefixes)


def child_env(
    base: Mapping[str, str], agent: AgentSettings, extra: Sequence[tuple[str, str]] = ()
) -> dict[str, str]:
    """The CLI's environment: the allowed part of the processor's (:func:`passes_to_agent`), then the
    agent's ``env`` table, then ``extra``; ``IS_SANDBOX=1`` when running as root with permission bypass
    (the CLI refuses that otherwise)."""
    env = {k: v for k, v in base.items() if passes_to_agent(k, agent.provider)}
    env.update(agent.env)
    env.update(dict(extra))
    if agent.permission_mode == "bypassPermissions" and hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("IS_SANDBOX", "1")
    return env
