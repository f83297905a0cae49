"""Any command, the ``command`` provider: a CLI from the agent's argv template whose stdout is the reply
(see :mod:`workers.providers.base` for the interface and the runner every provider shares)."""

from __future__ import annotations

import codecs
import os
import shutil

from workers.output_bounds import STRING_KEEP, LongPart
from workers.providers.base import CliProvider, ProgressFn, ProviderError, RunRequest, StreamState


class CommandProvider(CliProvider):
    """Any CLI from ``agents.NAME.command``: stdout is the reply; a non-zero exit is a failure."""

    name = "command"
    _utf8: codecs.IncrementalDecoder | None = None  # of the long line being read

    def argv(self, request: RunRequest) -> list[str]:
        template = request.settings.command
        if not template:
            raise ProviderError(f"agents.{request.agent}.command is empty")
        values = {
            "prompt": request.prompt,
            "workspace": str(request.workspace),
            "agent": request.agent,
            "session": request.session_id or "",
            "model": request.settings.model,
        }
        argv = []
        for part in template:
            try:
                argv.append(part.format_map(values))
            except (KeyError, IndexError, ValueError) as exc:
                raise ProviderError(
                    f"agents.{request.agent}.command: bad placeholder in {part!r} ({exc}); "
                    "use {prompt}, {workspace}, {agent}, {session}, {model} and {{ }} for braces"
                ) from None
        self.stdin_prompt = not any("{prompt}" in part for part in template)
        first = argv[0]
        if os.sep not in first:
            found = shutil.which(first, path=request.env.get("PATH", os.environ.get("PATH")))
            if found is None:
                raise ProviderError(f"agents.{request.agent}.command[0] = {first!r} is not on PATH")
            argv[0] = found
        return argv

    def parse_line(self, line: str, state: StreamState) -> list[str]:
        state.text.append(line + "\n" if state.newline else line)  # the reply is the output as printed
        return [line]

    async def _long_part(
        self, part: LongPart, state: StreamState, progress: ProgressFn, request: RunRequest
    ) -> str | None:
        """A line too long to hold: all of it goes to the reply as it comes, its start is the progress."""
        if self._utf8 is None:
            self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        text = self._utf8.decode(part.data, final=part.end)
        state.text.append(text)
        if len(state.long_start) < STRING_KEEP:
            state.long_start += text[: STRING_KEEP - len(state.long_start)]
        if not part.end:
            return None
        self._utf8 = None
        if part.newline:
            state.text.append("\n")
        start, state.long_start = state.long_start, ""
        if start.strip():
            await progress(start)
        return None
