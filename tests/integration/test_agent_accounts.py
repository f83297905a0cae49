"""The agents' accounts (workers/sandbox.py): made with useradd on first use, and made even when another
process holds the account files locked for a moment (a second processor starting, the operator's useradd)."""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.sandbox import SandboxError, _add_user

pytestmark = [
    pytest.mark.integration,
    pytest.mark.serial,
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="makes system accounts (needs root)"),
]

LOCK = Path("/etc/passwd.lock")


@pytest.fixture
def account() -> Iterator[str]:
    name = f"ap-t{secrets.token_hex(4)}"
    yield name
    subprocess.run(["userdel", name], capture_output=True, check=False)


def _hold_lock() -> None:
    # shadow's lock protocol: a file named after the locked one, holding the pid of a live holder.
    LOCK.write_text(str(os.getpid()))


def test_an_account_is_made_once_the_account_files_are_unlocked(account: str) -> None:
    assert not LOCK.exists(), "another useradd holds the lock"
    _hold_lock()
    release = threading.Timer(1.0, LOCK.unlink)
    release.start()
    try:
        _add_user(account, ["--user-group"], f"the test user {account}")
    finally:
        release.join()
    assert pwd.getpwnam(account).pw_shell == "/usr/sbin/nologin"
    _add_user(account, ["--user-group"], f"the test user {account}")  # made already: fine


def test_a_lock_never_released_is_an_error_naming_the_account(
    account: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hold_lock()
    try:
        with pytest.raises(SandboxError, match=f"cannot create the test user {account}: .*cannot lock"):
            _add_user(account, ["--user-group"], f"the test user {account}", wait=0.5)
    finally:
        LOCK.unlink()
    with pytest.raises(KeyError):
        pwd.getpwnam(account)
