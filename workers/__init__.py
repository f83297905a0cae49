"""The queue processor process and the agent providers (claude, codex, any command). Imports only ``shared``."""
