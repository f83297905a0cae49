"""Images a chat user sent, shown to the model with the prompt.

The intake notes the images a message carries (:data:`shared.inbound_media.IMAGES_KEY`, absolute paths in
the chat's upload folder; :func:`shared.inbound_media.describe_files`); when the run starts they are read
again, checked again (the type by the first bytes, at most :data:`shared.inbound_media.MAX_IMAGE_BYTES`)
and given to claude as ``image`` content blocks beside the prompt's text: a stream-json user message whose
``content`` is ``[{"type": "image", "source": {"type": "base64", ...}}, ..., {"type": "text", "text":
prompt}]``. ``claude -p PROMPT`` cannot carry images, so a run with images always goes through the
stream-json input (:mod:`workers.providers.claude_warm`), cold or warm. Other providers get the prompt
alone, whose ``[file: …]`` lines name the images.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.inbound_media import IMAGES_KEY, MAX_IMAGE_BYTES, sniff_image
from shared.queue.core import QueuedMessage

log = logging.getLogger("agentpost.processor")
#: At most this many images go to the model in one run (Claude's API takes up to 100 per request; more
#: than a few in one chat turn is a folder of files, which the agent can open itself).
MAX_IMAGES = 20


@dataclass(frozen=True)
class PromptImage:
    """One image for the model: its media type and its bytes in base64."""

    media_type: str
    data: str

    def block(self) -> dict[str, Any]:
        """The Messages API ``image`` content block."""
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": self.media_type, "data": self.data},
        }


def read_image(path: Path) -> PromptImage | None:
    """The image at ``path``, or None (gone, too large, not a type the model takes)."""
    try:
        if path.stat().st_size > MAX_IMAGE_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    media_type = sniff_image(data[:16])
    if media_type is None or len(data) > MAX_IMAGE_BYTES:
        return None
    return PromptImage(media_type, base64.b64encode(data).decode("ascii"))


def images_of(messages: Sequence[QueuedMessage]) -> tuple[PromptImage, ...]:
    """The images of a run's messages, oldest message first (at most :data:`MAX_IMAGES`)."""
    found: list[PromptImage] = []
    for message in messages:
        paths = message.metadata.get(IMAGES_KEY) if isinstance(message.metadata, dict) else None
        for raw in paths if isinstance(paths, list) else []:
            if len(found) >= MAX_IMAGES:
                log.warning(
                    "message %s: more than %d images, the rest stay files", message.message_id, MAX_IMAGES
                )
                return tuple(found)
            image = read_image(Path(str(raw)))
            if image is None:
                log.warning(
                    "message %s: image %s could not be read again; it stays a file", message.message_id, raw
                )
                continue
            found.append(image)
    return tuple(found)


def user_content(prompt: str, images: Sequence[PromptImage]) -> str | list[dict[str, Any]]:
    """A stream-json user message's ``content``: the prompt alone, or the images and then the prompt's text
    (the caption is part of the prompt, right after its images)."""
    if not images:
        return prompt
    return [*(image.block() for image in images), {"type": "text", "text": prompt}]
