"""The agent providers: how each agent CLI is started, what its output means, and when a run has failed.

What lives where:

- :mod:`.base` — the interface and the runner every provider shares: :class:`~.base.AgentProvider`,
  :class:`~.base.RunRequest`, :class:`~.base.RunResult`, :class:`~.base.RunUsage`, :class:`~.base.WarmTurns`,
  :class:`~.base.StreamState`, :class:`~.base.CliProvider` (start, stream, time out, kill the process group,
  judge), :func:`~.base.launch_plan`, :func:`~.base.find_binary`, :func:`~.base.kill_group`,
  :class:`~.base.ProviderError`. It imports no provider.
- :mod:`.cli_output` — the output helpers the providers share (``json_line``, ``looks_rate_limited``,
  ``looks_overloaded``).
- :mod:`.claude` — :class:`~.claude.ClaudeProvider` (Claude Code, ``stream-json``) and its helpers.
- :mod:`.claude_warm` — claude's warm sessions (:class:`~.claude_warm.WarmPool`): a chat's CLI kept running
  between its runs. Only claude has a warm mode.
- :mod:`.codex` — :class:`~.codex.CodexProvider` (``codex exec --json``).
- :mod:`.command` — :class:`~.command.CommandProvider` (any CLI from an argv template; stdout is the reply).
- :mod:`.registry` — :func:`~.registry.provider_for`: the kind named in ``agents.NAME.provider`` → its class.
  The only module that imports every provider.

Imports go one way: ``registry`` → each provider → ``base`` (claude also → ``claude_warm`` → ``base``;
claude → :mod:`workers.errors` → ``base``). This file imports none of them, so importing any one module
here never pulls in the others; import from the module itself (``workers.providers.base``, …).

Adding a provider (kind ``NAME``) touches three files: write ``NAME.py`` here with a
:class:`~.base.CliProvider` subclass (``name``, ``service``, ``argv``, ``parse_line``; ``finish`` or
``spool_keys`` when needed), importing only ``base`` (and modules outside this package); add it to
``PROVIDERS`` in ``registry.py``; and declare its facts in ``shared/settings/providers.py`` (``NAME`` in the
``ProviderKind`` literal and a ``ProviderFacts`` in ``PROVIDER_FACTS``: its binary and path variable, the
variables its CLI gets, where a sandboxed run may connect, its login checks, its TinyAGI name). The environment
allowlist (``workers/agent_env.py``), the egress policy (``workers/egress_policy.py``), doctor, `agentpost up`'s
checks and the TinyAGI-compatible web API read those facts. What only claude has (warm sessions, ``steer``, the
appended system prompt) is asked as ``provider == "claude"`` where it is used (``workers/run.py``): a new kind
runs a process per run without them. docs/architecture.md ("Adding a provider") lists the same.
"""
