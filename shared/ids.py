"""Message ids: a descriptive prefix, an underscore and 8 lowercase alphanumerics (seed 000)."""

from __future__ import annotations

import hashlib
import os
import re
import string

ALPHABET = string.ascii_lowercase + string.digits

#: The prefixes seed 000 names, plus the ones agentpost adds for its own sources.
KNOWN_PREFIXES = frozenset(
    {
        "api",
        "cli",
        "web",
        "discord",
        "telegram",
        "whatsapp",
        "slack",
        "internal",
        "chat",
        "chatroom",
        "chatroom_batch",
        "proactive",
        "heartbeat",
        "schedule",
        "notice",
    }
)

MESSAGE_ID_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}_[a-z0-9]{8}$")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


_SPACE = len(ALPHABET) ** 8


#: Every two-character string of the alphabet, by value: an id is four lookups instead of eight divisions.
_PAIRS = [a + b for b in ALPHABET for a in ALPHABET]
_PAIR_SPACE = len(_PAIRS)
#: Byte value -> an id character (value mod 36), for ``bytes.translate``.
_BYTE_TO_CHAR = bytes(ord(ALPHABET[b % len(ALPHABET)]) for b in range(256))
#: Prefixes already checked (a handful per process), so the hot path skips the regular expression.
_GOOD_PREFIXES: set[str] = set()


def _encode(number: int) -> str:
    """The low 8 base-36 digits of ``number``, least significant first."""
    number, a = divmod(number, _PAIR_SPACE)
    number, b = divmod(number, _PAIR_SPACE)
    number, c = divmod(number, _PAIR_SPACE)
    return _PAIRS[a] + _PAIRS[b] + _PAIRS[c] + _PAIRS[number % _PAIR_SPACE]


def new_id(prefix: str) -> str:
    """A fresh random id such as ``api_x9y8z7w6`` (41 random bits; one OS random call, not eight)."""
    if prefix not in _GOOD_PREFIXES:
        if not _PREFIX_RE.match(prefix):
            raise ValueError(f"id prefix {prefix!r} must be lowercase letters, digits or '_'")
        if len(_GOOD_PREFIXES) < 256:
            _GOOD_PREFIXES.add(prefix)
    # Eight random bytes, each mapped to a character by one table lookup in C. 256 = 7 * 36 + 4, so four
    # characters are a little likelier than the rest: 5.167 bits a character instead of 5.170, 41.3 in all.
    return prefix + "_" + os.urandom(8).translate(_BYTE_TO_CHAR).decode("ascii")


def derived_id(prefix: str, *parts: str) -> str:
    """A deterministic id from ``parts``, so the same logical message (a heartbeat slot, a platform
    update) always gets the same id and the queue's uniqueness refuses it a second time."""
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"id prefix {prefix!r} must be lowercase letters, digits or '_'")
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).digest()
    return prefix + "_" + _encode(int.from_bytes(digest, "big"))


def is_message_id(value: str) -> bool:
    """True when ``value`` has the ``prefix_xxxxxxxx`` shape."""
    return bool(MESSAGE_ID_RE.match(value))
