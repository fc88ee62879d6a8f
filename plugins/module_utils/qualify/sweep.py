# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The batch/ubatch sweep of playbooks/sweep.yml: one cell per shape, each its own boot.

Seed 003's sweep (23 cells x 3 reps) ran one llama-bench per cell because "llama-bench exit(1)s
the moment a test cannot run, so a single infeasible ubatch would otherwise take every later cell
with it"; it sampled memory per cell, and its trap-restored service was left stopped when `set -u`
aborted it four seconds in. Here a cell is the endpoint booted as the service with the cell's
shape (the same unit and limits as production); a cell the gate refuses or that does not boot is
recorded with its reason and the sweep goes on; the service's restore is the play's `always`.

A booted cell is measured through the completions route both engines serve, token ids as the
prompt: prefill from a one-token answer to a prompt of `prompt_tokens` (its wall time is the
prefill), decode from a second answer of `decode_tokens` (the extra tokens over the extra time),
each repeated `reps` times (the median kept), free memory sampled throughout.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError, Endpoint, request_json
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.probe import FIRST_TOKEN_ID, FreeReader, MemorySampler

COLUMNS = ("cell", "verdict", "prefill tok/s", "decode tok/s", "free at boot MiB", "free under load MiB", "why")


def _timed(endpoint: Endpoint, model: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    started = time.monotonic()
    answer = request_json(endpoint, "POST", "/v1/completions", body, timeout=1800)
    return time.monotonic() - started, int((answer.get("usage") or {}).get("completion_tokens") or 0)


def measure_cell(endpoint: Endpoint, model: str, prompt_tokens: int, decode_tokens: int, reps: int, read_free: FreeReader) -> dict[str, Any]:
    """Median prefill and decode tok/s over `reps`, with free memory at boot and under load."""
    free_at_boot = read_free()
    prefill, decode = [], []
    with MemorySampler(read_free) as memory:
        try:
            for rep in range(reps):
                # A new first token per rep keeps each prompt off the last one's cache.
                prompt = [FIRST_TOKEN_ID + rep] * prompt_tokens
                first_s, _one = _timed(endpoint, model, prompt, 1)
                long_s, tokens = _timed(endpoint, model, prompt, decode_tokens)
                prefill.append(prompt_tokens / first_s)
                if tokens > 1 and long_s > first_s:
                    decode.append((tokens - 1) / (long_s - first_s))
        except ApiError as exc:
            return {"verdict": "failed", "why": str(exc)[:300], "free_at_boot": free_at_boot, "free_under_load": memory.least}
    return {
        "verdict": "measured",
        "why": f"median of {reps}",
        "prefill_tps": round(statistics.median(prefill), 1),
        "decode_tps": round(statistics.median(decode), 1) if decode else None,
        "free_at_boot": free_at_boot,
        "free_under_load": memory.least,
    }


def cell_name(cell: dict[str, Any]) -> str:
    return " ".join(f"{key}={value}" for key, value in cell.items()) or "(the shape itself)"


def table(cells: list[dict[str, Any]]) -> str:
    """Fixed-width text, one line per cell: {cell, verdict, why, prefill_tps, decode_tps, free_*}."""
    rows = [COLUMNS]
    for cell in cells:
        rows.append(
            (
                cell_name(cell.get("cell") or {}),
                str(cell.get("verdict", "-")),
                "-" if cell.get("prefill_tps") is None else f"{cell['prefill_tps']:.1f}",
                "-" if cell.get("decode_tps") is None else f"{cell['decode_tps']:.1f}",
                _mib(cell.get("free_at_boot") or {}),
                _mib(cell.get("free_under_load") or {}),
                str(cell.get("why", ""))[:200],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows)


def _mib(free: dict[str, int]) -> str:
    return " ".join(f"{name}={value / (1 << 20):,.0f}" for name, value in sorted(free.items())) or "-"
