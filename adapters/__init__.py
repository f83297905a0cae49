"""Channel adapter plugins and the web adapter, each its own process."""
