"""The facts about each provider kind (``agents.NAME.provider``), declared once: what its CLI is called and
where its path may be set, which variables of the processor's environment it gets, where a sandboxed run of
it may connect, how `agentpost up` tells whether it is installed and logged in, and what TinyAGI calls it.

The modules that act on these facts live in process packages that may not import one another
(``workers/agent_env.py``, ``workers/egress_policy.py``, ``workers/doctor.py``, the providers themselves,
``scheduler/process_plan.py``, ``adapters/web/``), so the facts live here, beside the settings that name the
kind, and each of them reads :data:`PROVIDER_FACTS`. How a CLI is run and what its output means is code, in
``workers/providers/NAME.py``.

Plain values: this module imports nothing of agentpost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

#: The kinds ``agents.NAME.provider`` may name; the same names as :data:`PROVIDER_FACTS`, in the same order
#: (``tests/unit/test_provider_facts.py``). A literal, so that settings validation and mypy know them.
ProviderKind = Literal["claude", "codex", "command"]


@dataclass(frozen=True)
class ProviderFacts:
    """What agentpost knows about one provider kind, apart from how its CLI is run.

    Environment (``workers/agent_env.py``): ``env_names`` and ``env_prefixes`` pass from the processor's
    environment to the CLI (a prefix only for a namespace the CLI owns, such as ``ANTHROPIC_``);
    ``switched_env`` maps a switch variable to names that pass only while that switch is on.
    ``up_env_prefixes`` are the variables `agentpost up` hands the processor for this kind (and withholds from
    the other processes).

    Network (``workers/egress_policy.py``): ``base_url_variables`` name the CLI's API, in the order they are
    looked at; without one set, a sandboxed run may reach ``service_hosts`` (its API and the hosts its login
    refreshes at), plus ``switched_hosts[switch]`` while that switch is on (a cloud the CLI is told to use).

    The CLI (``workers/doctor.py``, ``scheduler/process_plan.py``, the provider's module): ``binary`` is its
    name on ``PATH`` or in ``node_modules/.bin``, ``binary_env`` the variable that overrides its path; an
    empty ``binary`` means the agent's ``command`` argv names the program. ``not_found`` says what to do
    when it is missing. A login is any of ``login_env`` set, or any of ``login_files`` (under ``HOME``)
    present; ``login_hint`` says how to log in. No ``login_env`` and no ``login_files``: nothing to log in.

    ``service`` is whose AI service the CLI talks to, for messages; ``tinyagi_name`` is the kind's name in
    TinyAGI's web API (``anthropic`` for claude), empty when TinyAGI has none.
    """

    name: str
    service: str = ""
    tinyagi_name: str = ""
    env_names: frozenset[str] = frozenset()
    env_prefixes: tuple[str, ...] = ()
    switched_env: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    up_env_prefixes: tuple[str, ...] = ()
    service_hosts: tuple[str, ...] = ()
    base_url_variables: tuple[str, ...] = ()
    switched_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    binary: str = ""
    binary_env: str = ""
    not_found: str = ""
    login_env: tuple[str, ...] = ()
    login_files: tuple[str, ...] = ()
    login_hint: str = ""


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

#: Claude Code (``stream-json``); Bedrock and Vertex are switches of the same CLI.
CLAUDE = ProviderFacts(
    name="claude",
    service="Anthropic",
    tinyagi_name="anthropic",
    env_names=_CLAUDE_NAMES,
    env_prefixes=("ANTHROPIC_", "CLAUDE_CODE_", "VERTEX_REGION_"),
    switched_env=MappingProxyType({"CLAUDE_CODE_USE_BEDROCK": _BEDROCK_NAMES}),
    up_env_prefixes=("ANTHROPIC_", "CLAUDE_", "AWS_", "VERTEX_REGION_"),
    service_hosts=("api.anthropic.com", "console.anthropic.com", "platform.claude.com", "claude.ai"),
    base_url_variables=("ANTHROPIC_BASE_URL", "ANTHROPIC_BEDROCK_BASE_URL", "ANTHROPIC_VERTEX_BASE_URL"),
    # Bedrock's and Vertex's endpoints are per region, so the whole cloud's API domain is let through.
    switched_hosts=MappingProxyType(
        {"CLAUDE_CODE_USE_BEDROCK": ("*.amazonaws.com",), "CLAUDE_CODE_USE_VERTEX": ("*.googleapis.com",)}
    ),
    binary="claude",
    binary_env="AGENTPOST_CLAUDE_BIN",
    not_found=(
        "the claude CLI was not found; run `make install` (it installs node_modules/.bin/claude) or "
        "`npm install -g @anthropic-ai/claude-code`"
    ),
    login_env=("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN"),
    # ~/.claude.json appears after any run, logged in or not; only the credentials file means a login.
    login_files=(".claude/.credentials.json",),
    login_hint=(
        "run `claude` once and log in (~/.claude/.credentials.json) or set ANTHROPIC_API_KEY in the environment"
    ),
)

#: OpenAI's Codex CLI (``codex exec --json``).
CODEX = ProviderFacts(
    name="codex",
    service="OpenAI",
    tinyagi_name="openai",
    env_prefixes=("OPENAI_", "CODEX_", "AZURE_OPENAI_"),
    up_env_prefixes=("OPENAI_", "CODEX_", "AZURE_OPENAI_"),
    service_hosts=("api.openai.com", "auth.openai.com", "chatgpt.com"),
    base_url_variables=("OPENAI_BASE_URL",),
    binary="codex",
    binary_env="AGENTPOST_CODEX_BIN",
    not_found="the codex CLI was not found on PATH",
    login_env=("OPENAI_API_KEY",),
    login_files=(".codex/auth.json",),
    login_hint="run `codex login` or set OPENAI_API_KEY",
)

#: Any CLI from an argv template (``command``): no variables of its own, no AI service to reach, nothing to
#: log in to; the agent's argv names the program.
COMMAND = ProviderFacts(name="command")

#: kind -> its facts, for every kind :data:`ProviderKind` names.
PROVIDER_FACTS: Mapping[str, ProviderFacts] = MappingProxyType(
    {facts.name: facts for facts in (CLAUDE, CODEX, COMMAND)}
)


def switch_on(value: str | None) -> bool:
    """Whether a provider switch variable (``CLAUDE_CODE_USE_BEDROCK``, …) is on: set, and not ``0``,
    ``false``, ``no`` or ``off`` in any case. One reading for both what the CLI is given and where a
    sandboxed run may connect, so a switch the CLI does not get opens no hosts either."""
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")
