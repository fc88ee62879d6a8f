# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The capacity probe: what an endpoint really holds, measured from its own answers.

- refusal boundary: an oversized prompt is refused before prefill, and the refusal names the
  window (llama.cpp: `n_ctx`, the per-slot window; vLLM: `maximum context length is N tokens`);
- parallel serving: N streams at once must decode at the same time, not queue, as the engine
  itself reports it (its busy slots on /slots, else its in-flight gauge on /metrics), sampled
  while the streams run; the client's wall clock only describes the streams (a busy client
  machine delays its own reads, not the engine's slots);
- decode at depth: decode speed with the context already holding D tokens.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import (
    ApiError,
    Endpoint,
    StreamResult,
    request_json,
    run_concurrently,
    stream_chat,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import DRIVERS

# Filler whose tokenisation is ordinary prose; the salt keeps each probe off any prefix cache.
FILLER = "The operator measured the endpoint again and wrote the figures into the ledger. "


class ProbeError(Exception):
    """The probe could not measure what it set out to (the message says why)."""


ProgressFn = Callable[[str], None]


@dataclass
class Boundary:
    window: int  # tokens one request may hold, as the engine itself stated it
    prompt_tokens: int | None
    message: str
    prompt_chars: int

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class ParallelCheck:
    requested: int
    max_decoding_at_once: int  # the most requests the engine reported busy at one sample
    streams: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""  # where the busy count came from: "/slots" or "/metrics NAME"
    samples: int = 0

    @property
    def parallel(self) -> bool:
        return self.max_decoding_at_once >= self.requested

    def as_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "max_decoding_at_once": self.max_decoding_at_once,
            "parallel": self.parallel,
            "source": self.source,
            "samples": self.samples,
            "streams": self.streams,
        }


