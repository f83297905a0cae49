"""What a file a chat user sent is, for the two kinds that reach the agent other than as a path: images
(shown to the model as image blocks) and recordings (voice notes, transcribed by the channel).

An image is judged by its first bytes, not its name (a photo saved as ``photo.jpg`` may be a PNG): the
four types Claude's API takes, up to :data:`MAX_IMAGE_BYTES`. A recording is judged by its name's suffix,
which each channel sets from the platform's content type (``voice.ogg``, ``voice-message.ogg``,
``audio.oga``).

The queued message carries the images it showed in its metadata (:data:`IMAGES_KEY`, absolute paths) and a
voice note's words in :data:`TRANSCRIPT_KEY`; the processor reads the images again when the run starts.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Sequence
from pathlib import Path

#: Claude's API refuses a larger image (about 5 MB of image data per block).
MAX_IMAGE_BYTES = 5 * 1024 * 1024
#: Metadata key of a queued message: the absolute paths of the images to show the model.
IMAGES_KEY = "images"
#: Metadata key of a queued message: the words of the voice note it was made from.
TRANSCRIPT_KEY = "voice_transcript"

_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff_image(head: bytes) -> str | None:
    """The media type of an image whose file starts with ``head`` (16 bytes are enough), when it is one the
    model can see: JPEG, PNG, GIF or WebP; None otherwise."""
    for magic, media_type in _SIGNATURES:
        if head.startswith(magic):
            return media_type
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_type(path: Path) -> str | None:
    """The media type of the image at ``path`` by its first bytes, or None (not an image the model takes,
    or unreadable)."""
    try:
        with path.open("rb") as file:
            return sniff_image(file.read(16))
    except OSError:
        return None


def looks_like_image(path: Path) -> bool:
    """Whether ``path``'s name says it is an image (of any type, e.g. a TIFF or HEIC the model cannot take)."""
    guessed, _ = mimetypes.guess_type(path.name)
    return bool(guessed and guessed.startswith("image/"))


def is_recording(path: Path) -> bool:
    """Whether ``path``'s name says it is audio (a voice note, a recording): ``.ogg``, ``.oga``, ``.opus``,
    ``.mp3``, ``.m4a``, ``.wav``, ``.webm`` audio and the rest of ``audio/*``."""
    suffix = path.suffix.lower()
    if suffix in (".ogg", ".oga", ".opus", ".m4a", ".weba"):
        return True
    guessed, _ = mimetypes.guess_type(path.name)
    return bool(guessed and guessed.startswith("audio/"))


def megabytes(size: int) -> str:
    """``7.2 MB``: a size as a person reads it."""
    return f"{size / 1_000_000:.1f} MB"


def describe_files(files: Sequence[Path]) -> tuple[list[str], list[str]]:
    """The lines a message's files add to its text (``[file: /abs/path]``, with a note on each image), and
    the paths of the images to show the model. An image too large or of a type the model cannot take stays
    a path, and its note says so (the agent may still open or convert the file)."""
    refs: list[str] = []
    images: list[str] = []
    for path in files:
        ref = f"[file: {path}]"
        media_type = image_type(path)
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        if media_type is not None and size <= MAX_IMAGE_BYTES:
            images.append(str(path))
            ref += f" (an image, {media_type}: shown to you with this message)"
        elif media_type is not None:
            ref += (
                f" (an image of {megabytes(size)}, too large to show you (at most "
                f"{megabytes(MAX_IMAGE_BYTES)}): open the file to look at it)"
            )
        elif looks_like_image(path):
            ref += " (an image of a type you cannot be shown: open or convert the file to look at it)"
        refs.append(ref)
    return refs, images
