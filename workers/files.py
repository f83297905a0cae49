"""Files in and out of agent runs.

Inbound: channel adapters save attachments under the files folder and put ``[file: /abs/path]`` lines in
the message; the processor passes the message text through unchanged, so the lines reach the agent, and
:func:`describe_inbound` adds a note for a referenced file that does not exist (the agent should not go
looking for it).

Outbound: ``[send_file: path]`` in a reply attaches a file only when it resolves (symlinks followed) to a
regular file inside the agent's workspace or the files folder. Anything else — a missing file, a folder,
``/etc/passwd``, ``../../secret``, a symlink pointing out — is refused with a reason the processor logs as
a ``send_file_refused`` event. Relative paths are taken relative to the workspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.routing import parse_file_refs, parse_send_files, strip_send_file_tags


@dataclass(frozen=True)
class OutboundFiles:
    """The reply without its send_file tags, the files to attach and the ones refused (with why)."""

    text: str
    files: list[str]
    refused: list[tuple[str, str]]


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def check_send_file(raw: str, workspace: Path, files_dir: Path) -> tuple[str | None, str]:
    """Resolve one ``[send_file: raw]`` path: ``(absolute path, "")`` if allowed, else ``(None, reason)``."""
    roots = [workspace.resolve(), files_dir.resolve()]
    candidate = Path(raw).expanduser()
    if not candidate.is_absolute():
        candidate = workspace / candidate
    try:
        resolved = candidate.resolve(strict=True)
    except (FileNotFoundError, NotADirectoryError):
        return None, "no such file"
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        return None, f"cannot resolve the path ({exc})"
    if not _inside(resolved, roots):
        return None, "outside the agent's workspace and the files folder"
    if not resolved.is_file():
        return None, "not a regular file"
    return str(resolved), ""


def outbound_files(reply: str, workspace: Path, files_dir: Path) -> OutboundFiles:
    """Split a reply into its text (tags removed) and its allowed and refused attachments."""
    paths = parse_send_files(reply)
    if not paths:
        return OutboundFiles(reply, [], [])
    files: list[str] = []
    refused: list[tuple[str, str]] = []
    for raw in paths:
        resolved, reason = check_send_file(raw, workspace, files_dir)
        if resolved is None:
            refused.append((raw, reason))
        elif resolved not in files:
            files.append(resolved)
    return OutboundFiles(strip_send_file_tags(reply), files, refused)


def describe_inbound(text: str) -> str:
    """Notes for ``[file: ...]`` references the agent cannot open (empty when all are fine)."""
    notes = []
    for raw in parse_file_refs(text):
        path = Path(raw)
        if not path.is_absolute():
            notes.append(f"(note: attachment path {raw!r} is not absolute)")
        elif not path.exists():
            notes.append(f"(note: attachment {raw} is no longer on disk)")
    return "\n".join(notes)
