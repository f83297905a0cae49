"""Run the real Claude Code CLI offline, against :class:`tests.fakes.anthropic_api.FakeAnthropic`.

The CLI comes from the project's ``package.json`` (pinned ``@anthropic-ai/claude-code``): ``npm ci`` in the
repository root installs it as ``node_modules/.bin/claude``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: The repository root: this file is ``<root>/tests/fakes/claude_env.py``.
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Variables that keep the CLI from reaching anything but ``ANTHROPIC_BASE_URL``. With them a ``-p`` run
#: makes no DNS look-up and no connection except to the base URL (checked with strace on 2.1.332; without
#: them it resolves api.anthropic.com and sends ``HEAD /api/hello``).
OFFLINE_ENV: Mapping[str, str] = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_UPDATES": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_INSTALLATION_CHECKS": "1",
    "CLAUDE_CODE_ENABLE_TELEMETRY": "0",
}

#: The native CLI is hundreds of MB; the placeholder the npm package ships is a few hundred bytes.
_MIN_NATIVE_SIZE = 1_000_000

#: Host variables passed through when set; everything else (proxies, ``ANTHROPIC_*``, ``CLAUDE*`` of an
#: enclosing session) is left out on purpose.
_PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")


def claude_env(
    base_url: str,
    home: Path,
    *,
    max_retries: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment for running the CLI offline against a fake API at ``base_url``.

    ``home`` becomes ``HOME`` (the CLI keeps its state in ``$HOME/.claude``; give each test its own).
    ``IS_SANDBOX=1`` lets ``--dangerously-skip-permissions`` run as root. ``max_retries`` sets
    ``CLAUDE_CODE_MAX_RETRIES`` (the CLI's default, 10, makes a persistent 429 or 500 take minutes);
    ``extra`` is added last.
    """
    env = {name: os.environ[name] for name in _PASSED_THROUGH if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(OFFLINE_ENV)
    env.update(
        {
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": "test",
            "IS_SANDBOX": "1",
            "TERM": "dumb",
            "NO_COLOR": "1",
        }
    )
    if max_retries is not None:
        env["CLAUDE_CODE_MAX_RETRIES"] = str(max_retries)
    if extra:
        env.update(extra)
    return env


def claude_binary() -> Path:
    """The pinned CLI, ``<repo>/node_modules/.bin/claude``; raise ``FileNotFoundError`` if not installed.

    The npm package's ``bin/claude.exe`` is a small shell stub until its postinstall script copies the
    native binary (from the platform package) over it, so a stub counts as not installed.
    """
    path = REPO_ROOT / "node_modules" / ".bin" / "claude"
    if not path.exists():
        raise FileNotFoundError(
            f"Claude Code CLI not found at {path}: run `npm ci` in {REPO_ROOT} "
            "(installs the @anthropic-ai/claude-code version pinned in package-lock.json)"
        )
    if path.stat().st_size < _MIN_NATIVE_SIZE:
        raise FileNotFoundError(
            f"{path} is the npm placeholder, not the native CLI: its postinstall did not run. "
            f"Run `npm ci` in {REPO_ROOT} without --ignore-scripts and without --omit=optional."
        )
    return path
