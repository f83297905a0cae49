"""Opening, reading, writing, copying and handing over files an agent can write, from agentpost's side.

agentpost's processes often run as root, and an agent (running as another user inside its sandbox) controls
its workspace and its CLI home: whatever name agentpost looks up there, the agent may have replaced by a
symbolic link to a host file, a FIFO, a hard link to a root-only file, or a folder. Acting on such a name
with root's rights reads, overwrites or gives away the file the agent points at, or blocks the process
forever (a FIFO without a writer, ``/dev/zero`` read to the end). So every path under a folder an agent can
write goes through this module, which:

- **follows no symbolic link** below the trusted folder (the folder itself is agentpost's: the workspace or
  the CLI home named in the settings): each step is opened relative to the previous one's descriptor with
  ``O_NOFOLLOW``, so a link anywhere on the way is refused, and a check and the use that follows it act on
  the same file (no swap in between);
- **opens regular files only**, never blocking: ``O_NONBLOCK`` on open (a FIFO then opens at once) and
  ``fstat`` after it, and anything but a regular file (FIFO, device, socket, folder) is refused;
- **refuses a file with other names** (``st_nlink > 1``): a hard link is indistinguishable from the file
  it links to, so a link count above one means the content may be a file from outside (``/etc/shadow``
  linked in where the kernel allows it). An agent's own hard links are rare; refusing them costs it the
  ability to send or hand in such a file, which is the safe side;
- **reads at most a limit**: a file over it is refused (:data:`TOO_LARGE`) rather than cut, since half a
  prompt or half a marker is worse than the fallback each caller has;
- **writes by replacing**: a new file made beside the name (``O_EXCL``), then renamed over it, so a link or
  a FIFO in the name's place is replaced, never written through; the file gets its folder's owner;
- **hands over a tree by descriptor** (:func:`chown_tree`, :func:`share_read_tree`): folders and regular
  files with one name each, through descriptors opened without following links; symbolic links, hard-linked
  files, FIFOs, sockets and devices keep their owner.

Every refusal is a :class:`Refused` (an :class:`OSError`, so code that already copes with a missing file
copes with it) whose :attr:`Refused.reason` says in plain words what the file was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path, PurePath

SYMLINK = "it is a symbolic link"
NOT_REGULAR = "it is not a regular file"
HARD_LINK = "it has other names (a hard link), so it may be a file from elsewhere"
TOO_LARGE = "it is larger than the limit"
OUTSIDE = "the path leaves its folder"
MISSING = "no such file"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_CHUNK = 1 << 16


class Refused(OSError):
    """A file agentpost will not open, write or hand over; :attr:`reason` says why in plain words."""

    def __init__(self, path: str | PurePath, reason: str) -> None:
        super().__init__(errno.EPERM, f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


def _parts(relative: str | PurePath) -> tuple[str, ...]:
    parts = PurePath(relative).parts
    if not parts or PurePath(relative).is_absolute() or any(p in ("..", ".") for p in parts):
        raise Refused(relative, OUTSIDE)
    return parts


def _kind_of(dir_fd: int, name: str, where: str | PurePath) -> os.stat_result:
    """The entry ``name`` itself (no link followed); :class:`Refused` for a link, FileNotFoundError if none."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise Refused(where, SYMLINK)
    return st


def _open_dir(dir_fd: int, name: str, where: str | PurePath) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            _kind_of(dir_fd, name, where)  # raises for a link
            raise Refused(where, "a folder on its path is not a folder") from None
        raise


