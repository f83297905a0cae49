"""The web adapter's error: answered as ``{"error": message, ...extra}`` with a status."""

from __future__ import annotations

from typing import Any


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