def _salted(chars: int) -> str:
    salt = f"[{uuid.uuid4().hex}] "
    return salt + (FILLER * (chars // len(FILLER) + 1))[: max(chars - len(salt), 0)]


def _count(text: str) -> int:
    return int(text.replace(",", ""))


def _other_prompts(contracts: list[Any]) -> tuple[Any, ...]:
    return tuple(pattern for contract in contracts for pattern in contract.prompt)


def window_from_refusal(error: ApiError) -> tuple[int, int | None] | None:
    """(window, prompt tokens) from an engine's context refusal, or None if it is another error."""
    body = error.body
    if isinstance(body.get("n_ctx"), int):
        prompt = body.get("n_prompt_tokens")
        return int(body["n_ctx"]), int(prompt) if isinstance(prompt, int) else None
    text = str(error)
    # Each runtime states its refusal its own way (runtimes/<name>.py `refusal`); the probe may
    # not know which engine answers, so every runtime's wording is tried.
    contracts = [runtime.refusal for runtime in DRIVERS.values()]
    for contract in contracts:
        for pattern in contract.window:
            match = pattern.search(text)
            if not match:
                continue
            window = _count(match.group(1))
            # The prompt's tokens as this engine states them, else from the overage it names.
            prompt = next((_count(m.group(1)) for m in (p.search(text) for p in contract.prompt + _other_prompts(contracts)) if m), None)
            if prompt is None:
                overage = next((_count(m.group(1)) for m in (p.search(text) for p in contract.overage) if m), None)
                prompt = window + overage if overage is not None else None
            return window, prompt
    return None


def find_refusal_boundary(
    endpoint: Endpoint, model: str, start_chars: int = 1 << 20, max_chars: int = 1 << 26, timeout: float = 600.0, progress: ProgressFn | None = None
) -> Boundary:
    """Send an oversized prompt (doubling until refused) and read the window from the refusal."""
    chars = start_chars
    while chars <= max_chars:
        if progress:
            progress(f"refusal boundary: sending a {chars:,}-character prompt")
        payload = {"model": model, "messages": [{"role": "user", "content": _salted(chars)}], "max_tokens": 1, "temperature": 0}
        try:
            request_json(endpoint, "POST", "/v1/chat/completions", payload, timeout)
        except ApiError as exc:
            if exc.status == 0:
                raise ProbeError(f"refusal boundary: {exc}") from None
            found = window_from_refusal(exc)
            if found is None:
                raise ProbeError(f"refusal boundary: the endpoint refused with an error that names no window: {exc}") from None
            return Boundary(found[0], found[1], str(exc), chars)
        chars *= 2
    raise ProbeError(f"refusal boundary: a {max_chars:,}-character prompt was accepted; raise max_chars")


def decoding_together(intervals: list[tuple[float, float]]) -> int:
    """How many streams got their first token while the earliest stream was still in the first
    half of its decode, by the client's clock. Descriptive only: check_parallel judges by the
    engine's own busy count, since a loaded client machine reads its streams late."""
    first_start, first_end = min(intervals)
    halfway = first_start + (first_end - first_start) / 2
    return sum(1 for start, _end in intervals if start <= halfway)


# The engines' in-flight gauge (runtimes/<name>.py `in_flight_gauges`, the first of each: running).
RUNNING_GAUGES = tuple(runtime.in_flight_gauges[0] for runtime in DRIVERS.values() if runtime.in_flight_gauges)
SAMPLE_INTERVAL_S = 0.02


def _get(endpoint: Endpoint, path: str, timeout: float) -> tuple[int, bytes]:
    conn, prefix = endpoint.connection(timeout)
    try:
        conn.request("GET", prefix + path, headers=endpoint.headers())
        response = conn.getresponse()
        return response.status, response.read(4 << 20)
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        conn.close()


def busy_from_slots(raw: bytes) -> int | None:
    """Busy slots in llama.cpp's /slots answer (a list of slots with `is_processing`), or None."""
    try:
        slots = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(slots, list) or not all(isinstance(slot, dict) and "is_processing" in slot for slot in slots):
        return None
    return sum(1 for slot in slots if slot["is_processing"])


def busy_from_metrics(text: str) -> tuple[str, int] | None:
    """(gauge, requests running) from a Prometheus exposition, summed over its series, or None."""
    for gauge in RUNNING_GAUGES:
        values = re.findall(rf"^{re.escape(gauge)}(?:{{[^}}]*}})?\s+([0-9.eE+-]+)\s*$", text, re.MULTILINE)
        if values:
            return gauge, int(sum(float(value) for value in values))
    return None


def engine_busy(endpoint: Endpoint, timeout: float = 10.0) -> tuple[str, int] | None:
    """(source, requests the engine is serving now), from /slots, else /metrics; None when the
    engine reports neither."""
    status, raw = _get(endpoint, "/slots", timeout)
    if status == 200:
        busy = busy_from_slots(raw)
        if busy is not None:
            return "/slots", busy
    status, raw = _get(endpoint, "/metrics", timeout)
    if status == 200:
        found = busy_from_metrics(raw.decode("utf-8", "replace"))
        if found is not None:
            return f"/metrics {found[0]}", found[1]
    return None


class BusySampler:
    """Samples the engine's busy count in a thread while the streams run; keeps the maximum."""

    def __init__(self, endpoint: Endpoint, interval: float = SAMPLE_INTERVAL_S) -> None:
        self.endpoint = endpoint
        self.interval = interval
        self.max_busy = 0
        self.samples = 0
        self.source = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            found = engine_busy(self.endpoint)
            if found is not None:
                self.source, busy = found
                self.samples += 1
                self.max_busy = max(self.max_busy, busy)
            self._stop.wait(self.interval)

    def __enter__(self) -> BusySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def check_parallel(endpoint: Endpoint, model: str, streams: int, max_tokens: int = 512, timeout: float = 600.0) -> ParallelCheck:
    """Start `streams` requests at once and count how many the engine serves together: the most
    busy slots (or running requests) it reported at any one sample while they ran."""
    if streams < 1:
        raise ProbeError("streams: at least 1")
    if engine_busy(endpoint) is None:
        raise ProbeError(
            "parallel check: the engine reports no busy count (neither /slots with is_processing nor "
            f"one of {', '.join(RUNNING_GAUGES)} on /metrics): enable llama-server's --slots or --metrics"
        )

    def one_stream() -> StreamResult | ApiError:
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex}] Count slowly from one to one thousand."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,  # both engines accept it: every stream decodes max_tokens
        }
        try:
            return stream_chat(endpoint, payload, timeout)
        except ApiError as exc:
            return exc

    with BusySampler(endpoint) as sampler:
        results = run_concurrently([one_stream] * streams)
    failures = [r for r in results if isinstance(r, ApiError)]
    if failures:
        raise ProbeError(f"parallel check: {len(failures)} of {streams} streams failed: {failures[0]}")
    if not sampler.samples:
        raise ProbeError("parallel check: the engine answered no busy-count sample while the streams ran")
    details = []
    for index, result in enumerate(results):
        if result.first_token_s is None or not result.chunk_times:
            raise ProbeError(f"parallel check: stream {index} produced no tokens")
        details.append(
            {
                "stream": index,
                "first_token_s": round(result.first_token_s, 4),
                "last_token_s": round(result.chunk_times[-1], 4),
                "completion_tokens": result.completion_tokens,
                "decode_tps": round(result.decode_tps, 2) if result.decode_tps else None,
            }
        )
    return ParallelCheck(streams, min(sampler.max_busy, streams), details, sampler.source, sampler.samples)


