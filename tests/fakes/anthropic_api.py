"""A small fake of the Anthropic Messages API, for running the real Claude Code CLI offline in tests.

Start it with ``with FakeAnthropic() as api:``, point the CLI at ``api.base_url`` (see
:func:`tests.fakes.claude_env.claude_env`) and script the replies::

    api.add_rule("hello", Text("Hi there"))                 # final user text contains "hello"
    api.add_rule(re.compile(r"slow\\Z"), Chunked(("a", "b"), interval=0.5))
    api.add_rule(None, Computed(lambda body: f"turns={user_turns(body)}"))   # default rule

The server listens on ``127.0.0.1`` on a free port and serves, from a background thread:

* ``POST /v1/messages`` (any query, the CLI sends ``?beta=true``): server-sent events when the body says
  ``"stream": true`` (``message_start``, ``content_block_start``, one ``content_block_delta`` per chunk,
  ``content_block_stop``, ``message_delta`` with ``stop_reason: end_turn``, ``message_stop``), else one JSON
  message;
* ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``;
* any other ``GET``/``HEAD``/``POST`` path: ``{}`` with 200.

Every request is recorded (:class:`RecordedRequest`) before it is answered.

What Claude Code 2.1.332 does against it (measured on this machine, 2 cores):

* A plain ``claude -p TEXT`` run makes exactly **one** request, ``POST /v1/messages?beta=true`` with
  ``"stream": true``, the main model, a dozen ``tools`` and ``max_tokens`` 128000; about 0.5-0.9 s wall
  time in all (1-2 s when the machine is busy). Without ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` it
  also sends ``HEAD /api/hello`` to the base URL (a connection warm-up) and looks up ``api.anthropic.com``
  in DNS; with the variables set by :func:`~tests.fakes.claude_env.claude_env` it reaches nothing but the
  fake (checked with strace).
* No side calls (session title, summaries, haiku helpers) were seen in ``-p`` runs of text turns (plain,
  ``-c``, ``--resume``, ``--model haiku``, a 13 s streamed reply, with or without the offline variables),
  though the CLI has such calls (``generate_session_title``, ``agent_summary``, ...). Helper calls carry no
  ``tools``; so a request is "main" when its JSON body has a non-empty ``tools`` list, and scripted rules
  answer main requests only (others get ``side_reply``). Limits: with ``--tools ""`` the main call has no
  tools either (pass ``is_main=``), and the CLI's "fork" side calls (``away_summary``, session rename)
  reuse the main call's tools and would count as main (none happen in ``-p`` runs).
* The first user message is ``[<system-reminder>…</system-reminder> block, prompt block]``, and the body
  also holds a ``{"role": "system"}`` message after it; with ``-c``/``--resume`` the next request carries
  the earlier user and assistant turns, and the new prompt as the last user message.
* HTTP 400 (:class:`ApiError`): the run ends within a second, exit code 1, final ``result`` line with
  ``is_error: true``, ``terminal_reason: "api_error"``, ``api_error_status: 400`` and ``result:
  "API Error: 400 <message>"`` (``subtype`` stays ``"success"``). No ``api_retry`` line, but the CLI
  silently resends the request with experimental betas stripped one by one: 6 main requests in all, or
  1 with ``CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS=1``.
* HTTP 429 (:class:`RateLimited`): the CLI retries, by default up to 10 times; each retry prints a
  stream-json line ``{"type": "system", "subtype": "api_retry", "attempt": N, "max_retries": 10,
  "retry_delay_ms": D, "error_status": 429, "error": "rate_limit"}``. It honours ``retry-after`` as a lower
  bound (``retry-after: 5`` gave D ≈ 5,870 ms) and otherwise backs off exponentially with jitter (with
  ``retry-after: 1``: about 1.0, 1.2, 2.0, 4.6, 8.2, 16.6, 36.8, 32.6, 38.2 s), so a 429 that never clears
  costs about three minutes. When retries run out: exit 1, ``is_error: true``, ``terminal_reason:
  "api_error"``, ``api_error_status: 429``, ``result: "API Error: Request rejected (429) · <message>"``.
  A 429 that clears (``times=1``) costs one retry, about 1 s, and the run then succeeds.
  ``CLAUDE_CODE_MAX_RETRIES=N`` bounds the retries.
* HTTP 500 (:class:`ApiError` with ``status=500, error_type="api_error"``): retried the same way (about
  0.6, 1, 2, 4, 10, 18, 35, 38, 35, 38 s: 183 s in all for 10 retries), ending with exit 1 and ``result:
  "API Error: 500 <message>. This is a server-side issue..."``, ``api_error_status: 500``.
* HTTP 529 (:class:`Overloaded`): retried like a 429; the ``api_retry`` lines say ``"error_status": 529,
  "error": "overloaded"``; at the end ``api_error_status: 529``, ``api_error_type: "overloaded_error"``,
  ``result: "API Error: 529 Overloaded. This is a server-side issue..."``. A 401 is retried as well
  (``"error": "authentication_failed"``, three minutes by default); 408 and 409 too (``"server_error"``),
  and a refused connection (``error_status: null``, ``"error": "unknown"``). What each kind prints is kept
  in ``tests/fixtures/cli_errors/`` (``capture.py`` there regenerates it).
* ``x-should-retry: false`` (``should_retry=False``) on a 429 or 500 is obeyed: one request, then the
  error result at once. With it or ``CLAUDE_CODE_MAX_RETRIES`` tests of failures stay fast.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, Self, TypeAlias
from urllib.parse import urlsplit

from tests.fakes.http_fake import QuietHandler

JSON: TypeAlias = dict[str, Any]
RequestKind = Literal["main", "side", "count_tokens", "other"]
Matcher: TypeAlias = str | re.Pattern[str] | None

_REMINDER_RE = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


@dataclass(frozen=True)
class Text:
    """Answer ``text`` in one chunk, after ``delay`` seconds of silence (no response headers yet)."""

    text: str
    delay: float = 0.0


@dataclass(frozen=True)
class Chunked:
    """Answer with the ``parts`` streamed one ``text_delta`` each, ``interval`` seconds apart.

    Simulates a slow reply that keeps streaming; ``delay`` is silence before the first byte.
    """

    parts: Sequence[str]
    interval: float = 0.2
    delay: float = 0.0


@dataclass(frozen=True)
class ApiError:
    """Answer an API error: by default HTTP 400 ``invalid_request_error``, which ends a CLI run at once.

    ``status=500, error_type="api_error"`` (or 529 ``overloaded_error``) makes the CLI retry.
    ``should_retry`` sends ``x-should-retry: true/false`` when given.
    """

    message: str = "scripted error"
    status: int = 400
    error_type: str = "invalid_request_error"
    should_retry: bool | None = None


@dataclass(frozen=True)
class RateLimited:
    """Answer HTTP 429 ``rate_limit_error`` with a ``retry-after`` header of ``retry_after`` seconds."""

    retry_after: int = 1
    message: str = "rate limited by the fake"
    should_retry: bool | None = None


@dataclass(frozen=True)
class Overloaded:
    """Answer HTTP 529 ``overloaded_error``, as the real API does when its servers are overloaded.

    The CLI retries it like a 429 (``api_retry`` lines with ``"error": "overloaded"``, ``error_status``
    529); ``should_retry`` sends ``x-should-retry: true/false`` when given.
    """

    message: str = "Overloaded"
    should_retry: bool | None = None


@dataclass(frozen=True)
class ToolUse:
    """Answer with a call of the CLI tool ``name`` (for example ``"Read"``) with ``input``.

    Streamed as the real API does: an optional ``text`` block first, then a ``tool_use`` content block
    whose input arrives as ``input_json_delta`` pieces, and ``stop_reason: tool_use``. The CLI then runs
    the tool (or refuses it) and sends a follow-up request whose last user message carries the
    ``tool_result`` (see :func:`tool_results`).
    """

    name: str
    input: JSON
    text: str = ""
    delay: float = 0.0


@dataclass(frozen=True)
class Computed:
    """Answer whatever ``fn`` returns for the parsed request body: a text, or any other reply."""

    fn: Callable[[JSON], str | Reply]


Reply: TypeAlias = Text | Chunked | ApiError | RateLimited | Overloaded | ToolUse | Computed
_Resolved: TypeAlias = Text | Chunked | ApiError | RateLimited | Overloaded | ToolUse


@dataclass
class Rule:
    """A scripted reply for main requests whose final user text matches ``match``.

    ``match`` is a substring of the final user text, a compiled regex searched in it (anchor with ``\\Z``
    to match the end), or ``None`` for any text. ``times`` bounds how often the rule answers (``None``:
    always); ``hits`` counts how often it has.
    """

    match: Matcher
    reply: Reply
    times: int | None = None
    hits: int = 0

    def applies_to(self, text: str) -> bool:
        """Whether this rule, not yet used up, matches ``text``."""
        if self.times is not None and self.hits >= self.times:
            return False
        if self.match is None:
            return True
        if isinstance(self.match, str):
            return self.match in text
        return self.match.search(text) is not None


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake received, recorded before it was answered."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    kind: RequestKind
    status: int
    rule: Rule | None = field(default=None, compare=False)
    #: ``time.monotonic()`` when the request arrived (body read, not yet answered): latency measurements.
    at: float = field(default_factory=time.monotonic, compare=False)

    @property
    def is_main(self) -> bool:
        """Whether this was a main conversation call (the ones scripted rules answer)."""
        return self.kind == "main"

    @property
    def last_user_text(self) -> str:
        """The final user text of this request (see :func:`last_user_text`)."""
        return last_user_text(self.body) if isinstance(self.body, dict) else ""

    @property
    def user_turns(self) -> int:
        """The number of user turns in this request (see :func:`user_turns`)."""
        return user_turns(self.body) if isinstance(self.body, dict) else 0


def _user_texts(message: object) -> list[str]:
    """The texts of a user message, ``<system-reminder>`` blocks removed, empty ones dropped."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return []
    content = message.get("content")
    if isinstance(content, str):
        raw = [content]
    elif isinstance(content, list):
        raw = [
            block["text"]
            for block in content
            if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
        ]
    else:
        raw = []
    stripped = (_REMINDER_RE.sub("", text).strip() for text in raw)
    return [text for text in stripped if text]