@contextlib.contextmanager
def folder_under(root: Path, relative: str | PurePath = "") -> Iterator[int]:
    """A descriptor of the folder ``root/relative``, reached without following a link below ``root``
    (``root`` itself is agentpost's and is opened as named)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in _parts(relative) if str(relative) not in ("", ".") else ():
            next_fd = _open_dir(fd, part, root / relative)
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


def _checked(fd: int, where: str | PurePath, limit: int | None) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Refused(where, NOT_REGULAR)
    if st.st_nlink > 1:
        raise Refused(where, HARD_LINK)
    if limit is not None and st.st_size > limit:
        raise Refused(where, f"{TOO_LARGE} ({st.st_size} bytes, at most {limit})")
    return st


def open_in(dir_fd: int, name: str, where: str | PurePath, limit: int | None = None) -> int:
    """Open the regular file ``name`` in the folder ``dir_fd`` for reading, as the module docstring says:
    no link followed, never blocking, one name only, at most ``limit`` bytes long. The caller closes it."""
    st = _kind_of(dir_fd, name, where)
    if not stat.S_ISREG(st.st_mode):
        raise Refused(where, NOT_REGULAR)  # not even opened: a device's open can have effects
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(where, SYMLINK) from None  # swapped for a link since the look above
        raise
    try:
        _checked(fd, where, limit)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def open_under(root: Path, relative: str | PurePath, limit: int | None = None) -> Iterator[int]:
    """A read descriptor of the regular file ``root/relative`` (see :func:`open_in`)."""
    parts = _parts(relative)
    with folder_under(root, PurePath(*parts[:-1]) if len(parts) > 1 else "") as dir_fd:
        fd = open_in(dir_fd, parts[-1], root / relative, limit)
    try:
        yield fd
    finally:
        os.close(fd)


def _read_fd(fd: int, where: str | PurePath, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:  # grew after the fstat: still no more than the limit is taken in
            raise Refused(where, f"{TOO_LARGE} (more than {limit} bytes)")


def read_under(root: Path, relative: str | PurePath, limit: int) -> bytes:
    """The content of the regular file ``root/relative``, at most ``limit`` bytes (else :class:`Refused`)."""
    with open_under(root, relative, limit) as fd:
        return _read_fd(fd, root / relative, limit)


def read_text_under(root: Path, relative: str | PurePath, limit: int) -> str:
    """:func:`read_under` as UTF-8 text (UnicodeDecodeError for other bytes)."""
    return read_under(root, relative, limit).decode("utf-8")


def copy_under(root: Path, relative: str | PurePath, target: Path, limit: int) -> None:
    """Copy the regular file ``root/relative`` (at most ``limit`` bytes) to ``target``, a new file in a
    folder of agentpost's own (it must not exist). What is later read from ``target`` cannot be changed
    by the agent."""
    with open_under(root, relative, limit) as src:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            copied = 0
            while chunk := os.read(src, _CHUNK):
                copied += len(chunk)
                if copied > limit:
                    raise Refused(root / relative, f"{TOO_LARGE} (more than {limit} bytes)")
                os.write(out, chunk)
        except BaseException:
            os.close(out)
            with contextlib.suppress(OSError):
                os.unlink(target)
            raise
        os.close(out)


def _mkdir_in(dir_fd: int, name: str, where: str | PurePath, mode: int) -> int:
    """Open the folder ``name`` in ``dir_fd``, made (with the parent's owner) if missing."""
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        pass
    else:
        fd = _open_dir(dir_fd, name, where)
        _same_owner(fd, os.fstat(dir_fd))
        return fd
    return _open_dir(dir_fd, name, where)


def _same_owner(fd: int, parent: os.stat_result) -> None:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        os.fchown(fd, parent.st_uid, parent.st_gid)


def replace_under(root: Path, relative: str | PurePath, data: bytes, mode: int = 0o600) -> None:
    """Make ``root/relative`` a regular file holding ``data``, whatever was there (a link, a FIFO or a file
    is replaced, never written through; a folder is refused). Missing folders on the way are made. The new
    file (and folders) get the owner of the folder they are in, so the agent keeps owning its files."""
    parts = _parts(relative)
    where = root / relative
    with folder_under(root) as top:
        dir_fd = os.dup(top)
    try:
        for part in parts[:-1]:
            next_fd = _mkdir_in(dir_fd, part, where, 0o700)
            os.close(dir_fd)
            dir_fd = next_fd
        name = parts[-1]
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd
        )
        try:
            with os.fdopen(os.dup(fd), "wb") as handle:
                handle.write(data)
            os.fchmod(fd, mode)
            _same_owner(fd, os.fstat(dir_fd))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.close(fd)
        try:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            os.unlink(tmp, dir_fd=dir_fd)
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise Refused(where, NOT_REGULAR) from None
            raise
    finally:
        os.close(dir_fd)


def stat_under(root: Path, relative: str | PurePath) -> os.stat_result | None:
    """The entry ``root/relative`` itself (a link is not followed; no folder link on the way either), or
    None when there is none."""
    parts = _parts(relative)
    try:
        with folder_under(root, PurePath(*parts[:-1]) if len(parts) > 1 else "") as dir_fd:
            return os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _walk_tree(root: Path) -> Iterator[tuple[int, list[str]]]:
    """Each folder of the tree at ``root`` as (descriptor, names of its entries that are not folders),
    depth first (as many descriptors open as the tree is deep). Every folder is opened relative to its
    parent with ``O_NOFOLLOW | O_DIRECTORY``: a link is not a folder here, and nothing can make the open
    block."""
    stack: list[tuple[int, Iterator[str]]] = []

    def enter(fd: int) -> list[str]:
        folders: list[str] = []
        others: list[str] = []
        try:
            with os.scandir(fd) as entries:
                names = [entry.name for entry in entries]
        except OSError:
            os.close(fd)
            raise
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            (folders if stat.S_ISDIR(st.st_mode) else others).append(name)
        stack.append((fd, iter(folders)))
        return others

    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        yield top, enter(top)
        while stack:
            fd, folders = stack[-1]
            name = next(folders, None)
            if name is None:
                stack.pop()
                os.close(fd)
                continue
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # gone, or swapped for a link: left alone
            yield sub, enter(sub)
    finally:
        for fd, _ in stack:
            os.close(fd)


def _handover(root: Path, owner: tuple[int, int], dir_mode: int | None, file_mode: int | None) -> list[str]:
    skipped: list[str] = []
    uid, gid = owner
    for dir_fd, names in _walk_tree(root):
        os.fchown(dir_fd, uid, gid)
        if dir_mode is not None:
            os.fchmod(dir_fd, dir_mode)
        for name in names:
            try:
                fd = open_in(dir_fd, name, name)
            except Refused as exc:
                skipped.append(f"{name}: {exc.reason}")
                continue
            except OSError:
                continue  # gone meanwhile
            try:
                os.fchown(fd, uid, gid)
                if file_mode is not None:
                    os.fchmod(fd, file_mode)
            finally:
                os.close(fd)
    return skipped


def chown_tree(root: Path, uid: int, gid: int) -> list[str]:
    """Give the folders and regular files of the tree at ``root`` to ``uid:gid``, by descriptor. A symbolic
    link, a file with other names (a hard link to, say, ``/etc/shadow``), a FIFO, a socket or a device keeps
    its owner. Returns what was left as it was, one ``name: reason`` each."""
    return _handover(root, (uid, gid), None, None)


def share_read_tree(root: Path, gid: int) -> list[str]:
    """Let group ``gid`` read the tree at ``root`` (folders 0750, files 0640; the owner stays), with the
    same care as :func:`chown_tree`. Returns what was left as it was."""
    return _handover(root, (-1, gid), 0o750, 0o640)
