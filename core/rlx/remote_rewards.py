"""Rewards over HTTP: ``rlx serve-reward`` on one side, a ``reward.functions`` URL on the other.

Wire format (JSON, UTF-8), one POST per batch of samples to the server's URL:

    request   {"prompts": [str], "completions": [str], "labels": [any],
               "columns": {"name": [any], ...}}           one entry per sample each
    response  {"rewards": [number], "scores": [number],   "scores" optional
               "KEY": number or [number], ...}             other keys: metrics
    error     HTTP 4xx/5xx with {"error": "what went wrong"}

The response is exactly what a local reward function returns as a dict (see
docs/rewards.md), so a function scores the same wherever it runs. A GET on the URL
answers ``{"name": ...}``: the name the rewards are logged under.

Both sides use only the standard library (http.server, urllib): the payloads are small
JSON documents, so an extra HTTP stack would add dependencies and nothing measurable.
The client runs requests in threads (they wait on the network, not on the GIL).
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rlx.config import RemoteRewardConfig, RewardConfig
from rlx.errors import RewardError

_SHOWN_CHARS = 200  # how much of a bad answer an error message quotes
_RETRIED_STATUS = {408, 429}  # client errors that a later attempt may not get (5xx are retried too)


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


# ---------------------------------------------------------------------------
# client: a reward source whose function posts to a server


class _Failure(Exception):
    """One failed request; ``retry`` says whether another attempt could succeed."""

    def __init__(self, message: str, retry: bool):
        super().__init__(message)
        self.retry = retry


def remote_source(url: str, options: RemoteRewardConfig):
    """A ``RewardSource`` that scores on the server at ``url``.

    The server is asked for its name now, so that a wrong URL or a server that is down
    fails before any rollout (after ``options.retries`` retries).
    """
    from rlx.rewards import RewardSource

    client = RemoteReward(url, options)
    return RewardSource(client.ask_name(), f"reward server {url}", client)


class RemoteReward:
    """Called like a reward function; sends the batch in requests of ``batch_size`` samples,
    at most ``concurrency`` at once, each retried with exponential backoff."""

    def __init__(self, url: str, options: RemoteRewardConfig):
        for key in ("batch_size", "concurrency", "timeout", "retries", "backoff"):
            value = getattr(options, key)
            if value < 0 or (value == 0 and key in ("concurrency", "timeout")):
                raise RewardError(f"reward.remote.{key} is {value}; it must be "
                                  f"{'positive' if key in ('concurrency', 'timeout') else '0 or more'}")
        try:
            host = urllib.parse.urlsplit(url).hostname
        except ValueError as e:
            raise RewardError(f"reward.functions: {url!r} is not a reward server's URL: {e}") from None
        if not host:
            raise RewardError(f"reward.functions: {url!r} is not a reward server's URL: it names no host")
        self.url, self.options = url, options

    def ask_name(self) -> str:
        info, _ = self._with_retries(lambda: self._request(None))
        name = info.get("name") if isinstance(info, dict) else None
        return name if isinstance(name, str) and name else self.url.split("://", 1)[1]

    def __call__(self, prompts, completions, labels, **columns) -> dict:
        n = len(completions)
        size = self.options.batch_size or n
        chunks = [slice(i, min(i + size, n)) for i in range(0, n, size)]
        bodies = [_encode(self.url, {"prompts": prompts[s], "completions": completions[s], "labels": labels[s],
                                     "columns": {k: v[s] for k, v in columns.items()}}) for s in chunks]
        pool = ThreadPoolExecutor(max_workers=min(self.options.concurrency, len(chunks)))
        try:
            futures = [pool.submit(self._with_retries, self._scorer(body, s)) for body, s in zip(bodies, chunks)]
            answers = [future.result() for future in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # after a failure, send nothing more
        if len({"scores" in a for a, _ in answers}) > 1:
            raise RewardError(f"reward server {self.url} answered 'scores' for some requests of a batch, not all")
        result = _combine([a for a, _ in answers], [s.stop - s.start for s in chunks])
        if self.options.retries:
            result["failed_requests"] = sum(failures for _, failures in answers)
        return result

    def _scorer(self, body: bytes, s: slice):
        def score():
            return _check(self._request(body), s.stop - s.start, f"samples {s.start}-{s.stop - 1}")
        return score

    def _with_retries(self, attempt) -> tuple[Any, int]:
        """``attempt()``'s result and the number of failed attempts before it."""
        retries, failures = self.options.retries, 0
        while True:
            try:
                return attempt(), failures
            except _Failure as e:
                if not e.retry or failures == retries:
                    tried = f" after {failures + 1} attempts (reward.remote.retries={retries})" if failures else ""
                    raise RewardError(f"reward server {self.url}{tried}: {e}") from None
            time.sleep(self.options.backoff * 2 ** failures)
            failures += 1

    def _request(self, body: bytes | None) -> Any:
        """The decoded JSON answer to one GET (no body) or POST."""
        request = urllib.request.Request(self.url, data=body, method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.options.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            if body is None:  # a server that does not answer GET: it is up, its name is its URL
                return None
            detail = _error_text(e.read())
            raise _Failure(f"answered HTTP {e.code} {e.reason}: {detail}",
                           retry=e.code >= 500 or e.code in _RETRIED_STATUS) from None
        except (TimeoutError, socket.timeout):
            raise _Failure(f"no answer within {self.options.timeout} s (reward.remote.timeout)", retry=True) from None
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise _Failure(f"no answer within {self.options.timeout} s (reward.remote.timeout)",
                               retry=True) from None
            raise _Failure(f"cannot connect: {reason} (is `rlx serve-reward` running there?)", retry=True) from None
        except (OSError, http.client.HTTPException) as e:  # reset, closed or not HTTP
            raise _Failure(f"connection failed: {type(e).__name__}: {e}", retry=True) from None
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            if body is None:
                return None
            raise _Failure(f"answered something that is not JSON: {_quote(raw)}", retry=True) from None


def _encode(url: str, payload: dict) -> bytes:
    try:
        return json.dumps(payload, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        for key, values in [("labels", payload["labels"]), *payload["columns"].items()]:
            try:
                json.dumps(values, allow_nan=False)
            except (TypeError, ValueError):
                raise RewardError(f"reward server {url}: column {key!r} cannot be sent as JSON: {e}") from None
        raise RewardError(f"reward server {url}: the batch cannot be sent as JSON: {e}") from None


def _check(answer: Any, n: int, which: str) -> dict:
    """``answer`` if it is a well-formed response for ``n`` samples, else a retriable failure."""
    if not isinstance(answer, dict) or "rewards" not in answer:
        raise _Failure(f"answered {_quote(answer)} for {which}: expected an object with 'rewards'", retry=True)
    for key, values in answer.items():
        per_sample = key in ("rewards", "scores") or isinstance(values, list)
        if per_sample and (not isinstance(values, list) or len(values) != n):
            count = f"{len(values)} {key}" if isinstance(values, list) else f"{key} {_quote(values)}"
            raise _Failure(f"answered {count} for {n} samples ({which})", retry=True)
        for i, value in enumerate(values if per_sample else [values]):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                where = f"{key}[{i}]" if per_sample else key
                raise _Failure(f"answered {where} = {_quote(value)} ({which}): not a finite number", retry=True)
    return answer


def _combine(answers: list[dict], sizes: list[int]) -> dict:
    """One response for the whole batch: per-sample lists joined, batch numbers averaged by size."""
    out: dict[str, Any] = {"rewards": [r for a in answers for r in a["rewards"]]}
    if "scores" in answers[0]:
        out["scores"] = [s for a in answers for s in a["scores"]]
    for key in {k for a in answers for k in a} - {"rewards", "scores"}:
        parts = [(_mean(a[key]), size) for a, size in zip(answers, sizes) if key in a]
        out[key] = sum(v * size for v, size in parts) / sum(size for _, size in parts)
    return out


def _mean(value) -> float:
    return sum(value) / len(value) if isinstance(value, list) else value


def _error_text(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"])
    except (ValueError, TypeError, KeyError):
        return _quote(raw)


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


# ---------------------------------------------------------------------------
# server: one reward source behind ThreadingHTTPServer


class _BadRequest(Exception):
    pass


def reward_server(spec: str, host, *, address: tuple[str, int] = ("127.0.0.1", 0), model_type: str = "model",
                  threads: int = 1, device=None) -> ThreadingHTTPServer:
    """A server (not yet serving) that scores with ``spec``: whatever ``--reward`` takes, or a
    reward-model folder. ``threads`` requests are scored at once; more wait their turn
    (reward functions and models need not be thread-safe at the default of 1)."""
    from rlx.rewards import build_reward, run_source

    if Path(spec).is_dir():
        cfg = RewardConfig(functions=[], model=spec, model_type=model_type)
    else:
        cfg = RewardConfig(functions=[spec])
    source = build_reward(cfg, host, device=device).sources[0]
    turns = threading.BoundedSemaphore(threads)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self._answer(200, {"name": source.name, "reward": source.what})

        def do_POST(self):
            try:
                prompts, completions, labels, columns = _read_request(self)
            except _BadRequest as e:
                return self._answer(400, {"error": str(e)})
            try:
                with turns:
                    rewards, scores, metrics = run_source(source, prompts, completions, labels, columns)
            except RewardError as e:
                print(f"rlx serve-reward: {e}", file=sys.stderr, flush=True)
                return self._answer(422, {"error": str(e)})
            answer = {"rewards": rewards, **({"scores": scores} if scores is not None else {}), **metrics}
            self._answer(200, answer)

        def _answer(self, status: int, body: dict):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout); nothing to do
                pass

        def log_message(self, format, *args):  # one line per request would drown the errors
            pass

    server = ThreadingHTTPServer(address, Handler)
    server.daemon_threads = True
    server.source = source
    return server


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/score"


def _read_request(handler: BaseHTTPRequestHandler):
    try:
        length = int(handler.headers.get("Content-Length", ""))
        request = json.loads(handler.rfile.read(length))
    except ValueError as e:
        raise _BadRequest(f"the request body is not JSON with a Content-Length: {e}") from None
    if not isinstance(request, dict):
        raise _BadRequest("the request must be a JSON object with prompts, completions, labels and columns")
    completions = request.get("completions")
    if not isinstance(completions, list) or not all(isinstance(c, str) for c in completions):
        raise _BadRequest("'completions' must be a list of strings")
    n = len(completions)
    prompts = request.get("prompts", [""] * n)
    labels = request.get("labels", [None] * n)
    columns = request.get("columns", {})
    if not isinstance(columns, dict):
        raise _BadRequest("'columns' must be an object of lists")
    for key, values in [("prompts", prompts), ("labels", labels), *((f"columns.{k}", v) for k, v in columns.items())]:
        if not isinstance(values, list) or len(values) != n:
            raise _BadRequest(f"'{key}' must be a list of {n} entries, one per completion")
    return prompts, completions, labels, columns
