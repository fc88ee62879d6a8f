# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small client for the OpenAI-compatible API both engines serve: plain JSON calls and
streamed chat completions timed chunk by chunk. Standard library only, so the same code runs in
a module on an endpoint host and in the controller's CLI."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import DRIVERS


class ApiError(Exception):
    """The endpoint answered with an error (status > 0) or did not answer (status 0)."""

    def __init__(self, message: str, status: int = 0, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body or {}


@dataclass(frozen=True)
class Endpoint:
    """Where an OpenAI-compatible server listens: base URL (http://host:port, optionally with a
    path prefix such as /v1's parent) and an optional API key, sent only to that URL."""

    url: str
    api_key: str | None = None

    def _parts(self) -> tuple[str, str, int, str]:
        parts = urlsplit(self.url if "://" in self.url else f"http://{self.url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ApiError(f"url: {self.url!r} is not an http(s) URL (write http://HOST:PORT)")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return parts.scheme, parts.hostname, port, parts.path.rstrip("/")

    def connection(self, timeout: float) -> tuple[http.client.HTTPConnection, str]:
        scheme, host, port, prefix = self._parts()
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        return cls(host, port, timeout=timeout), prefix

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def _error_from(status: int, raw: bytes) -> ApiError:
    text = raw[:2000].decode("utf-8", "replace")
    try:
        body = json.loads(raw)
    except ValueError:
        return ApiError(f"HTTP {status}: {text[:300]}", status)
    error = body.get("error", body) if isinstance(body, dict) else {}
    message = error.get("message") if isinstance(error, dict) else None
    return ApiError(f"HTTP {status}: {message or text[:300]}", status, error if isinstance(error, dict) else {})


def request_json(endpoint: Endpoint, method: str, path: str, payload: dict[str, Any] | None = None, timeout: float = 120.0) -> dict[str, Any]:
    """One JSON call; raises ApiError on transport failure or a non-200 answer."""
    conn, prefix = endpoint.connection(timeout)
    try:
        conn.request(method, prefix + path, body=None if payload is None else json.dumps(payload), headers=endpoint.headers())
        response = conn.getresponse()
        raw = response.read(16 << 20)
    except (OSError, http.client.HTTPException) as exc:
        raise ApiError(f"no answer from {endpoint.url}{path}: {exc}") from None
    finally:
        conn.close()
    if response.status != 200:
        raise _error_from(response.status, raw)
    try:
        answer = json.loads(raw)
    except ValueError:
        raise ApiError(f"{path}: the answer is not JSON", response.status) from None
    if not isinstance(answer, dict):
        raise ApiError(f"{path}: the answer is not a JSON object", response.status)
    return answer


@dataclass
class StreamResult:
    """One streamed chat completion. Times are seconds since the request was sent."""

    first_token_s: float | None = None
    end_s: float = 0.0
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from the stream's own usage chunk, never estimated
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    engine_decode_tps: float | None = None  # the engine's own figure where it sends one (llama.cpp timings)
    chunk_times: list[float] = field(default_factory=list)

    @property
    def decode_s(self) -> float | None:
        if self.first_token_s is None or not self.chunk_times:
            return None
        return self.chunk_times[-1] - self.first_token_s

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first over the time after the first: TTFT is not in it."""
        span = self.decode_s
        if not self.completion_tokens or self.completion_tokens < 2 or not span or span <= 0:
            return None
        return (self.completion_tokens - 1) / span

    @property
    def empty(self) -> bool:
        return not (self.content.strip() or self.reasoning.strip()) or not self.completion_tokens


def reasoning_fields() -> tuple[str, ...]:
    """The message fields reasoning may arrive in: each runtime driver's `reasoning_field`
    (llama.cpp and radiance: reasoning_content), then `reasoning` (vLLM 0.30 renames the channel)."""
    return tuple(dict.fromkeys([*(runtime.reasoning_field for runtime in DRIVERS.values()), "reasoning"]))


def reasoning_text(message: dict[str, Any], fields: tuple[str, ...] | None = None) -> str:
    """The reasoning a message (or a stream delta) carries, in the first field that holds any."""
    return str(next((message.get(name) for name in (fields or reasoning_fields()) if message.get(name)), "") or "")


def _delta_text(delta: dict[str, Any]) -> tuple[str, str]:
    return str(delta.get("content") or ""), reasoning_text(delta)


def stream_chat(
    endpoint: Endpoint,
    payload: dict[str, Any],
    timeout: float = 600.0,
    clock: Callable[[], float] = time.monotonic,
) -> StreamResult:
    """POST a chat completion with stream=true and usage included; time every chunk."""
    body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    conn, prefix = endpoint.connection(timeout)
    result = StreamResult()
    started = clock()
    try:
        conn.request("POST", prefix + "/v1/chat/completions", body=json.dumps(body), headers=endpoint.headers())
        response = conn.getresponse()
        if response.status != 200:
            raise _error_from(response.status, response.read(1 << 20))
        for raw_line in response:
            line = raw_line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            now = clock() - started
            try:
                chunk = json.loads(data)
            except ValueError:
                raise ApiError(f"the stream sent a chunk that is not JSON: {data[:200]!r}") from None
            if "error" in chunk:
                raise _error_from(500, data)
            _take_chunk(chunk, now, result)
    except (OSError, http.client.HTTPException) as exc:
        raise ApiError(f"the stream from {endpoint.url} broke: {exc}") from None
    finally:
        conn.close()
    result.end_s = clock() - started
    return result


def _take_chunk(chunk: dict[str, Any], now: float, result: StreamResult) -> None:
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        result.prompt_tokens = usage.get("prompt_tokens")
        result.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        result.cached_tokens = details.get("cached_tokens") if isinstance(details, dict) else None
    timings = chunk.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("predicted_per_second"), (int, float)):
        result.engine_decode_tps = float(timings["predicted_per_second"])
    for choice in chunk.get("choices") or []:
        content, reasoning = _delta_text(choice.get("delta") or {})
        if content or reasoning:
            if result.first_token_s is None:
                result.first_token_s = now
            result.chunk_times.append(now)
            result.content += content
            result.reasoning += reasoning
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]


T = TypeVar("T")


def run_concurrently(calls: list[Callable[[], T]]) -> list[T]:
    """Start every call at once (one thread each: the work is waiting on sockets) and return
    their results in call order."""
    results: list[Any] = [None] * len(calls)

    def worker(index: int) -> None:
        results[index] = calls[index]()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
