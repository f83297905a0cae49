"""settings.toml as typed models: the whole file (``model``), each process kind's sections (``sections``), the
channels' sections (``channels``), the busy policies both name (``busy_policy``), safe edits for the CLI
and web API (``edit``), message routing between agents (``routing``), the facts about each provider kind
(``providers``), the commented file `agentpost init` writes (``starter``), the ``[backup]`` section (``backup``), the web API's token (``api_token``) and whose folders may become workspaces
(``workspace_owner``). Pure configuration, no database: it imports only the plain values beside this folder.
Rules enforced by ``tests/unit/test_layering.py``."""
