"""Split a reply into chunks a chat platform accepts.

Rules, in order of preference for each cut: at a paragraph break (blank line), at a line break, at a space,
and only as a last resort in the middle of a word. A Markdown code fence that is open at a cut is closed at
the end of the chunk and reopened (with its language) at the start of the next one, so every chunk renders
on its own. Lengths are measured by a function the caller gives: characters for Discord and WhatsApp,
UTF-16 code units for Telegram (:func:`utf16_len`).

The split is a pure function of the text and the limit, so a process that restarts in the middle of a
delivery computes exactly the same chunks and can resume at the first one it has not sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Length = Callable[[str], int]

_FENCE_RE = re.compile(r"^[ \t]{0,3}(?P<marker>```+|~~~+)[ \t]*(?P<lang>[^\s`]*)", re.MULTILINE)
MIN_LIMIT = 32
_MAX_LANG = 16


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (Telegram counts message limits and offsets this way)."""
    return len(text.encode("utf-16-le")) // 2


def _open_fence(chunk: str) -> tuple[str, str] | None:
    """The fence left open at the end of ``chunk`` as (marker, language), or None when all are closed."""
    current: tuple[str, str] | None = None
    for match in _FENCE_RE.finditer(chunk):
        marker, lang = match.group("marker"), match.group("lang")
        if current is None:
            current = (marker, lang)
        elif marker[0] == current[0][0] and len(marker) >= len(current[0]) and not lang:
            current = None
    return current


def _fit(text: str, budget: int, length: Length) -> int:
    """The largest prefix length (in characters) of ``text`` whose measured length is at most ``budget``."""
    if length(text) <= budget:
        return len(text)
    lo, hi = 0, len(text)
    while lo < hi:  # binary search: length() grows with the prefix
        mid = (lo + hi + 1) // 2
        if length(text[:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _cut_point(window: str, floor: int) -> tuple[int, int, bool]:
    """Where a chunk ends inside ``window``, where the next one starts, and whether it was a line cut.

    A cut must lie after ``floor`` (the reopened fence line), so every chunk makes progress; paragraph and
    line cuts must also lie in the last two thirds, or the chunk would waste most of its room.
    """
    third = max(len(window) // 3, floor)
    for sep in ("\n\n", "\n"):
        at = window.rfind(sep)
        if at > third:
            return at, at + len(sep), True
    at = window.rfind(" ")
    if at > floor:
        return at, at + 1, False
    return len(window), len(window), False


def split_message(text: str, limit: int, *, length: Length = len) -> list[str]:
    """Split ``text`` into chunks of at most ``limit`` units (as measured by ``length``).

    Whitespace-only input gives no chunks. Raises ValueError for a limit below 32.
    """
    if limit < MIN_LIMIT:
        raise ValueError(f"limit must be at least {MIN_LIMIT}")
    markers = [m.group("marker") for m in _FENCE_RE.finditer(text)]
    longest = max((len(m) for m in markers), default=3)
    if longest > 8:  # absurd fences are left alone rather than eating the whole budget
        longest = 3
    budget = limit - 1 - longest  # room for "\n```" when a fence must be closed at the cut
    chunks: list[str] = []
    rest = text.strip("\n")
    floor = 0  # length of the reopened fence line at the start of ``rest``
    while rest.strip():
        if length(rest) <= limit:
            chunks.append(rest)
            break
        window = rest[: _fit(rest, budget, length)]
        end, resume, line_cut = _cut_point(window, floor)
        chunk = rest[:end].rstrip()
        rest = rest[resume:]
        if line_cut:
            rest = rest.lstrip("\n")
        floor = 0
        fence = _open_fence(chunk)
        if fence is not None:
            marker, lang = fence
            if len(marker) > longest:
                marker = marker[:longest]
            lang = lang if lang.isascii() and len(lang) <= _MAX_LANG else ""
            chunk += "\n" + marker
            opener = marker + lang + "\n"
            rest = opener + rest
            floor = len(opener)
        if chunk.strip():
            chunks.append(chunk)
    return chunks