def tokens_per_char(endpoint: Endpoint, model: str, timeout: float = 120.0) -> float:
    """The engine's own count for a known filler length (usage.prompt_tokens), minus the
    template's overhead measured with an empty-ish prompt."""
    counts = []
    for chars in (64, 512):
        payload = {"model": model, "messages": [{"role": "user", "content": _salted(chars)}], "max_tokens": 1, "temperature": 0}
        answer = request_json(endpoint, "POST", "/v1/chat/completions", payload, timeout)
        counts.append(int((answer.get("usage") or {}).get("prompt_tokens") or 0))
    if counts[1] <= counts[0]:
        raise ProbeError("decode at depth: the endpoint reports no prompt_tokens in usage")
    return (counts[1] - counts[0]) / (512 - 64)


def decode_at_depths(
    endpoint: Endpoint,
    model: str,
    depths: list[int],
    max_tokens: int = 64,
    window: int | None = None,
    timeout: float = 600.0,
    progress: ProgressFn | None = None,
) -> list[dict[str, Any]]:
    """Decode speed with the context already holding each depth (in tokens, approximately: the
    reported prompt_tokens is the engine's exact count)."""
    rate = tokens_per_char(endpoint, model, timeout)
    rows = []
    for depth in depths:
        if window is not None and depth + max_tokens > window:
            rows.append({"depth": depth, "skipped": f"depth + max_tokens exceeds the window ({window:,})"})
            continue
        if progress:
            progress(f"decode at depth {depth:,}")
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": _salted(max(int(depth / rate), 16))}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        try:
            result = stream_chat(endpoint, payload, timeout)
        except ApiError as exc:
            rows.append({"depth": depth, "error": str(exc)})
            continue
        rows.append(
            {
                "depth": depth,
                "prompt_tokens": result.prompt_tokens,
                "ttft_s": round(result.first_token_s, 4) if result.first_token_s is not None else None,
                "decode_tps": round(result.decode_tps, 2) if result.decode_tps else None,
                "completion_tokens": result.completion_tokens,
            }
        )
    return rows


def run_capacity_probe(
    endpoint: Endpoint,
    model: str,
    parallel: int = 0,
    depths: list[int] | None = None,
    max_tokens: int = 64,
    start_chars: int = 1 << 20,
    timeout: float = 600.0,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    boundary = find_refusal_boundary(endpoint, model, start_chars, timeout=timeout, progress=progress)
    report: dict[str, Any] = {"url": endpoint.url, "model": model, "boundary": boundary.as_dict()}
    if parallel:
        if progress:
            progress(f"parallel check: {parallel} streams at once")
        report["parallel"] = check_parallel(endpoint, model, parallel, max(max_tokens, 512), timeout).as_dict()
    if depths:
        report["depths"] = decode_at_depths(endpoint, model, depths, max_tokens, boundary.window, timeout, progress)
    return report
