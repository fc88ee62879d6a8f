# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The survivability probe at the full client contract, run on the endpoint's host.

Boot is not proof (seed 000: five 262144-token contexts "passed every boot gate ... but left 0
bytes free at runtime: a real client request (995-token prompt, max_tokens=261149, sampling params
straight from models.yml) killed Worker_TP1"). So a rung that boots is loaded the way its clients
will load it, through the OpenAI completions route both engines serve, with token ids as the
prompt so its length is exact:

- leg A, the window: every slot at once, each with a prompt of (ceiling - max_tokens) tokens and
  the client's own max_tokens (the models.yml fragment's maxTokens, from the shape's client
  contract) and sampling (its extraBody); ignore_eos, so each decode really reaches the window's
  limit (a real model would stop early and leave the full cache untested);
- leg B, the refusal: one prompt of ceiling + 1 tokens, which the engine must refuse;
- leg D, N-stream decode (seed 004: "the slot count is paid in decode concurrency"): every slot at
  once on a short prompt, the engine's own busy count sampled (/slots, else its running gauge),
  aggregate decode tokens per second from the engines' usage counts over the wall clock.

Free memory per device is sampled at boot and all through the legs (the least seen is kept).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.client_contract import client_window
from ansible_collections.frank.llm_fleet.plugins.module_utils.devices.gpu_facts import GpuFactsError, Runner, discover
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import BusySampler
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError, Endpoint, request_json, run_concurrently
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import Shape

FreeReader = Callable[[], dict[str, int]]
# Prompt token ids: low ids exist in every vocabulary; one id per slot keeps slots off each other's prefix.
FIRST_TOKEN_ID = 100
DECODE_PROMPT_TOKENS = 32
MEMORY_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Contract:
    """What the clients may send one request, as the shape's client contract says."""

    ceiling: int  # the engine's per-request limit
    slots: int
    max_tokens: int  # the fragment's maxTokens (clamped so the prompt keeps one token)
    prompt_tokens: int  # ceiling - max_tokens: prompt and completion fill the window exactly
    sampling: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ceiling": self.ceiling,
            "slots": self.slots,
            "max_tokens": self.max_tokens,
            "prompt_tokens": self.prompt_tokens,
            "sampling": dict(self.sampling),
        }


def contract(shape: Shape, max_tokens: int | None = None) -> Contract:
    """The full contract of a shape: the client window's maxTokens (or `max_tokens`, where the
    operator bounds the decode), the client's sampler, every slot."""
    ceiling = shape.request_ceiling
    window = client_window(ceiling, shape.client_gap, shape.client_max_tokens)
    wanted = window.max_tokens if max_tokens is None else max_tokens
    if wanted < 1:
        raise ValueError(f"max_tokens: at least 1, got {wanted}")
    decode = min(wanted, ceiling - 1)
    return Contract(ceiling, shape.slots, decode, ceiling - decode, dict(shape.client_sampler or {}))


def host_available(meminfo: str = "/proc/meminfo") -> dict[str, int]:
    """The host's MemAvailable, for an engine on the CPU (the lab) or on unified memory."""
    with open(meminfo, encoding="ascii") as lines:
        for line in lines:
            if line.startswith("MemAvailable:"):
                return {"host": int(line.split()[1]) * 1024}
    return {}


def free_reader(run: Runner) -> FreeReader:
    """Free bytes per GPU (gpu_facts' own readers: nvidia-smi, amdgpu sysfs, rocm-smi), or the
    host's MemAvailable where the host has no GPU tool."""
    try:
        discover(run)
    except GpuFactsError:
        return host_available

    def gpus() -> dict[str, int]:
        return {f"gpu{device.index}": device.free_bytes for device in discover(run) if device.free_bytes is not None}

    return gpus


class MemorySampler:
    """Free bytes per device, read every MEMORY_INTERVAL_S in a thread; keeps the least of each."""

    def __init__(self, read_free: FreeReader) -> None:
        self.read_free = read_free
        self.least: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _take(self) -> None:
        for name, free in self.read_free().items():
            self.least[name] = min(free, self.least.get(name, free))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(MEMORY_INTERVAL_S)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()


def _completion(endpoint: Endpoint, model: str, prompt: list[int], max_tokens: int, sampling: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One completion; an error answer is returned as {'error', 'status'}, never raised."""
    body = {**sampling, "model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": False}
    started = time.monotonic()
    try:
        answer = request_json(endpoint, "POST", "/v1/completions", body, timeout=timeout)
    except ApiError as exc:
        return {"error": str(exc)[:300], "status": exc.status, "wall_s": time.monotonic() - started}
    usage = answer.get("usage") or {}
    return {"prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"), "wall_s": time.monotonic() - started}


def run_probe(endpoint: Endpoint, model: str, terms: Contract, read_free: FreeReader, decode_tokens: int = 128, timeout: float = 3600.0) -> dict[str, Any]:
    """The three legs against a serving engine; the findings `verdicts.judge` reads, and the figures of the table."""
    free_at_boot = read_free()
    with MemorySampler(read_free) as memory:
        with BusySampler(endpoint) as window_busy:
            window = run_concurrently(
                [
                    (lambda i=i: _completion(endpoint, model, [FIRST_TOKEN_ID + i] * terms.prompt_tokens, terms.max_tokens, terms.sampling, timeout))
                    for i in range(terms.slots)
                ]
            )
        over = _completion(endpoint, model, [FIRST_TOKEN_ID] * (terms.ceiling + 1), 1, terms.sampling, timeout=300)
        started = time.monotonic()
        with BusySampler(endpoint) as decode_busy:
            decode = run_concurrently(
                [
                    (lambda i=i: _completion(endpoint, model, [FIRST_TOKEN_ID + i] * DECODE_PROMPT_TOKENS, decode_tokens, terms.sampling, timeout))
                    for i in range(terms.slots)
                ]
            )
        decode_wall = time.monotonic() - started
    answered = [r for r in window if r.get("completion_tokens") == terms.max_tokens]
    decoded = [r for r in decode if r.get("completion_tokens")]
    busy = max(window_busy.max_busy, decode_busy.max_busy)
    return {
        "contract": terms.as_dict(),
        "slots": terms.slots,
        "answered": len(answered),
        "tokens": sum((r.get("prompt_tokens") or 0) + (r.get("completion_tokens") or 0) for r in answered),
        "errors": [r["error"] for r in window if "error" in r][:2],
        "past_window_refused": "error" in over and over.get("status", 0) >= 400,
        "past_window": {"status": over.get("status", 200), "message": over.get("error", "accepted")},
        "streams": terms.slots,
        # Busy counts come from the engine; without any (no /slots, no running gauge) concurrency is unproven.
        "decoding_together": min(busy, terms.slots) if (window_busy.samples or decode_busy.samples) else 0,
        "busy_source": decode_busy.source or window_busy.source or "none",
        "decode_tps": round(sum(r["completion_tokens"] for r in decoded) / decode_wall, 1) if decoded and decode_wall > 0 else None,
        "free_at_boot": free_at_boot,
        "free_under_probe": memory.least,
        "window_wall_s": round(max((r["wall_s"] for r in window), default=0.0), 1),
    }