def last_user_text(body: JSON) -> str:
    """The last text the user typed in a Messages request body, ``<system-reminder>`` blocks removed.

    Looks at the last user message with text (tool results are skipped) and returns its last text block;
    ``""`` when there is none.
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        texts = _user_texts(message)
        if texts:
            return texts[-1]
    return ""


def user_turns(body: JSON) -> int:
    """How many user messages with text (not only tool results or reminders) a request body carries."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(1 for message in messages if _user_texts(message))


def has_tools(body: JSON) -> bool:
    """The default test for a main conversation call: the body offers the model a non-empty tool list."""
    tools = body.get("tools")
    return isinstance(tools, list) and len(tools) > 0


def tool_results(body: JSON) -> list[JSON]:
    """The ``tool_result`` blocks of the request's last user message (``[]`` when it carries none).

    After a :class:`ToolUse` reply the CLI sends the tool's outcome this way: ``tool_use_id``, ``content``
    (a string, or a list of ``text``/``image`` blocks) and ``is_error`` when the tool failed or was refused.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return []
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user" or not isinstance(last.get("content"), list):
        return []
    return [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]


def tool_result_text(block: JSON) -> str:
    """The text of one ``tool_result`` block (its text parts joined; an image part shows as
    ``[image <media_type>, N base64 chars]``)."""
    content = block.get("content")
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for item in content if isinstance(content, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "text":
            parts.append(str(item.get("text", "")))
        elif item.get("type") == "image":
            source = item.get("source") if isinstance(item.get("source"), dict) else {}
            assert isinstance(source, dict)
            parts.append(
                f"[image {source.get('media_type')}, {len(str(source.get('data', '')))} base64 chars]"
            )
    return "\n".join(parts)


def tool_images(block: JSON) -> list[JSON]:
    """The ``image`` parts of one ``tool_result`` block (their ``source``: type, media_type, data)."""
    content = block.get("content")
    return [
        item["source"]
        for item in (content if isinstance(content, list) else [])
        if isinstance(item, dict) and item.get("type") == "image" and isinstance(item.get("source"), dict)
    ]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: FakeAnthropic, host: str = "127.0.0.1") -> None:
        self.fake = fake
        super().__init__((host, 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            return  # a client that hangs up mid-reply (the CLI was killed) is normal here
        if error is not None:
            self.fake.errors.append(error)
        super().handle_error(request, client_address)


class _Handler(QuietHandler):
    server: _Server

    def do_GET(self) -> None:
        self._record(None, "other", 200)
        self._send_json(200, {})

    def do_HEAD(self) -> None:
        self._record(None, "other", 200)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()

    def do_POST(self) -> None:
        raw = self._read_body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        fake = self.server.fake
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/v1/messages/count_tokens":
            self._record(body, "count_tokens", 200)
            self._send_json(200, {"input_tokens": max(1, len(raw) // 4)})
            return
        if path != "/v1/messages" or not isinstance(body, dict):
            self._record(body, "other", 200)
            self._send_json(200, {})
            return
        if not fake.is_main(body):
            self._record(body, "side", 200)
            self._answer(body, Text(fake.side_reply))
            return
        rule, reply = fake._resolve(body)
        self._record(body, "main", _status_of(reply), rule)
        self._answer(body, reply)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
            raw = bytes(data)
        else:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        encoding = self.headers.get("content-encoding", "").lower()
        if encoding in ("gzip", "deflate"):
            raw = zlib.decompress(raw, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
        return raw

    def _record(self, body: Any, kind: RequestKind, status: int, rule: Rule | None = None) -> None:
        parts = urlsplit(self.path)
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.server.fake._record(
            RecordedRequest(self.command, parts.path, parts.query, headers, body, kind, status, rule)
        )

    def _send_json(self, status: int, payload: JSON, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", self.server.fake._next_id("req"))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, body: JSON, reply: _Resolved) -> None:
        fake = self.server.fake
        if isinstance(reply, ApiError | RateLimited | Overloaded):
            headers: dict[str, str] = {}
            if isinstance(reply, RateLimited):
                status, error_type = 429, "rate_limit_error"
                headers["retry-after"] = str(reply.retry_after)
            elif isinstance(reply, Overloaded):
                status, error_type = 529, "overloaded_error"
            else:
                status, error_type = reply.status, reply.error_type
            if reply.should_retry is not None:
                headers["x-should-retry"] = "true" if reply.should_retry else "false"
            error = {"type": "error", "error": {"type": error_type, "message": reply.message}}
            self._send_json(status, error, headers)
            return
        if reply.delay > 0 and fake._stopping.wait(reply.delay):
            self.close_connection = True
            return
        if isinstance(reply, ToolUse):
            self._answer_tool_use(body, reply)
            return
        parts = [reply.text] if isinstance(reply, Text) else list(reply.parts)
        interval = reply.interval if isinstance(reply, Chunked) else 0.0
        model = str(body.get("model", "claude-fake"))
        message_id = fake._next_id("msg")
        input_tokens = max(1, len(json.dumps(body.get("messages", []))) // 4)
        output_tokens = max(1, sum(len(part) for part in parts) // 4)
        if not body.get("stream"):
            message = _message(message_id, model, "".join(parts), input_tokens, output_tokens)
            self._send_json(200, message)
            return
        self._start_stream(_message(message_id, model, None, input_tokens, 1))
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        self._event("content_block_start", block)
        for number, part in enumerate(parts):
            if number > 0 and interval > 0 and fake._stopping.wait(interval):
                return
            delta = {"type": "text_delta", "text": part}
            self._event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
            fake.deltas.append((time.monotonic(), part))
        self._event("content_block_stop", {"type": "content_block_stop", "index": 0})
        end = {"stop_reason": "end_turn", "stop_sequence": None}
        usage = {"output_tokens": output_tokens}
        self._event("message_delta", {"type": "message_delta", "delta": end, "usage": usage})
        self._event("message_stop", {"type": "message_stop"})

    def _answer_tool_use(self, body: JSON, reply: ToolUse) -> None:
        """Stream ``reply`` as a (text block and) ``tool_use`` block ending with ``stop_reason: tool_use``."""
        fake = self.server.fake
        model = str(body.get("model", "claude-fake"))
        message_id = fake._next_id("msg")
        tool_id = f"toolu_fake{next(fake._ids):06d}"
        input_tokens = max(1, len(json.dumps(body.get("messages", []))) // 4)
        arguments = json.dumps(reply.input)
        if not body.get("stream"):
            content: list[JSON] = [{"type": "text", "text": reply.text}] if reply.text else []
            content.append({"type": "tool_use", "id": tool_id, "name": reply.name, "input": reply.input})
            message = _message(message_id, model, None, input_tokens, max(1, len(arguments) // 4))
            message.update(content=content, stop_reason="tool_use")
            self._send_json(200, message)
            return
        self._start_stream(_message(message_id, model, None, input_tokens, 1))
        index = 0
        if reply.text:
            block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            self._event("content_block_start", block)
            delta = {"type": "text_delta", "text": reply.text}
            self._event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
            self._event("content_block_stop", {"type": "content_block_stop", "index": 0})
            index = 1
        tool = {"type": "tool_use", "id": tool_id, "name": reply.name, "input": {}}
        self._event(
            "content_block_start", {"type": "content_block_start", "index": index, "content_block": tool}
        )
        # The input JSON arrives in pieces, as the real API streams it.
        cut = max(1, len(arguments) // 2)
        for piece in (arguments[:cut], arguments[cut:]):
            delta = {"type": "input_json_delta", "partial_json": piece}
            self._event(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            )
        self._event("content_block_stop", {"type": "content_block_stop", "index": index})
        end = {"stop_reason": "tool_use", "stop_sequence": None}
        usage = {"output_tokens": max(1, len(arguments) // 4)}
        self._event("message_delta", {"type": "message_delta", "delta": end, "usage": usage})
        self._event("message_stop", {"type": "message_stop"})

    def _start_stream(self, start: JSON) -> None:
        """Answer 200 with an event stream (closed after it) and send its ``message_start`` with ``start``."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.send_header("request-id", self.server.fake._next_id("req"))
        self.end_headers()
        self.close_connection = True
        self._event("message_start", {"type": "message_start", "message": start})

    def _event(self, name: str, data: JSON) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()


