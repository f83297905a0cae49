"""Chunking: paragraph, then line, then space cuts; code fences balanced per chunk; per-platform units."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.chunking import split_message, utf16_len

pytestmark = pytest.mark.unit

FENCE = re.compile(r"^[ \t]{0,3}(```+|~~~+)", re.MULTILINE)


def words(text: str) -> list[str]:
    return [w for w in re.split(r"\s+", text) if w and not w.startswith(("```", "~~~"))]


def test_short_text_is_one_chunk_and_blank_is_none() -> None:
    assert split_message("hello", 100) == ["hello"]
    assert split_message("  \n\n ", 100) == []


def test_prefers_paragraph_then_line_then_space() -> None:
    para = "a" * 60 + "\n\n" + "b" * 30
    assert split_message(para, 80) == ["a" * 60, "b" * 30]
    lines = "a" * 60 + "\n" + "b" * 30
    assert split_message(lines, 80) == ["a" * 60, "b" * 30]
    spaced = "a" * 60 + " " + "b" * 30
    assert split_message(spaced, 80) == ["a" * 60, "b" * 30]
    # a paragraph break too early (first third) loses to a later line break
    early = "a" * 5 + "\n\n" + "b" * 50 + "\n" + "c" * 40
    assert split_message(early, 80)[0] == "a" * 5 + "\n\n" + "b" * 50


def test_hard_cut_when_no_separator() -> None:
    chunks = split_message("x" * 250, 100)
    assert "".join(chunks) == "x" * 250
    assert all(len(c) <= 100 for c in chunks)


def test_code_fence_closed_and_reopened_with_language() -> None:
    code = "```python\n" + "".join(f"print({i})\n" for i in range(40)) + "```\nafter"
    chunks = split_message(code, 120)
    assert len(chunks) > 2
    for chunk in chunks:
        assert len(FENCE.findall(chunk)) % 2 == 0, chunk
    for chunk in chunks[1:-1]:
        assert chunk.startswith("```python\n") and chunk.endswith("```")
    assert words("\n".join(chunks)) == words(code)


def test_telegram_counts_utf16_units() -> None:
    text = "😀" * 3000  # 6000 UTF-16 units, 3000 characters
    chunks = split_message(text, 4096, length=utf16_len)
    assert len(chunks) == 2
    assert all(utf16_len(c) <= 4096 for c in chunks)
    assert "".join(chunks) == text
    assert split_message(text, 4096) == [text]  # by characters it would fit


def test_rejects_tiny_limits() -> None:
    with pytest.raises(ValueError, match="at least"):
        split_message("hello", 10)


# Fences as Markdown writes them: whole lines. (Backticks glued to words are text, and an info string
# makes a line an opener, never a closer, so a naive count of ``` would be the wrong oracle.)
_alphabet = st.sampled_from(["a", "b", " ", "\n", "\n\n", "\n```\n", "\n```py\n", "é", "😀", "word "])
_FENCE_LINE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)", re.MULTILINE)


def _open_fence_after(text: str) -> str | None:
    """An independent CommonMark-style tracker: the fence still open at the end of ``text``."""
    current: str | None = None
    for m in _FENCE_LINE.finditer(text):
        marker, info = m.group(1), m.group(2)
        if current is None:
            current = marker
        elif marker[0] == current[0] and len(marker) >= len(current) and not info:
            current = None
    return current


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_alphabet, max_size=400), limit=st.integers(min_value=32, max_value=300))
def test_properties_limits_order_and_balanced_fences(parts: list[str], limit: int) -> None:
    text = "".join(parts)
    for measure in (len, utf16_len):
        chunks = split_message(text, limit, length=measure)
        assert all(measure(c) <= limit for c in chunks)
        assert all(c.strip() for c in chunks)
        # no visible character is lost or reordered (fence lines may be added at cuts)
        strip = lambda s: re.sub(r"`+(py)?|\s", "", s)  # noqa: E731
        assert strip("".join(chunks)) == strip(text)
        if _open_fence_after(text) is None and len(chunks) > 1:
            # fences open at a cut are closed in that chunk and reopened in the next
            assert all(_open_fence_after(c) is None for c in chunks[:-1])
