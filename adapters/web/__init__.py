"""The web adapter: HTTP API, loss-free live event stream (SSE and WebSocket), metrics and dashboard.

``agentpost run web`` starts it (:func:`adapters.web.server.main`); :func:`adapters.web.app.create_app` builds
the ASGI application over an open :class:`~shared.runtime.Runtime`.
"""
