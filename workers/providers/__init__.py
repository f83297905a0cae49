"""The agent providers (temporary: see the following commits)."""
