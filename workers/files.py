"""Files in and out of agent runs.

Inbound: channel adapters save attachments under the files folder and put ``[file: /abs/path]`` lines in
the message; the processor passes the message text through unchanged, so the lines reach the agent, and
:func:`describe_inbound` adds a note for a referenced file that does not exist (the agent should not go
looking for it).

Outbound: ``[send_file: path]`` in a reply attaches a file only when it resolves (symlinks followed) to a
regular file inside the agent's workspace or the upload folder of the chat the reply goes to
(:mod:`shared.file_access`). Anything else — a missing file, a folder, ``/etc/passwd``, ``../../secret``, a
symlink pointing out, another chat's upload — is refused with a reason the processor logs as a
``send_file_refused`` event, and the reply says in one plain line per file that it was not attached and
why (:func:`shared.file_access.refusal_words`): the user would otherwise wait for a file that never comes.
Relative paths are taken relative to the workspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.file_access import check_send_path, refusal_words
from shared.settings.routing import parse_file_refs, parse_send_files, strip_send_file_tags

#: A reply names at most this many refused files one by one (an agent may tag many).
MAX_REFUSAL_LINES = 8


@dataclass(frozen=True)
class OutboundFiles:
    """The reply without its send_file tags (with a line per refused file), the files to attach and the
    ones refused (with why)."""

    text: str
    files: list[str]
    refused: list[tuple[str, str]]


def outbound_files(reply: str, workspace: Path, roots: Sequence[Path]) -> OutboundFiles:
    """Split a reply into its text (tags removed) and its allowed and refused attachments (see
    :func:`shared.file_access.check_send_path`; relative paths are taken in the workspace)."""
    paths = parse_send_files(reply)
    if not paths:
        return OutboundFiles(reply, [], [])
    files: list[str] = []
    refused: list[tuple[str, str]] = []
    for raw in paths:
        resolved, reason = check_send_path(raw, roots, workspace)
        if resolved is None:
            refused.append((raw, reason))
        elif resolved not in files:
            files.append(resolved)
    text = strip_send_file_tags(reply)
    if refused:
        lines = [refusal_words(raw, reason) for raw, reason in refused[:MAX_REFUSAL_LINES]]
        if len(refused) > MAX_REFUSAL_LINES:
            more = len(refused) - MAX_REFUSAL_LINES
            lines.append(f"(… and {more} more file{'s' if more > 1 else ''} I couldn't attach.)")
        text = "\n\n".join(part for part in (text.rstrip(), "\n".join(lines)) if part)
    return OutboundFiles(text, files, refused)


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
