"""Small probes shared by the test support modules and the benchmarks: polling a condition until it holds
(with a deadline), a free TCP port on the loopback interface, a ``SELECT COUNT(*)`` on a runtime's
database, and killing the processes a test started."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

import pytest

from shared.runtime import Runtime


def wait_for(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.05,
    error: type[Exception] = AssertionError,
) -> Any:
    """Poll ``condition`` until it returns something truthy and return that; after ``timeout`` seconds,
    raise ``error`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def in_ci() -> bool:
    """``CI`` is set as CI sets it (``.ci/run`` exports ``CI=true`` itself, so a local run behaves alike)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def service_unavailable(what: str, detail: object) -> NoReturn:
    """A server or program a test needs is missing: skip the test on a developer's machine, fail it in CI,
    where ``.ci/run`` must have provided it (the one place this rule is written)."""
    if in_ci():
        pytest.fail(f"{what} is required in CI but unavailable: {detail}")
    pytest.skip(f"{what} unavailable: {detail}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of asking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def count(rt: Runtime, sql: str, params: Mapping[str, Any] | None = None) -> int:
    """``SELECT COUNT(*) ...`` helper."""
    return int(rt.db.read_scalar(sql, dict(params or {})) or 0)


def kill_all(procs: Iterable[subprocess.Popen[Any]]) -> None:
    """SIGKILL each of ``procs`` that is still running, and reap it."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
