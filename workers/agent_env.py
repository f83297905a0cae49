"""What an agent CLI sees of the processor's environment: an allowlist, so the chat text an agent reads cannot
talk it into printing a channel token, an app secret or a database URL it was never given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.settings.model import AgentSettings

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


@dataclass(frozen=True)
class ProviderEnv:
    """The variables one provider's CLI documents for its own use.

    ``names`` and ``prefixes`` always pass (a prefix only for a namespace the CLI owns, such as
    ``ANTHROPIC_``); ``switched`` maps a switch variable to names that pass only while that switch is on in
    the CLI's environment (cloud credentials matter to Claude Code only when it is told to use that cloud).
    """

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    switched: Mapping[str, frozenset[str]] | None = None


#: Claude Code's own variables, as its environment-variable reference names them (each checked to occur in
#: the pinned 2.1.332 binary), besides its namespaces ``ANTHROPIC_*`` and ``CLAUDE_CODE_*``. ``BASH_*``
#: and ``AWS_*`` are no namespace of the CLI: a shell's or a deployment's secrets live there too
#: (``BASH_ENV``, the host's ``AWS_SECRET_ACCESS_KEY``).
_CLAUDE_NAMES = frozenset(
    {
        "API_TIMEOUT_MS", "BASH_DEFAULT_TIMEOUT_MS", "BASH_MAX_OUTPUT_LENGTH", "BASH_MAX_TIMEOUT_MS",
        "CLAUDE_CONFIG_DIR", "CLAUDE_ENV_FILE", "CLAUDE_BASH_MAINTAIN_PROJECT_WORKING_DIR",
        "CLOUD_ML_REGION", "DISABLE_AUTOUPDATER", "DISABLE_BUG_COMMAND", "DISABLE_COST_WARNINGS",
        "DISABLE_ERROR_REPORTING", "DISABLE_INSTALLATION_CHECKS", "DISABLE_PROMPT_CACHING",
        "DISABLE_PROMPT_CACHING_HAIKU", "DISABLE_PROMPT_CACHING_OPUS", "DISABLE_PROMPT_CACHING_SONNET",
        "DISABLE_TELEMETRY", "DISABLE_UPDATES", "ENABLE_TOOL_SEARCH", "IS_SANDBOX",
        "MAX_MCP_OUTPUT_TOKENS", "MAX_THINKING_TOKENS", "MCP_TIMEOUT", "MCP_TOOL_TIMEOUT",
        "SLASH_COMMAND_TOOL_CHAR_BUDGET", "USE_BUILTIN_RIPGREP",
    }
)  # fmt: skip

#: Amazon Bedrock (``CLAUDE_CODE_USE_BEDROCK``): the AWS SDK's credential chain and the region Claude Code
#: requires; passed only while the CLI is switched to Bedrock.
_BEDROCK_NAMES = frozenset(
    {
        "AWS_REGION", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
        "AWS_BEARER_TOKEN_BEDROCK",
    }
)  # fmt: skip

_CLAUDE_ENV = ProviderEnv(
    names=_CLAUDE_NAMES,
    prefixes=("ANTHROPIC_", "CLAUDE_CODE_", "VERTEX_REGION_"),
    switched={"CLAUDE_CODE_USE_BEDROCK": _BEDROCK_NAMES},
)

#: Each provider's own variables (its credentials and switches), passed on top of the base.
PROVIDER_ENV: Mapping[str, ProviderEnv] = {
    "claude": _CLAUDE_ENV,
    "codex": ProviderEnv(prefixes=("OPENAI_", "CODEX_", "AZURE_OPENAI_")),
    "command": ProviderEnv(),
}


def _switched_on(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def passes_to_agent(name: str, provider: str, switches: Mapping[str, str] | None = None) -> bool:
    """Whether the processor's variable ``name`` reaches an agent CLI of ``provider``.

    An allowlist: the base names above and the provider's own. Everything else — channel tokens, app
    secrets, the API token, database and Redis URLs, anything an operator set for agentpost itself — stays
    with the processor, since an agent reads untrusted chat text and may be talked into printing its
    environment. An agent that needs more gets it by name in its ``env`` table. ``switches`` is where the
    provider's switches are looked up (the CLI's environment): a cloud's credentials pass only while the CLI
    is switched to that cloud.
    """
    if name in _BASE_ENV or name.startswith(_BASE_PREFIXES):
        return True
    own = PROVIDER_ENV.get(provider, ProviderEnv())
    if name in own.names or name.startswith(own.prefixes):
        return True
    return any(
        name in names and _switched_on((switches or {}).get(switch))
        for switch, names in (own.switched or {}).items()
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
