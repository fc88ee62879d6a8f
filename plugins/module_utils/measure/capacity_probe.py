# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The capacity probe: what an endpoint really holds, measured from its own answers.

- refusal boundary: an oversized prompt is refused before prefill, and the refusal names the
  window (llama.cpp: `n_ctx`, the per-slot window; vLLM: `maximum context length is N tokens`);
- parallel serving: N streams must decode at the same time, not queue, as the engine itself
  reports it (its busy slots on /slots, else its in-flight gauges on /metrics). The streams start
  one after another, each once the engine reports the ones before it busy, and the engine is
  sampled until it reports all started streams busy at once (served together), or a started one
  waiting while every slot is busy (queued). A stream that ends before the next is served says
  only that the streams were too short for this machine: the attempt is retried with longer ones.
  Nothing is judged by the client's clock (a busy client machine delays its own reads and starts,
  never the engine's slots);
- decode at depth: decode speed with the context already holding D tokens.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import (
    ApiError,
    Endpoint,
    StreamResult,
    request_json,
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
    verdict: str = ""  # what the engine reported that decided it
    attempts: list[dict[str, Any]] = field(default_factory=list)  # each try: max_tokens, outcome

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
            "verdict": self.verdict,
            "attempts": self.attempts,
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


# The engines' in-flight gauges (runtimes/<name>.py `in_flight_gauges`: running, then waiting).
RUNNING_GAUGES = tuple(runtime.in_flight_gauges[0] for runtime in DRIVERS.values() if runtime.in_flight_gauges)
WAITING_GAUGES = tuple(runtime.in_flight_gauges[1] for runtime in DRIVERS.values() if len(runtime.in_flight_gauges) > 1)
SAMPLE_INTERVAL_S = 0.02
# A request the engine holds waiting while a slot is free is only between two scheduler steps; held
# this many samples in a row with every slot busy or (no slot count) this long, it is queued.
QUEUED_SAMPLES = 5
QUEUED_HOLD_S = 2.0
# Each retry's streams are this many times longer than the last try's.
RETRY_GROWTH = 4


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


def _slots(raw: bytes) -> list[dict[str, Any]] | None:
    try:
        slots = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(slots, list) or not all(isinstance(slot, dict) and "is_processing" in slot for slot in slots):
        return None
    return slots


def busy_from_slots(raw: bytes) -> int | None:
    """Busy slots in llama.cpp's /slots answer (a list of slots with `is_processing`), or None."""
    slots = _slots(raw)
    return None if slots is None else sum(1 for slot in slots if slot["is_processing"])


def _gauge(text: str, gauges: tuple[str, ...]) -> tuple[str, int] | None:
    for gauge in gauges:
        values = re.findall(rf"^{re.escape(gauge)}(?:{{[^}}]*}})?\s+([0-9.eE+-]+)\s*$", text, re.MULTILINE)
        if values:
            return gauge, int(sum(float(value) for value in values))
    return None


def busy_from_metrics(text: str) -> tuple[str, int] | None:
    """(gauge, requests running) from a Prometheus exposition, summed over its series, or None."""
    return _gauge(text, RUNNING_GAUGES)


def waiting_from_metrics(text: str) -> int | None:
    """Requests the engine holds waiting (llama.cpp's deferred, vLLM's waiting), or None."""
    found = _gauge(text, WAITING_GAUGES)
    return None if found is None else found[1]


@dataclass(frozen=True)
class EngineLoad:
    source: str  # "/slots" or "/metrics GAUGE"
    busy: int  # requests the engine serves now
    slots: int | None = None  # how many it can serve at once, where it says (/slots)
    waiting: int | None = None  # requests it holds back, where it says (/metrics)
    slot_ctx: int | None = None  # one slot's window (/slots n_ctx), for longer retries


def engine_load(endpoint: Endpoint, timeout: float = 10.0) -> EngineLoad | None:
    """What the engine reports it is doing now: busy slots from /slots (with the slot count), else
    its running gauge from /metrics; the waiting gauge from /metrics where it has one."""
    status, raw = _get(endpoint, "/slots", timeout)
    slots = _slots(raw) if status == 200 else None
    m_status, m_raw = _get(endpoint, "/metrics", timeout)
    text = m_raw.decode("utf-8", "replace") if m_status == 200 else ""
    waiting = waiting_from_metrics(text) if text else None
    if slots is not None:
        ctx = slots[0].get("n_ctx") if slots else None
        busy = sum(1 for slot in slots if slot["is_processing"])
        return EngineLoad("/slots", busy, len(slots), waiting, ctx if isinstance(ctx, int) else None)
    found = busy_from_metrics(text) if text else None
    if found is not None:
        return EngineLoad(f"/metrics {found[0]}", found[1], None, waiting)
    return None


def engine_busy(endpoint: Endpoint, timeout: float = 10.0) -> tuple[str, int] | None:
    """(source, requests the engine is serving now), from /slots, else /metrics; None when the
    engine reports neither."""
    load = engine_load(endpoint, timeout)
    return None if load is None else (load.source, load.busy)


class BusySampler:
    """Samples the engine's busy count in a thread while requests run; keeps the maximum."""

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


class _Stream:
    """One streamed request in a thread of its own; `done` is set when it ended, whatever way."""

    def __init__(self, endpoint: Endpoint, model: str, max_tokens: int, timeout: float) -> None:
        self.result: StreamResult | ApiError | None = None
        self.done = threading.Event()
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex}] Count slowly from one to one thousand."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,  # both engines accept it: every stream decodes max_tokens
        }
        self._thread = threading.Thread(target=self._run, args=(endpoint, payload, timeout), daemon=True)
        self._thread.start()

    def _run(self, endpoint: Endpoint, payload: dict[str, Any], timeout: float) -> None:
        try:
            self.result = stream_chat(endpoint, payload, timeout)
        except ApiError as exc:
            self.result = exc
        finally:
            self.done.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


