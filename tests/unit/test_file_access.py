"""The one rule for files a reply may carry (shared.file_access), without a database or a process."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.file_access import OUTSIDE, check_send_path

pytestmark = pytest.mark.unit


def test_outside_paths_get_one_answer_whether_or_not_they_exist(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    root.mkdir()
    assert check_send_path("/etc/passwd", [root]) == (None, OUTSIDE)
    assert check_send_path("/no/such/file/anywhere", [root]) == (None, OUTSIDE)
    assert check_send_path(str(root / ".." / "x"), [root]) == (None, OUTSIDE)


def test_inside_paths_resolve_and_symlinks_out_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    root.mkdir()
    (root / "a.txt").write_text("a")
    (root / "out").symlink_to("/etc/hostname")
    assert check_send_path("a.txt", [root], root) == (str((root / "a.txt").resolve()), "")
    assert check_send_path("a.txt", [root]) == (None, "not an absolute path")
    assert check_send_path(str(root / "missing.txt"), [root]) == (None, "no such file")
    assert check_send_path(str(root / "out"), [root]) == (None, OUTSIDE)
    assert check_send_path(str(root), [root]) == (None, "not a regular file")


def test_tilde_paths_are_not_expanded_and_never_raise(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    root.mkdir()
    assert check_send_path("~nobody-such-user/x", [root]) == (None, "not an absolute path")
    assert check_send_path("~/x", [root], root) == (None, "no such file")
