"""The settings.toml `agentpost init` writes: every section with its keys commented, the defaults shown."""

from __future__ import annotations

import os
from pathlib import Path

from shared.private_files import private_dir, tighten
from shared.settings.model import SETTINGS_FILE, SettingsError
from shared.settings.providers import PROVIDER_FACTS

#: The commented settings.toml `agentpost init` writes (the provider kinds it lists come from the facts).
STARTER_SETTINGS = (
    """\
# agentpost settings. Every key is optional; the values shown are the defaults unless noted.
# Environment overrides: AGENTPOST_HOME, AGENTPOST_DATABASE_URL, AGENTPOST_API_PORT, AGENTPOST_API_TOKEN,
# AGENTPOST_API_ALLOWED_ORIGINS.

[database]
# Empty: a SQLite file beside this one (agentpost.db). For several hosts use PostgreSQL:
# url = "postgresql://user@dbhost/agentpost"
url = ""

[api]
host = "127.0.0.1"     # the web API refuses a non-loopback address unless a token is set
port = 3777
# The API asks for a token on loopback too. Empty: the one in api-token beside this file (written by
# `agentpost init`, or by the web process when missing), or AGENTPOST_API_TOKEN from the environment.
token = ""
# allow_open_loopback = false  # true (with no token) lets any local program, agents included, use the API
# Web pages on other origins that may call the API (the server's own pages always may); or set
# AGENTPOST_API_ALLOWED_ORIGINS="https://a.example,https://b.example".
# allowed_origins = ["https://office.example.com"]
# Bounded input: body size, slow request heads and bodies, idle keep-alive, open connections.
# max_body_bytes = 1048576
# header_timeout_seconds = 10
# body_timeout_seconds = 30
# idle_timeout_seconds = 5
# max_connections = 500

[queue]
default_agent = "assistant"   # messages that name no known agent go here
max_retries = 5               # failed attempts before a message becomes a dead letter
manual_retry_budget = 3       # how often an operator may retry one dead letter
lease_seconds = 30            # renewed while an agent runs; a dead worker's messages return after this
                              # (at once when the worker was on this machine and is gone)
max_interrupted_runs = 10     # runs of one message cut short by a dying processor before it is given up
max_hops = 8                  # agent-to-agent handoffs allowed in one chain
max_chain_runs = 10           # agent runs one user message may set off in all (handoffs, chat rooms)

# One block per agent. Names: lowercase letters, digits, '-' and '_', up to 32 characters.
[agents.assistant]
name = "Assistant"
provider = "claude"           # """
    + " | ".join(PROVIDER_FACTS)
    + """
model = ""                    # empty: the CLI's default model
permission_mode = "acceptEdits"
session_scope = "conversation"  # one private conversation per chat; "agent": one shared by every chat
timeout_seconds = 1800

# A team routes '@team ...' to its leader; members hand work to each other with [@name: ...].
# [teams.dev]
# agents = ["assistant", "reviewer"]
# leader = "assistant"
"""
)


def write_starter_settings(home: Path, *, force: bool = False) -> Path:
    """Write the commented starter settings file (``0600`` in a ``0700`` home); refuses to overwrite unless
    ``force``."""
    private_dir(home)
    path = home / SETTINGS_FILE
    if path.exists() and not force:
        raise SettingsError(f"{path} already exists (use --force to overwrite it)")
    tmp = path.with_suffix(".toml.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(STARTER_SETTINGS)
    tighten([tmp])
    os.replace(tmp, path)
    return path
