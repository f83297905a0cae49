"""The rule for files an agent can write, on real files: a symbolic link, a FIFO, ``/dev/zero`` and a hard
link in place of the file agentpost opens, writes or hands over (shared/safe_files.py). The call sites are
tried end to end in tests/e2e/test_root_side_files.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared import safe_files

pytestmark = [pytest.mark.unit, pytest.mark.timeout(20)]

SECRET = b"the host's secret\n"


def _planted(tmp: Path, kind: str) -> tuple[Path, Path]:
    """A folder the agent owns, with ``f`` of the given kind, and a host file outside it."""
    root = tmp / "workspace"
    root.mkdir()
    host = tmp / "host-secret"
    host.write_bytes(SECRET)
    if kind == "symlink":
        (root / "f").symlink_to(host)
    elif kind == "fifo":
        os.mkfifo(root / "f")
    elif kind == "devzero":
        (root / "f").symlink_to("/dev/zero")
    elif kind == "hardlink":
        os.link(host, root / "f")
    elif kind == "folder-link":
        (root / "d").symlink_to(tmp)
    return root, host


KINDS = ["symlink", "fifo", "devzero", "hardlink"]


@pytest.mark.parametrize("kind", KINDS)
def test_reads_refuse_what_is_not_the_agents_own_regular_file(tmp_path: Path, kind: str) -> None:
    root, _ = _planted(tmp_path, kind)
    with pytest.raises(safe_files.Refused) as refused:
        safe_files.read_under(root, "f", 1024)  # a FIFO would block here, /dev/zero never end
    expected = {
        "symlink": safe_files.SYMLINK,
        "devzero": safe_files.SYMLINK,
        "fifo": safe_files.NOT_REGULAR,
        "hardlink": safe_files.HARD_LINK,
    }[kind]
    assert refused.value.reason == expected


def test_a_link_on_the_way_is_refused_and_a_plain_file_is_read(tmp_path: Path) -> None:
    root, _ = _planted(tmp_path, "folder-link")
    with pytest.raises(safe_files.Refused):
        safe_files.read_under(root, "d/host-secret", 1024)
    (root / "sub").mkdir()
    (root / "sub" / "ok.txt").write_text("fine")
    assert safe_files.read_text_under(root, "sub/ok.txt", 1024) == "fine"
    for escape in ("../host-secret", "/etc/passwd", "sub/../../host-secret"):
        with pytest.raises(safe_files.Refused):
            safe_files.read_under(root, escape, 1024)
    with pytest.raises(FileNotFoundError):
        safe_files.read_under(root, "missing", 1024)


def test_a_file_over_the_limit_is_refused_not_cut(tmp_path: Path) -> None:
    root = tmp_path
    (root / "big").write_bytes(b"x" * 2000)
    with pytest.raises(safe_files.Refused) as refused:
        safe_files.read_under(root, "big", 1000)
    assert refused.value.reason.startswith(safe_files.TOO_LARGE)
    assert safe_files.read_under(root, "big", 2000) == b"x" * 2000


@pytest.mark.parametrize("kind", KINDS)
def test_a_write_replaces_the_name_and_never_writes_through(tmp_path: Path, kind: str) -> None:
    root, host = _planted(tmp_path, kind)
    before = host.stat()
    safe_files.replace_under(root, "f", b"login", 0o600)
    assert host.read_bytes() == SECRET and host.stat().st_mode == before.st_mode
    assert (root / "f").read_bytes() == b"login" and not (root / "f").is_symlink()
    assert (root / "f").stat().st_nlink == 1 and oct((root / "f").stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in root.iterdir()) == ["f"]  # no temporary file left


def test_a_write_does_not_follow_a_folder_link(tmp_path: Path) -> None:
    root, host = _planted(tmp_path, "folder-link")
    with pytest.raises(safe_files.Refused):
        safe_files.replace_under(root, "d/host-secret", b"overwritten")
    assert host.read_bytes() == SECRET
    safe_files.replace_under(root, "new/deeper/f", b"made")
    assert (root / "new" / "deeper" / "f").read_bytes() == b"made"


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_refuses_the_same_and_copies_a_plain_file(tmp_path: Path, kind: str) -> None:
    root, _ = _planted(tmp_path, kind)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(safe_files.Refused):
        safe_files.copy_under(root, "f", out / "f", 1 << 20)
    assert list(out.iterdir()) == []
    (root / "plain").write_bytes(b"plain")
    safe_files.copy_under(root, "plain", out / "plain", 1 << 20)
    assert (out / "plain").read_bytes() == b"plain"


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another user needs root")
def test_a_handover_gives_away_only_the_trees_own_folders_and_files(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "mine.txt").write_text("mine")
    host = tmp_path / "shadow"
    host.write_text("root only")
    host.chmod(0o600)
    os.link(host, root / "sub" / "linked")  # a hard link to a root-only file
    (root / "points-out").symlink_to(host)
    (root / "dir-out").symlink_to(tmp_path)
    os.mkfifo(root / "pipe")
    kept = safe_files.chown_tree(root, 4321, 4321)
    assert host.stat().st_uid == 0 and host.lstat().st_uid == 0 and tmp_path.stat().st_uid == 0
    assert (root / "sub" / "mine.txt").stat().st_uid == 4321
    assert root.stat().st_uid == 4321 and (root / "sub").stat().st_uid == 4321
    assert (root / "pipe").stat().st_uid == 0 and (root / "points-out").lstat().st_uid == 0
    assert sorted(k.split(":")[0] for k in kept) == ["dir-out", "linked", "pipe", "points-out"]
    safe_files.share_read_tree(root, 4322)
    assert host.stat().st_gid == 0 and oct(host.stat().st_mode & 0o777) == "0o600"
    assert (root / "sub" / "mine.txt").stat().st_gid == 4322
