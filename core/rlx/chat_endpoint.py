"""An OpenAI-compatible chat endpoint on localhost, through which agents reach the policy.

Each episode has a base URL of its own, ``http://127.0.0.1:PORT/episodes/KEY/v1``, so that
a call says which episode it belongs to whatever client makes it:

    POST BASE/chat/completions   OpenAI's chat completion request and response (n = 1, no streaming)
    GET  BASE/models             {"object": "list", "data": [{"id": "policy", ...}]}
    GET  /v1/models              the same, for clients that probe the server first
    errors                       HTTP 4xx/5xx with {"error": {"message", "type", "code"}}

This module speaks the wire format only: a request is parsed here into a ``ChatCall`` and
put on a queue, and the thread that owns the tokenizer and the engine answers it (batching
the calls of many episodes into one generation); the request's own thread waits for that.
Only the standard library is used: the payloads are small and the server only lives on
localhost for the length of a rollout.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "policy"  # the one model the endpoint lists; a request may name any
_ROUTE = re.compile(r"^/episodes/([0-9a-f]+)/v1/(chat/completions|models)$")


class BadRequest(ValueError):
    """A request the endpoint refuses; ``status`` is its HTTP code."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(eq=False)  # compared (and hashed) by identity: the endpoint keeps a set of waiting calls
class ChatCall:
    """One chat completion request, parsed; ``answer`` hands back the reply."""

    key: str
    messages: list[dict]
    tools: list | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    arrived: float = field(default_factory=time.monotonic)
    _done: threading.Event = field(default_factory=threading.Event, repr=False)
    _reply: tuple[int, dict] = (503, {})

    def answer(self, status: int, body: dict) -> None:
        self._reply = (status, body)
        self._done.set()

    def fail(self, error: BadRequest) -> None:
        self.answer(error.status, error_body(str(error), error.status))

    def wait(self) -> tuple[int, dict]:
        self._done.wait()
        return self._reply


def error_body(message: str, status: int) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": status}}


def models_body() -> dict:
    return {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "rlx"}]}


def completion_body(content: str, finish_reason: str, prompt_tokens: int, completion_tokens: int,
                    logprobs: list[dict] | None = None) -> dict:
    """A ``chat.completion`` object with one choice."""
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason,
              "logprobs": None if logprobs is None else {"content": logprobs}}
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": MODEL, "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or OpenAI's list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise BadRequest(f"{where}.content must be a string or a list of text parts")


def _number(body: dict, key: str, kind=float):
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise BadRequest(f"{key} must be a{'n integer' if kind is int else ' number'}, got {value!r}")
    return kind(value)


def parse_chat(key: str, body: Any) -> ChatCall:
    """The ``ChatCall`` of a chat completion request body, or ``BadRequest`` saying what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    parsed = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a role")
        parsed.append({k: v for k, v in m.items() if v is not None} | {"content": _text(m.get("content"),
                                                                                         f"messages[{i}]")})
    if body.get("stream"):
        raise BadRequest("stream is not supported: ask for the whole reply")
    if (_number(body, "n", int) or 1) != 1:
        raise BadRequest("n must be 1: an agent asks for one reply per call")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop must be a string or a list of non-empty strings")
    max_tokens = _number(body, "max_completion_tokens", int) or _number(body, "max_tokens", int)
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest("max_tokens must be at least 1")
    tools = body.get("tools")
    return ChatCall(key, parsed, tools if isinstance(tools, list) and tools else None, max_tokens,
                    _number(body, "temperature"), _number(body, "top_p"), tuple(stop), bool(body.get("logprobs")))


class _Server(ThreadingHTTPServer):
    # every episode's agent may connect at once: past the listen backlog (5 by default) the
    # kernel resets connections; the kernel caps this at net.core.somaxconn
    request_queue_size = 4096


class ChatEndpoint:
    """The HTTP server, in a thread of its own, until ``close``. ``open(key)`` makes an
    episode's base URL; its chat calls arrive on ``calls`` (a ``queue.Queue``)."""

    def __init__(self, host: str = "127.0.0.1"):
        self.calls: queue.Queue = queue.Queue()
        self._keys: set[str] = set()
        self._waiting: set[ChatCall] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._server = _Server((host, 0), self._handler())
        self._server.block_on_close = False  # a client that keeps its connection must not hold up close
        self.url = f"http://{host}:{self._server.server_address[1]}"
        # a short poll: closing waits for it, once per rollout
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="rlx-chat-endpoint", daemon=True)
        self._thread.start()

    def open(self, key: str) -> str:
        with self._lock:
            self._keys.add(key)
        return f"{self.url}/episodes/{key}/v1"

    def close(self) -> None:
        """Stop serving; calls still waiting are answered 503."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting), set()
        for call in waiting:
            call.fail(BadRequest("the rollout this episode belonged to has ended", 503))
        self._server.shutdown()
        self._server.server_close()

    def _route(self, path: str, method: str, body: bytes) -> tuple[int, dict]:
        if path.rstrip("/") == "/v1/models" and method == "GET":
            return 200, models_body()
        match = _ROUTE.match(path)
        if match is None or match.group(1) not in self._keys:
            return 404, error_body(f"no such route: {method} {path} (an episode's base URL ends in /v1)", 404)
        key, what = match.groups()
        if what == "models":
            return (200, models_body()) if method == "GET" else (405, error_body("GET models", 405))
        if method != "POST":
            return 405, error_body("POST chat/completions", 405)
        try:
            call = parse_chat(key, json.loads(body or b"null"))
        except json.JSONDecodeError as e:
            return 400, error_body(f"the request body is not JSON: {e}", 400)
        except BadRequest as e:
            self.calls.put(("refused", key, str(e)))  # the episode's owner hears of it: it stops the run
            return e.status, error_body(str(e), e.status)
        with self._lock:
            if self._closed:
                return 503, error_body("the rollout this episode belonged to has ended", 503)
            self._waiting.add(call)
        self.calls.put(call)
        status, reply = call.wait()
        with self._lock:
            self._waiting.discard(call)
        return status, reply

    def _handler(self):
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, reply = endpoint._route(self.path.split("?", 1)[0], method, self.rfile.read(length))
                data = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the agent gave up on the call (a timeout): nobody to answer
                    pass

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def log_message(self, *args):  # one line per call on stderr would drown the run's output
                pass

        return Handler
