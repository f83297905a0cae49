"""settings.toml as typed models: the whole file (``model``), each process kind's sections (``sections``), the
channels' sections (``channels``), the busy policies both name (``busy_policy``), safe edits for the CLI
and web API (``edit``) and message routing between agents (``routing``). Pure configuration, no database: it
imports only the plain values beside this folder. Rules enforced by ``tests/unit/test_layering.py``."""
