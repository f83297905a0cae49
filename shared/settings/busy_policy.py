"""The busy policies: what happens to a chat's messages that arrive while its run goes on.

A plain configuration value, here beside the sections that set it (``[processor] busy_policy``,
``[channels.<channel>] busy_policy``) so settings need not import the chat stores; a chat's own choice
(``/queue MODE``) is kept by :mod:`shared.chat.prefs`.
"""

from __future__ import annotations

from typing import Literal, cast, get_args

BusyPolicy = Literal["collect", "followup", "interrupt", "steer"]
#: The policies, in the order the help text lists them.
BUSY_POLICIES: tuple[str, ...] = get_args(BusyPolicy)


def parse_busy_policy(value: str) -> BusyPolicy:
    """Validate a policy name (case-insensitive); raises ``ValueError`` naming the valid ones."""
    name = value.strip().lower()
    if name not in BUSY_POLICIES:
        raise ValueError(f"unknown busy policy {value!r} (use one of: {', '.join(BUSY_POLICIES)})")
    return cast(BusyPolicy, name)