@dataclass
class _Round:
    outcome: str  # "together", "queued" or "ended_early"
    max_busy: int
    samples: int
    source: str
    detail: str
    streams: list[_Stream]
    slot_ctx: int | None


def _one_round(
    endpoint: Endpoint, model: str, streams: int, max_tokens: int, timeout: float, interval: float, hold_s: float, clock: Callable[[], float]
) -> _Round:
    """Start the streams one after another, each once the engine reports every one before it busy;
    stop at the first verdict the engine gives (all busy together, or one held back)."""
    started: list[_Stream] = []
    max_busy = samples = 0
    source, detail, outcome, slot_ctx = "", "", "together", None
    deadline = clock() + timeout
    for count in range(1, streams + 1):
        started.append(_Stream(endpoint, model, max_tokens, timeout))
        held_since: float | None = None
        held_samples = 0
        while True:
            load = engine_load(endpoint)
            if load is not None:
                samples += 1
                source, slot_ctx = load.source, load.slot_ctx or slot_ctx
                max_busy = max(max_busy, load.busy)
                if load.busy >= count:
                    break
                # Held back: every slot busy (it says how many it has), or requests waiting beside
                # fewer busy than started, for several samples (not just between two steps).
                full = load.slots is not None and load.busy >= load.slots
                if full or (load.waiting or 0) > 0:
                    held_samples += 1
                    held_since = held_since if held_since is not None else clock()
                    if (full and held_samples >= 2) or (held_samples >= QUEUED_SAMPLES and clock() - held_since >= hold_s):
                        outcome = "queued"
                        detail = f"stream {count} was held back while the engine served {load.busy}" + (
                            f" of its {load.slots} slots" if load.slots is not None else f" ({load.waiting} waiting)"
                        )
                        break
                else:
                    held_since, held_samples = None, 0
            ended = [index for index, stream in enumerate(started) if stream.done.is_set()]
            if ended:
                outcome = "ended_early"
                detail = f"stream {ended[0] + 1} ended before the engine reported {count} busy (at most {max_busy})"
                break
            if clock() > deadline:
                raise ProbeError(f"parallel check: the engine never reported stream {count} busy within {timeout:.0f} s")
            time.sleep(interval)
        if outcome != "together":
            break
    if outcome == "together":
        detail = f"the engine reported all {streams} streams busy at once"
    return _Round(outcome, max_busy, samples, source, detail, started, slot_ctx)


