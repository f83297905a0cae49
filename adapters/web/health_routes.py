"""What is served outside ``/api``: liveness (``/healthz``), whether a token is required (``/access``),
Prometheus metrics and the dashboard page (its sign-in page: :mod:`adapters.web.signin`)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from shared.reads import api_views
from shared.storage.errors import storage_problem

from .auth import require_metrics_token, signed_in
from .errors import error_response
from .metrics import CONTENT_TYPE
from .state import Web

STATIC_DIR = Path(__file__).parent / "static"

router = APIRouter()

PAGE_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


@router.get("/healthz", summary="Liveness and database reachability")
async def healthz(web: Web) -> JSONResponse:
    try:
        await web.run(api_views.ping, web.db)
    except Exception as exc:  # an unreachable database is what this endpoint exists to report
        problem = storage_problem(exc, web.db.url)
        if problem is not None:
            return error_response(503, problem.public(), headers={"Retry-After": str(problem.retry_after)})
        return error_response(
            503, f"database unreachable: {type(exc).__name__}", headers={"Retry-After": "5"}
        )
    return JSONResponse({"ok": True, "database": web.db.dialect.name})


@router.get("/access", summary="Whether this server asks for an API token (answered without one)")
async def access(web: Web, request: Request) -> dict[str, bool]:
    # ``signedIn``: this browser holds the sign-in cookie, so the dashboard need not ask for the token.
    return {"tokenRequired": bool(web.token), "signedIn": signed_in(request, web.token)}


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> FileResponse:
    return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    dependencies=[Depends(require_metrics_token)],
)
async def metrics_endpoint(web: Web) -> Response:
    """Every process's figures, read from the database now (:mod:`adapters.web.metrics`)."""
    body = await web.run(web.metrics.render)
    return Response(body, media_type=CONTENT_TYPE)


@router.get("/", include_in_schema=False)
async def dashboard() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers=PAGE_HEADERS)
