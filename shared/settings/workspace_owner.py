"""Whose folder may become an agent's workspace when the API adds or edits an agent.

The processor hands an agent's workspace to the user the agent runs as (``agentpost-agent`` when the service
runs as root: :func:`workers.sandbox.prepare` changes its owner, recursively). An API caller who names an
existing folder of somebody else — root's ``/etc/cron.d``, another user's home — would thereby give it to the
agent. So an existing workspace set through the API must already be the service's: owned by the service's
user (not root), or by the agent user, or — for a root service — a folder agentpost itself made under its
``workspace`` folder. A folder that does not exist yet is fine: the processor creates it for the agent.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from shared.settings.model import Settings, SettingsError

#: The user agents run as under a root service; :data:`workers.sandbox.SANDBOX_USER` (shared cannot import
#: workers, so the name is repeated here).
SANDBOX_USER = "agentpost-agent"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _sandbox_uid() -> int | None:
    try:
        return pwd.getpwnam(SANDBOX_USER).pw_uid
    except KeyError:
        return None


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
    except ValueError:
        return False
    return path != folder


def foreign_owner(path: Path, home: Path) -> str | None:
    """The name of the user who owns ``path`` when agentpost may not take it as a workspace (see the module
    docstring); ``None`` when it may, or when ``path`` does not exist."""
    try:
        owner = path.stat().st_uid  # symlinks followed: the folder the agent would get
    except FileNotFoundError:
        return None
    except OSError:
        return "an unknown user (it cannot be examined)"
    me = os.geteuid()
    if owner == _sandbox_uid():
        return None
    if owner == me and me != 0:
        return None
    if owner == me == 0 and _inside(path.resolve(), (home / "workspace").resolve()):
        return None
    return _user_name(owner)


def refuse_foreign_workspaces(before: Settings, after: Settings) -> None:
    """Raise :class:`SettingsError` in plain words when an agent of ``after`` gets a workspace it did not
    have in ``before`` that belongs to another user (:func:`foreign_owner`)."""
    for agent in sorted(after.agents):
        path = after.workspace(agent)
        if agent in before.agents and before.workspace(agent) == path:
            continue
        owner = foreign_owner(path, after.home)
        if owner is not None:
            raise SettingsError(
                f"the workspace {path} of agent {agent!r} belongs to {owner}, not to agentpost: the agent "
                "would be given that folder. Choose a folder agentpost's user owns, or leave the workspace "
                "empty for workspace/<agent>."
            )