def check_parallel(
    endpoint: Endpoint,
    model: str,
    streams: int,
    max_tokens: int = 512,
    timeout: float = 600.0,
    attempts: int = 3,
    max_tokens_cap: int | None = None,
    interval: float = SAMPLE_INTERVAL_S,
    queued_hold_s: float = QUEUED_HOLD_S,
    clock: Callable[[], float] = time.monotonic,
) -> ParallelCheck:
    """How many of `streams` requests the engine serves together, by its own busy count: started
    one after another (_one_round). When a stream ended before the next one was served, the try
    says nothing about the engine; it is repeated with streams RETRY_GROWTH times longer (capped
    by `max_tokens_cap`, else the engine's slot window), at most `attempts` times."""
    if streams < 1:
        raise ProbeError("streams: at least 1")
    if engine_load(endpoint) is None:
        raise ProbeError(
            "parallel check: the engine reports no busy count (neither /slots with is_processing nor "
            f"one of {', '.join(RUNNING_GAUGES)} on /metrics): enable llama-server's --slots or --metrics"
        )
    tries: list[dict[str, Any]] = []
    tokens = max_tokens
    slot_ctx: int | None = None
    for attempt in range(max(attempts, 1)):
        if attempt:
            cap = max_tokens_cap or (slot_ctx - 256 if slot_ctx and slot_ctx > 512 else None)
            longer = tokens * RETRY_GROWTH if cap is None else min(tokens * RETRY_GROWTH, cap)
            if longer <= tokens:
                break
            tokens = longer
        found = _one_round(endpoint, model, streams, tokens, timeout, interval, queued_hold_s, clock)
        slot_ctx = found.slot_ctx or slot_ctx
        for stream in found.streams:
            stream.join(timeout)
        tries.append({"max_tokens": tokens, "outcome": found.outcome, "detail": found.detail, "max_busy": found.max_busy})
        failures = [s.result for s in found.streams if isinstance(s.result, ApiError)]
        if failures:
            raise ProbeError(f"parallel check: {len(failures)} of {len(found.streams)} streams failed: {failures[0]}")
        if found.outcome != "ended_early":
            return ParallelCheck(streams, min(found.max_busy, streams), _stream_details(found.streams), found.source, found.samples, found.detail, tries)
    raise ProbeError(
        f"parallel check: in {len(tries)} tries (up to {tokens:,} tokens a stream) a stream always ended before the next one was "
        f"served ({tries[-1]['detail']}): this machine is too slow for the probe's streams; give a longer --max-tokens"
    )


def _stream_details(started: list[_Stream]) -> list[dict[str, Any]]:
    details = []
    for index, stream in enumerate(started):
        result = stream.result
        if not isinstance(result, StreamResult) or result.first_token_s is None or not result.chunk_times:
            raise ProbeError(f"parallel check: stream {index} produced no tokens")
        details.append(
            {
                "stream": index,
                "first_token_s": round(result.first_token_s, 4),
                "last_token_s": round(result.chunk_times[-1], 4),
                "completion_tokens": result.completion_tokens,
                "decode_tps": round(result.decode_tps, 2) if result.decode_tps else None,
                "engine_decode_tps": round(result.engine_decode_tps, 2) if result.engine_decode_tps else None,
            }
        )
    return details


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
        cap = max(boundary.window - 256, 512)  # a retry's longer streams stay inside one request's window
        report["parallel"] = check_parallel(endpoint, model, parallel, max(max_tokens, 512), timeout, max_tokens_cap=cap).as_dict()
    if depths:
        report["depths"] = decode_at_depths(endpoint, model, depths, max_tokens, boundary.window, timeout, progress)
    return report
