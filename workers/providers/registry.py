"""Which class runs which provider kind (``agents.NAME.provider``): :func:`provider_for`.

The one module that imports every provider; nothing among the providers imports it, so adding a kind here
cannot make an import cycle."""

from __future__ import annotations

from workers.providers.base import AgentProvider, CliProvider, ProviderError
from workers.providers.claude import ClaudeProvider
from workers.providers.codex import CodexProvider
from workers.providers.command import CommandProvider

#: kind -> its provider class.
PROVIDERS: dict[str, type[CliProvider]] = {
    "claude": ClaudeProvider,
    "codex": CodexProvider,
    "command": CommandProvider,
}


def provider_for(kind: str) -> AgentProvider:
    """A fresh provider of the given kind (providers keep per-run state, so one per run). The processor
    sees only the :class:`AgentProvider` interface; every implementation here derives from
    :class:`CliProvider`."""
    try:
        return PROVIDERS[kind]()
    except KeyError:
        raise ProviderError(f"unknown provider {kind!r} (known: {', '.join(sorted(PROVIDERS))})") from None
