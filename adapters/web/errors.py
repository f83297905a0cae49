"""The web adapter's errors: every one answered as ``{"error": message, ...extra}`` with a 4xx/5xx status.

:class:`ApiError` is what routes raise; :func:`install_error_handlers` turns it, the queue's errors, invalid
requests, storage trouble and bugs into such answers.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.queue.records import InvalidInput, LeaseLost, NotFound, QueueError, RetryBudgetExhausted
from shared.storage.errors import storage_problem

log = logging.getLogger("agentpost.web")

_QUEUE_STATUS: list[tuple[type[QueueError], int]] = [
    (NotFound, 404),
    (RetryBudgetExhausted, 409),
    (LeaseLost, 409),
    (InvalidInput, 400),
]


class ApiError(Exception):
    """An error answered as ``{"error": message, ...extra}`` with ``status``."""

    def __init__(
        self, status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.extra = extra


def error_response(
    status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """The answer to every refused request: ``{"error": message, ...extra}``."""
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` as JSON: :class:`ApiError` as raised, the queue's errors by kind,
    invalid requests 400/422 naming the fields, storage trouble 503 with ``Retry-After``, anything else 500
    (logged as a bug)."""
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(QueueError, _on_queue_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    # Registered per driver error class (not only as the catch-all below): Starlette re-raises what reaches
    # the catch-all after answering, which would print a traceback for every refused request.
    for driver_error in (sqlite3.Error, psycopg.Error, SQLAlchemyError, OSError):
        app.add_exception_handler(driver_error, _on_driver_error)
    app.add_exception_handler(Exception, _on_unexpected)


async def _on_api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, headers=exc.headers, **exc.extra)


async def _on_queue_error(_: Request, exc: Exception) -> JSONResponse:
    for kind, status in _QUEUE_STATUS:
        if isinstance(exc, kind):
            return error_response(status, str(exc))
    return error_response(409, str(exc))


async def _on_validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    status, message, details = _describe_validation(exc)
    return error_response(status, message, details=details) if details else error_response(status, message)


def _describe_validation(exc: RequestValidationError) -> tuple[int, str, list[dict[str, Any]]]:
    details = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            return 400, "malformed JSON in the request body", []
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        details.append({"field": ".".join(loc) or "body", "problem": err.get("msg", "invalid")})
    summary = "; ".join(f"{d['field']}: {d['problem']}" for d in details) or "invalid request"
    return 422, summary, details


async def _on_http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else "request failed"
    if exc.status_code == 404 and message == "Not Found":
        message = "no such endpoint"
    return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)


async def _on_driver_error(request: Request, exc: Exception) -> JSONResponse:
    refusal = _storage_refusal(request, exc)
    if refusal is None:
        raise exc  # not storage trouble: the catch-all answers 500 and logs it as a bug
    return refusal


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    refusal = _storage_refusal(request, exc)
    if refusal is not None:
        return refusal
    log.exception("unexpected error")
    return error_response(500, f"internal error ({type(exc).__name__}); see the server log")


def _storage_refusal(request: Request, exc: Exception) -> JSONResponse | None:
    problem = storage_problem(exc, request.app.state.web.db.url)
    if problem is None:
        return None
    # Expected trouble, not a bug: one line for the operator (naming the file), no traceback.
    log.warning(
        "%s %s refused for now: %s (%s)", request.method, request.url.path, problem.describe(), problem.detail
    )
    return error_response(
        503,
        problem.public(),
        headers={"Retry-After": str(problem.retry_after)},
        retryAfter=problem.retry_after,
    )
