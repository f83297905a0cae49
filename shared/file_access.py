"""Which files may leave the machine in a reply, and where a chat's uploads live: one rule for the processor
(``[send_file: …]`` in a reply), the web API (``POST /api/responses`` with ``files``) and the channel adapters
(checked again right before sending, since a path can change between queueing and sending).

A file may be sent when it resolves — symlinks followed — to a regular file inside the answering agent's
workspace or inside the upload folder of the chat the reply goes to. Another chat's uploads, the rest of the
home folder (settings, the database), ``/proc`` and anything else on the disk are refused.

The agent owns its workspace, and agentpost's side often runs as root, so the file itself is then opened
as :mod:`shared.safe_files` says: the resolved path is walked again without following any link (one swapped
in meanwhile is refused), and it must be a regular file with one name (a hard link may be a file from
elsewhere), at most :data:`MAX_SEND_BYTES` long, opened without blocking (a FIFO or a device is refused).
Right before sending, a channel copies the file with the same care into a folder of its own
(:func:`copy_for_sending`) and sends the copy, which the agent cannot change.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from shared import safe_files
from shared.chat.address import ChatAddress
from shared.settings.model import Settings

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
OUTSIDE = "outside the agent's workspace and this chat's uploads"
LINK_OUT = "a link to a place outside the agent's workspace and this chat's uploads"
MISSING = "no such file"
NOT_A_FILE = "not a regular file"
NOT_ABSOLUTE = "not an absolute path"
UNRESOLVABLE = "cannot resolve the path"
HARD_LINK = "a file with other names (a hard link), which may be a file from elsewhere"
TOO_LARGE = "larger than 50 MB"

#: The largest file a reply may attach (what Telegram's bots may upload; more than most chats take).
MAX_SEND_BYTES = 50 * 1024 * 1024

#: What the agent tells the chat about a file it could not attach, by the refusal's reason.
_IN_WORDS = {
    OUTSIDE: "it is outside my workspace",
    LINK_OUT: "it is a link to a place outside my workspace",
    MISSING: "there is no such file",
    NOT_A_FILE: "it is not a file",
    NOT_ABSOLUTE: "its path is not absolute",
    HARD_LINK: "it is a hard link to a file that may be outside my workspace",
    TOO_LARGE: "it is larger than 50 MB",
}


def _under(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def safe_name(name: str, fallback: str = "file") -> str:
    """A file or folder name with no path parts or odd characters."""
    cleaned = _UNSAFE.sub("_", Path(name).name).strip("._")
    return cleaned[:100] or fallback


def chat_upload_dir(settings: Settings, chat: ChatAddress) -> Path:
    """The folder of one chat's uploads: ``<home>/files/<channel>/<chat>`` (:attr:`ChatAddress.chat`)."""
    return settings.home / "files" / safe_name(chat.channel, "channel") / safe_name(chat.chat, "chat")


def send_roots(settings: Settings, agent: str, chat: ChatAddress) -> list[Path]:
    """The folders a reply of ``agent`` to ``chat`` may attach files from."""
    roots = [chat_upload_dir(settings, chat)]
    if agent in settings.agents:
        roots.insert(0, settings.workspace(agent))
    return roots


def check_send_path(raw: str, roots: Sequence[Path], base: Path | None = None) -> tuple[str | None, str]:
    """Resolve one path to send: ``(absolute path, "")`` if allowed, else ``(None, reason)``.

    A relative path is taken relative to ``base`` (the agent's workspace), or refused without one.
    """
    # No "~" expansion: "~user" paths name other accounts' homes, and a reply has no business there.
    candidate = Path(raw)
    if not candidate.is_absolute():
        if base is None:
            return None, NOT_ABSOLUTE
        candidate = base / candidate
    allowed = [root.resolve() for root in roots]
    # First by the path as written (no look at the disk): whether a file outside the roots exists is none
    # of the caller's business. Then resolved, since a symlink inside may point out.
    written = Path(os.path.normpath(candidate))
    if not any(
        _under(written, root) or _under(written, Path(os.path.normpath(r)))
        for root, r in zip(allowed, roots, strict=True)
    ):
        return None, OUTSIDE
    try:
        resolved = candidate.resolve(strict=True)
    except (FileNotFoundError, NotADirectoryError):
        return None, MISSING
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        return None, f"{UNRESOLVABLE} ({exc})"
    inside = [root for root in allowed if _under(resolved, root)]
    if not inside:
        return None, LINK_OUT  # written inside, so a link on the way points out
    if resolved == inside[0]:
        return None, NOT_A_FILE
    try:
        with safe_files.open_under(inside[0], resolved.relative_to(inside[0]), MAX_SEND_BYTES):
            pass
    except safe_files.Refused as exc:
        return None, _reason(exc)
    except (FileNotFoundError, NotADirectoryError):
        return None, MISSING
    except OSError as exc:
        return None, f"{UNRESOLVABLE} ({exc})"
    return str(resolved), ""


def _reason(refused: safe_files.Refused) -> str:
    if refused.reason == safe_files.SYMLINK or refused.reason.startswith("a folder on its path"):
        return LINK_OUT  # a link swapped in after the path was resolved
    if refused.reason == safe_files.HARD_LINK:
        return HARD_LINK
    if refused.reason.startswith(safe_files.TOO_LARGE):
        return TOO_LARGE
    return NOT_A_FILE


def copy_for_sending(raw: str, roots: Sequence[Path], folder: Path) -> tuple[Path | None, str]:
    """Check ``raw`` again (:func:`check_send_path`) and copy it into ``folder`` (a new folder of the
    sender's own) under its own name, with the care of :mod:`shared.safe_files`: ``(the copy, "")``, or
    ``(None, reason)``. What the platform then reads is the copy, which the agent cannot swap."""
    resolved, reason = check_send_path(raw, roots)
    if resolved is None:
        return None, reason
    path = Path(resolved)
    root = next(r.resolve() for r in roots if _under(path, r.resolve()))
    copy = folder / path.name
    try:
        safe_files.copy_under(root, path.relative_to(root), copy, MAX_SEND_BYTES)
    except safe_files.Refused as exc:
        return None, _reason(exc)
    except (FileNotFoundError, NotADirectoryError):
        return None, MISSING
    return copy, ""


def refusal_words(raw: str, reason: str) -> str:
    """The line a reply gets for a file it could not attach, in the agent's voice and plain words:
    ``(I couldn't attach secrets.txt: it is outside my workspace.)``."""
    name = Path(raw).name or raw
    why = _IN_WORDS.get(reason) or (
        "its path cannot be followed" if reason.startswith(UNRESOLVABLE) else "it may not be sent"
    )
    return f"(I couldn't attach {name}: {why}.)"
