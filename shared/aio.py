"""The one way async code calls the blocking store: :func:`call` runs a function on a worker thread.

The queue, the kv store and the other storage modules are synchronous (one driver connection per thread,
short transactions). Async processes — adapters, the web API, the processor — reach them through this
helper instead of writing ``anyio.to_thread.run_sync(functools.partial(...))`` at every call site.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import anyio.to_thread

P = ParamSpec("P")
T = TypeVar("T")


async def call(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on a worker thread; the caller's task waits without blocking the loop.

    Cancelling the waiting task does not interrupt ``fn`` (a transaction runs to its end); the result is
    then dropped."""
    if kwargs:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
    return await anyio.to_thread.run_sync(fn, *args)
