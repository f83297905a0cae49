"""Health, metrics, the dashboard page and unknown routes (adapters.web.health_routes), against a real uvicorn server."""

from __future__ import annotations

import httpx
import pytest

from shared.runtime import Runtime
from tests.web_support import (
    assert_refused,
    play_processor,
)

pytestmark = pytest.mark.integration


def test_health_metrics_dashboard_and_unknown_routes(api_client: httpx.Client, api_rt: Runtime) -> None:
    assert api_client.get("/healthz").json() == {"ok": True, "database": "sqlite"}
    api_client.post("/api/message", json={"message": "count me"})
    play_processor(api_rt.queue, "alpha", lambda m: "done")
    text = api_client.get("/metrics").text
    assert "# TYPE agentpost_messages gauge" in text
    assert 'agentpost_messages{agent="alpha",status="pending"} 0.0' in text
    assert 'agentpost_messages_completed{agent="alpha",window="1h"} 1.0' in text

    page = api_client.get("/")
    assert page.status_code == 200 and "<title>agentpost</title>" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for asset in ("/static/app.js", "/static/style.css"):
        assert api_client.get(asset).status_code == 200
    assert "http" not in "".join(line for line in page.text.splitlines() if "src=" in line or "href=" in line)

    assert_refused(api_client.get("/api/nothing"), 404)
    assert_refused(api_client.get("/nothing/at/all"), 404)
    assert_refused(api_client.put("/api/message", json={"message": "x"}), 405)
    openapi = api_client.get("/openapi.json").json()
    assert "/api/message" in openapi["paths"] and "/api/events/stream" in openapi["paths"]
