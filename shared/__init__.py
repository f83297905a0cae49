"""agentpost's shared core, one folder per concept: ``storage`` (the database engine), ``settings``,
``events`` (event log and wake-ups), ``chat`` (what is kept about chats), ``queue``, ``reads`` (read models
for operators) and ``cli`` (the ``agentpost`` command); beside them the plain values every layer may use
(``clock``, ``ids``, ``aio``, ``backoff``, ``notices``, ``private_files``, ``port_owner``,
``worker_identity``) and the few modules that join layers (``chain_budget``, ``file_access``, ``runtime``).

Every process (processor, channel adapters, web API, scheduler) stands on this package and talks to the
others only through the database it manages. Nothing here imports `workers`, `adapters` or `scheduler`; which
folder may import which is written in each folder's docstring and enforced by ``tests/unit/test_layering.py``.
"""

from __future__ import annotations

__version__ = "0.1.0"