def _message(message_id: str, model: str, text: str | None, input_tokens: int, output_tokens: int) -> JSON:
    """A Messages API message object; ``text=None`` gives the empty one of ``message_start``."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [] if text is None else [{"type": "text", "text": text}],
        "stop_reason": None if text is None else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def _status_of(reply: _Resolved) -> int:
    if isinstance(reply, RateLimited):
        return 429
    if isinstance(reply, Overloaded):
        return 529
    if isinstance(reply, ApiError):
        return reply.status
    return 200


class FakeAnthropic:
    """The fake Messages API server; use as ``with FakeAnthropic() as api:``.

    ``default`` answers main requests that no rule matches (``Text("OK")`` unless given); ``side_reply``
    answers requests that are not main; ``is_main`` tells main requests from side calls (default
    :func:`has_tools`; pass ``lambda body: True`` for runs with ``--tools ""``, whose main calls carry no
    tools). A computed reply that raises is answered with a 500 that the CLI does not retry, and the
    exception is kept in :attr:`errors`.
    """

    def __init__(
        self,
        *,
        default: Reply | None = None,
        side_reply: str = "OK",
        is_main: Callable[[JSON], bool] = has_tools,
        host: str = "127.0.0.1",
    ) -> None:
        #: The address to listen on: loopback, or a test network's own address (tests/netns.py).
        self.host = host
        self.default: Reply = Text("OK") if default is None else default
        self.side_reply = side_reply
        self.is_main = is_main
        self.errors: list[BaseException] = []
        """Exceptions raised by computed replies or inside the fake (a test may assert it stays empty)."""
        self._rules: list[Rule] = []
        self._requests: list[RecordedRequest] = []
        #: Every text delta streamed, as ``(time.monotonic(), text)`` right after it was written (for
        #: measuring how soon a streamed token is visible in a chat).
        self.deltas: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind a free port on :attr:`host` (127.0.0.1) and serve from a background thread."""
        if self._server is not None:
            raise RuntimeError("FakeAnthropic is already running")
        self._stopping.clear()
        self._server = _Server(self, self.host)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-anthropic",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, cut short replies still delayed or streaming, and close the port."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port the fake listens on."""
        if self._server is None:
            raise RuntimeError("FakeAnthropic is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (the :attr:`host`), the value for ``ANTHROPIC_BASE_URL``."""
        return f"http://{self.host}:{self.port}"

    # -- scripting ---------------------------------------------------------------------------------------

    def script(self, *rules: Rule) -> None:
        """Replace all rules with ``rules``, tried in order; the first that applies answers."""
        with self._changed:
            self._rules = list(rules)

    def add_rule(self, match: Matcher, reply: Reply, *, times: int | None = None) -> Rule:
        """Append a rule (see :class:`Rule`) and return it, so a test can read its ``hits``."""
        rule = Rule(match, reply, times)
        with self._changed:
            self._rules.append(rule)
        return rule

    def _resolve(self, body: JSON) -> tuple[Rule | None, _Resolved]:
        text = last_user_text(body)
        with self._changed:
            rule = next((rule for rule in self._rules if rule.applies_to(text)), None)
            if rule is not None:
                rule.hits += 1
        reply = self.default if rule is None else rule.reply
        # A computed reply runs outside the lock, so it may look at the recorded requests.
        for _ in range(10):
            if not isinstance(reply, Computed):
                return rule, reply
            try:
                result = reply.fn(body)
            except Exception as error:
                self.errors.append(error)
                message = f"fake: the computed reply raised {error!r}"
                return rule, ApiError(message, status=500, error_type="api_error", should_retry=False)
            reply = Text(result) if isinstance(result, str) else result
        raise RuntimeError("Computed replies nested more than 10 deep")

    # -- recording ---------------------------------------------------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        with self._changed:
            self._requests.append(request)
            self._changed.notify_all()

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}_fake{next(self._ids):06d}"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._changed:
            return list(self._requests)

    def main_requests(self) -> list[RecordedRequest]:
        """The main conversation calls received so far, oldest first."""
        return [request for request in self.requests if request.is_main]

    def clear(self) -> None:
        """Forget the recorded requests (the rules stay)."""
        with self._changed:
            self._requests.clear()

    def wait_for_main_requests(self, count: int, timeout: float) -> list[RecordedRequest]:
        """Wait until ``count`` main calls have arrived; raise ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                main = [request for request in self._requests if request.is_main]
                if len(main) >= count:
                    return main
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{len(main)} main requests after {timeout} s, wanted {count}")
                self._changed.wait(remaining)
