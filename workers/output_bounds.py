"""What a run's output may cost the processor while it streams: bounded lines, a bounded reply, bounded texts.

An agent is untrusted: a run may print 20 MB on purpose (a prompt-injected one), as one line or as many.
The processor reads it with bounded memory:

- :class:`Lines` splits stdout into lines holding at most :data:`LINE_KEEP` bytes of one in memory; a longer
  line is handed over in parts, as it arrives.
- :class:`LongJsonLine` reads such a line of a JSON-lines CLI (claude, codex) and makes it a short JSON line
  of the same shape: each string longer than :data:`STRING_KEEP` characters is cut to its start and
  :data:`CUT_MARK`; the strings under the keys a provider names (claude's ``result``) are decoded whole into
  a :class:`TextSpool` instead (the reply), so the reply of a huge answer is not lost.
- :class:`TextSpool` holds a text (the reply) in memory up to :data:`TEXT_KEEP` characters and, beyond, all of
  it in an unnamed file (``O_TMPFILE``: nothing is left behind by a crash), up to :data:`FILE_MAX` bytes (just
  under the 50 MB a reply may attach).
- :func:`save_long_reply`: a reply longer than ``[processor] reply_max_chars`` is cut, with a plain note, and
  its whole text saved as ``reply.txt`` for the reply to attach.
- :class:`PartialText` is the text of the message being streamed (the live preview): its first
  :data:`PREVIEW_KEEP` characters and its length, so telling the preview costs no more as the text grows.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from shared.chat.previews import PREVIEW_MAX_CHARS
from shared.file_access import MAX_SEND_BYTES

#: A stdout line longer than this (bytes) is never held whole in memory (:class:`Lines`).
LINE_KEEP = 1024 * 1024
#: A JSON string in a long line keeps this many characters; the rest is cut (or spooled, see the docstring).
STRING_KEEP = 4000
#: What ends a string cut by :class:`LongJsonLine`.
CUT_MARK = " […]"
#: The short form of a long JSON line may have this many characters outside its cut strings; a line made of
#: more (a million tiny values) is dropped whole.
SHAPE_MAX = 256 * 1024
#: A reply up to this many characters stays in memory; a longer one goes to a file (:class:`TextSpool`).
TEXT_KEEP = 1_000_000
#: A reply's file stops growing at this many bytes (what followed is counted, and said in a last line): the
#: largest file a reply may attach, less room for that line.
FILE_MAX = MAX_SEND_BYTES - 1024
#: The live preview shows at most this many characters of the text being written (platforms show the first
#: 2,000-4,096 of it anyway; the final reply carries the rest).
PREVIEW_KEEP = PREVIEW_MAX_CHARS

_DECODER = json.JSONDecoder(strict=False)  # raw control characters inside strings are the CLI's business
# Complete tokens of a JSON string's inside: plain characters, simple escapes, \uXXXX escapes (a high
# surrogate only together with its low half, so a pair is never decoded in two pieces). Possessive (``*+``,
# ``++``): a backtracking repeat keeps a mark per character, 120 bytes each (a 1 MB string cost 150 MB).
_TOKENS = re.compile(
    r'(?:[^"\\]++|\\["\\/bfnrt]|\\u(?![dD][89abAB])[0-9a-fA-F]{4}'
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})*+",
    re.DOTALL,
)


class TextSpool:
    """A text that may be far longer than the processor should hold (see the module docstring). ``folder``:
    where its file is made (None: the system's temporary folder)."""

    def __init__(
        self, folder: Path | None = None, *, keep: int = TEXT_KEEP, file_max: int = FILE_MAX
    ) -> None:
        self.folder = folder
        self.keep = keep
        self.file_max = file_max
        self.chars = 0  # all of it, kept or not
        self.dropped = 0  # characters past file_max, counted only
        self._parts: list[str] = []
        self._head = ""  # once spilled: the first ``keep`` characters
        self._file: IO[bytes] | None = None
        self._bytes = 0

    @property
    def spilled(self) -> bool:
        """Whether the text is in a file (it grew past ``keep``)."""
        return self._file is not None

    def append(self, text: str) -> None:
        if not text:
            return
        self.chars += len(text)
        if self._file is None:
            self._parts.append(text)
            if self.chars <= self.keep:
                return
            whole, self._parts = "".join(self._parts), []
            self._head = whole[: self.keep]
            # Unnamed, closed by close(): nothing is left behind, even by a killed processor.
            self._file = tempfile.TemporaryFile(dir=self.folder)  # noqa: SIM115
            text = whole
        data = text.encode("utf-8", errors="replace")
        room = self.file_max - self._bytes
        if len(data) > room:
            kept = data[:room].decode("utf-8", errors="ignore")  # whole characters only
            self.dropped += len(text) - len(kept)
            data = kept.encode()
        if data:
            self._file.write(data)
            self._bytes += len(data)

    def text(self) -> str:
        """The whole text when it is in memory; its first ``keep`` characters when it is in a file."""
        return self._head if self._file is not None else "".join(self._parts)

    def reset(self) -> None:
        """Start again empty (a new message of the run)."""
        self.close()
        self.chars = self.dropped = self._bytes = 0
        self._parts, self._head = [], ""

    def copy_to(self, out: IO[bytes]) -> int:
        """Write the whole text (UTF-8) to ``out``, in bounded pieces; returns the bytes written."""
        if self._file is None:
            data = self.text().encode("utf-8", errors="replace")
            out.write(data)
            return len(data)
        self._file.flush()
        self._file.seek(0)
        written = 0
        while chunk := self._file.read(1024 * 1024):
            out.write(chunk)
            written += len(chunk)
        if self.dropped:
            note = f"\n\n[agentpost: the output went on for {self.dropped:,} more characters, not kept]\n"
            written += out.write(note.encode())
        return written

    def close(self) -> None:
        """Let the file go (it has no name: closing removes it)."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


class PartialText:
    """The text of the message being streamed, for the live preview: its first ``keep`` characters and its
    length (see the module docstring)."""

    def __init__(self, keep: int = PREVIEW_KEEP) -> None:
        self.keep = keep
        self.chars = 0
        self._parts: list[str] = []
        self._kept = 0

    def __bool__(self) -> bool:
        return self.chars > 0

    def append(self, text: str) -> bool:
        """Add ``text``; True when what the preview shows changed (past ``keep`` only the mark that the text
        goes on appears, once)."""
        went_on = self.chars > self._kept
        self.chars += len(text)
        if self._kept >= self.keep:
            return not went_on
        piece = text[: self.keep - self._kept]
        self._parts.append(piece)
        self._kept += len(piece)
        return True

    def clear(self) -> None:
        self.chars = self._kept = 0
        self._parts = []

    def shown(self) -> str:
        """What the preview shows: the text, or its first ``keep`` characters and a mark that it goes on."""
        text = "".join(self._parts)
        if len(self._parts) > 1:
            self._parts = [text]
        return text + (" …" if self.chars > self._kept else "")


# -- lines -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    """A whole line (without its newline), at most about :data:`LINE_KEEP` bytes; ``newline``: False for
    the output's last line when it did not end with one."""

    data: bytes
    newline: bool = True


@dataclass(frozen=True)
class LongPart:
    """The next part of a line too long to hold; ``end`` on the last one (its data may be empty), with
    ``newline`` as for :class:`Line`."""

    data: bytes
    end: bool = False
    newline: bool = True


class Lines:
    """Splits a byte stream into lines, holding at most ``keep`` bytes of one (see the module docstring)."""

    def __init__(self, keep: int = LINE_KEEP) -> None:
        self.keep = keep
        self.buffer = bytearray()
        self.long = False  # inside a line already handed over in parts

    def feed(self, chunk: bytes) -> list[Line | LongPart]:
        out: list[Line | LongPart] = []
        start = 0
        while (cut := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start:cut]
            if self.long:
                out.append(LongPart(piece, end=True))
                self.long = False
            elif self.buffer:
                self.buffer += piece
                out.append(Line(bytes(self.buffer)))
                self.buffer.clear()
            else:
                out.append(Line(piece))
            start = cut + 1
        rest = chunk[start:]
        if self.long:
            if rest:
                out.append(LongPart(rest))
        else:
            self.buffer += rest
            if len(self.buffer) > self.keep:
                out.append(LongPart(bytes(self.buffer)))
                self.buffer.clear()
                self.long = True
        return out

    def close(self) -> list[Line | LongPart]:
        """What is left at the end of the stream (a last line without a newline)."""
        if self.long:
            self.long = False
            return [LongPart(b"", end=True, newline=False)]
        if self.buffer:
            line = Line(bytes(self.buffer), newline=False)
            self.buffer.clear()
            return [line]
        return []


# -- long JSON lines -------------------------------------------------------------------------------------
@dataclass
class CutString:
    """A string :class:`LongJsonLine` cut: its length, and the whole of it when its key is spooled."""

    chars: int
    spool: TextSpool | None = None


class LongJsonLine:
    """Reads one long JSON line in parts (see the module docstring). ``spool_keys``: the keys whose long
    string values are kept whole, in a :class:`TextSpool` made in ``folder``."""

    def __init__(self, spool_keys: frozenset[str] = frozenset(), folder: Path | None = None) -> None:
        self.spool_keys = spool_keys
        self.folder = folder
        self.size = 0  # bytes read
        self.cuts: dict[str, CutString] = {}  # by the cut string's short form
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._shape: list[str] = []  # the short line
        self._shape_chars = 0
        self._started = False
        self._json = True
        self._in_string = False
        self._pending = ""  # undecoded inside of the current string
        self._kept: list[str] = []  # decoded start of the current string
        self._kept_chars = 0
        self._chars = 0  # of the current string
        self._key: str | None = None  # the current string's key, when it is a value
        self._last_key = ""
        self._after_colon = False
        self._spool: TextSpool | None = None

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        if not self._json:
            return
        text = self._utf8.decode(data)
        if not self._started:
            stripped = text.lstrip()
            if not stripped:
                return
            self._started = True
            if not stripped.startswith("{"):
                self._json = False  # not a JSON line: nothing of it is used
                return
        self._scan(text)

    def finish(self) -> str:
        """The short JSON line ("" when the line was no JSON or too big to shorten)."""
        self._scan(self._utf8.decode(b"", final=True))
        if not self._json or self._in_string:
            self.close()
            return ""
        return "".join(self._shape)

    def close(self) -> None:
        """Let the spools go (a provider that keeps one has taken it out of :attr:`cuts` first)."""
        for cut in self.cuts.values():
            if cut.spool is not None:
                cut.spool.close()
        if self._spool is not None:
            self._spool.close()

    def _emit(self, text: str) -> None:
        self._shape_chars += len(text)
        if self._shape_chars > SHAPE_MAX:
            self._json = False
            self._shape = []
            return
        self._shape.append(text)

    def _scan(self, text: str) -> None:
        pos = 0
        while pos < len(text) and self._json:
            if not self._in_string:
                quote = text.find('"', pos)
                between = text[pos:] if quote < 0 else text[pos:quote]
                if between.strip():
                    tail = between.rstrip()[-1]
                    self._after_colon = tail == ":"
                self._emit(between)
                if quote < 0:
                    return
                self._start_string()
                pos = quote + 1
            else:
                pos = self._string_part(text, pos)

    def _start_string(self) -> None:
        self._in_string = True
        self._pending, self._kept, self._kept_chars, self._chars = "", [], 0, 0
        self._key = self._last_key if self._after_colon else None
        self._after_colon = False

    def _string_part(self, text: str, pos: int) -> int:
        """Take the inside of the current string from ``text[pos:]``; returns where scanning goes on."""
        pending = self._pending + text[pos:]  # always ends where ``text`` ends
        while True:
            match = _TOKENS.match(pending)  # always matches (maybe nothing): the pattern is a repetition
            end = match.end() if match is not None else 0
            closing = end < len(pending) and pending[end] == '"'
            if end:
                self._take(_DECODER.decode('"' + pending[:end] + '"'))
            if closing:
                self._close_string()
                self._pending = ""
                return len(text) - (len(pending) - end) + 1
            if end < len(pending) and len(pending) - end >= 12:
                # A lone surrogate or an invalid escape: one replacement character, and on.
                skip = 6 if pending[end + 1 : end + 2] == "u" else 2
                self._take("\ufffd")
                pending = pending[end + skip :]
                continue
            self._pending = pending[end:]
            return len(text)

    def _take(self, decoded: str) -> None:
        self._chars += len(decoded)
        if self._spool is not None:
            self._spool.append(decoded)
            return
        piece = decoded[: max(0, STRING_KEEP - self._kept_chars)]
        if piece:
            self._kept.append(piece)
            self._kept_chars += len(piece)
        if self._chars > STRING_KEEP and self._key in self.spool_keys:
            # From here on the whole string is wanted (the reply): what was kept, then everything else.
            self._spool = TextSpool(self.folder)
            self._spool.append("".join(self._kept))
            self._spool.append(decoded[len(piece) :])

    def _close_string(self) -> None:
        self._in_string = False
        kept = "".join(self._kept)
        if self._chars <= STRING_KEEP:
            self._emit(json.dumps(kept))
            if self._key is None:
                self._last_key = kept  # a key, if a colon follows (a value's key is looked at only then)
            return
        short = kept + CUT_MARK
        self.cuts[short] = CutString(self._chars, self._spool)
        self._spool = None
        self._emit(json.dumps(short))


# -- replies over the limit ------------------------------------------------------------------------------
#: The name of the file holding the whole of a reply too long to send as text.
REPLY_FILE = "reply.txt"


def save_long_reply(text: str, whole: TextSpool | None, limit: int, folder: Path) -> tuple[str, Path | None]:
    """A reply within ``limit`` characters: ``(text, None)``. A longer one (``whole``: all of it when the run
    could not hold it, ``text`` its start): its first ``limit`` characters with a plain note, and the path of
    ``folder/reply.txt`` holding the whole text. ``folder`` must not exist yet (a new one per run: nothing
    can be waiting there, a link or a FIFO in its place makes the save fail). A save that fails gives the
    cut text with a note saying the whole could not be kept, and None."""
    chars = whole.chars if whole is not None else len(text)
    if chars <= limit:
        return text, None
    shown = text[:limit].rstrip()
    path = folder / REPLY_FILE
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o700)  # refuses an existing name (a link among them)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            if whole is not None:
                whole.copy_to(out)
            else:
                out.write(text.encode("utf-8", errors="replace"))
    except OSError as exc:
        note = (
            f"(The reply was {chars:,} characters; the first {limit:,} are shown. "
            f"The whole text could not be saved: {exc.strerror or exc}.)"
        )
        return f"{shown}\n\n{note}", None
    note = (
        f"(The reply was {chars:,} characters; the first {limit:,} are shown "
        f"and the whole text is attached as {REPLY_FILE}.)"
    )
    return f"{shown}\n\n{note}", path
