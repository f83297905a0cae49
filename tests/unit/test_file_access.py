"""The one rule for files a reply may carry (shared.file_access) and what a reply says about the files it
could not attach (workers.files), without a database or a process."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.file_access import LINK_OUT, OUTSIDE, check_send_path, refusal_words
from workers.files import outbound_files

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
    assert check_send_path(str(root / "out"), [root]) == (None, LINK_OUT)
    assert check_send_path(str(root), [root]) == (None, "not a regular file")


def test_tilde_paths_are_not_expanded_and_never_raise(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    root.mkdir()
    assert check_send_path("~nobody-such-user/x", [root]) == (None, "not an absolute path")
    assert check_send_path("~/x", [root], root) == (None, "no such file")


def test_a_reply_names_each_file_it_could_not_attach_in_plain_words(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    root.mkdir()
    (root / "ok.txt").write_text("ok")
    (root / "folder").mkdir()
    (root / "loop").symlink_to(root / "loop")
    reply = "Done.\n[send_file: ok.txt]\n[send_file: /root/secrets.txt]\n[send_file: folder]\n[send_file: gone.pdf]"
    out = outbound_files(reply + "\n[send_file: loop]", root, [root])
    assert out.files == [str((root / "ok.txt").resolve())]
    assert out.text == (
        "Done.\n\n"
        "(I couldn't attach secrets.txt: it is outside my workspace.)\n"
        "(I couldn't attach folder: it is not a file.)\n"
        "(I couldn't attach gone.pdf: there is no such file.)\n"
        "(I couldn't attach loop: its path cannot be followed.)"
    )
    # A reply that was only a refused file still says something; nine refusals: eight named, one counted.
    only = outbound_files("[send_file: /etc/passwd]", root, [root])
    assert only.text == "(I couldn't attach passwd: it is outside my workspace.)"
    many = outbound_files("".join(f"[send_file: /x/f{n}]" for n in range(9)), root, [root])
    assert many.text.splitlines()[-1] == "(… and 1 more file I couldn't attach.)" and len(many.refused) == 9
    assert refusal_words("/tmp/a.txt", "something new") == "(I couldn't attach a.txt: it may not be sent.)"
