"""settings.toml as typed models: the whole file (``model``), each process kind's sections (``sections``), the
channels' sections (``channels``), safe edits for the CLI and web API (``edit``) and message routing between
agents (``routing``). Pure configuration, no database: it imports only the plain values beside this folder,
and (for now) the busy-policy type of ``shared.chat.prefs``, the one exception named in
``tests/unit/test_layering.py``."""
