"""The vLLM differential corpus: where it lives, which engine lines it keeps, how a stored case
becomes a gate shape, and what the engine said (shared by scripts/differential_vllm.py, which
grows the corpus, and test_vllm_corpus.py, which replays it)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

CORPUS = Path(__file__).resolve().parent / "corpus" / "vllm"

# The engine's own lines a case keeps (vLLM 0.32.0: kv_cache_utils.py update_kv_cache_capacity and
# _check_enough_kv_cache_memory, cpu_worker.py determine_available_memory, the loaders, and the
# exception that ends a failed boot).
LINE_PATTERNS = (
    re.compile(r"non-default args:"),
    re.compile(r"Using max model len"),
    re.compile(r"(Explicitly|Auto) set \(.*GiB for KV cache"),
    re.compile(r"Available KV cache memory"),
    re.compile(r"KV cache size: [\d,]+ tokens"),
    re.compile(r"Maximum concurrency for"),
    re.compile(r"Model loading took|Loading weights took"),
    re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:ERROR [^\]]*\] )?\w*(?:Error|Exception): "),
    re.compile(r"^\S+\.py: error: "),  # the argument parser's refusal
)

_TOKENS = re.compile(r"(?:GPU|CPU|XPU|TPU) KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_NODE = re.compile(r"(?:Explicitly|Auto) set \([\d.]+/([\d.]+)\) GiB")
_REFUSAL = re.compile(r"ValueError: (To serve at least one request with the model's max seq len \((\d+)\).*|No available memory for the cache blocks.*)")
_ERROR = re.compile(r"^\w*(?:Error|Exception): (.*)|^\S+\.py: error: (.*)")


def load_cases() -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(CORPUS.glob("*.json"))]


def engine_outcome(case: dict[str, Any]) -> dict[str, Any]:
    """What the engine printed: booted (tokens, concurrency), refused (the KV refusal's text) or
    error (the exception that ended the boot); incomplete when it printed none of them."""
    for line in case["lines"]:
        match = _TOKENS.search(line)
        if match:
            return {
                "kind": "booted",
                "tokens": int(match.group(1).replace(",", "")),
                "concurrency_len": int(match.group(2).replace(",", "")),
                "concurrency": match.group(3),
            }
    for line in case["lines"]:
        match = _REFUSAL.search(line)
        if match:
            return {"kind": "refused", "text": match.group(1)}
    for line in reversed(case["lines"]):
        match = _ERROR.search(line)
        if match and "Engine core initialization failed" not in line:
            return {"kind": "error", "text": line}
    return {"kind": "incomplete", "text": ""}


def node_memory(case: dict[str, Any]) -> str:
    for line in case["lines"]:
        match = _NODE.search(line)
        if match:
            return f"{match.group(1)} GiB"
    return "16 GiB"


def gate_shape(case: dict[str, Any]) -> dict[str, Any]:
    """The shape the budget gate prices for a case: the booted shape with the model's geometry.
    VLLM_CPU_KVCACHE_SPACE=N is the CPU build's legacy spelling of --kv-cache-memory-bytes N GiB
    (vllm/platforms/cpu.py CpuPlatform.check_and_update_config: it replaces the flag)."""
    shape = {**case["shape"], "model_geometry": case["model_geometry"]}
    space = (case.get("environment") or {}).get("VLLM_CPU_KVCACHE_SPACE")
    if space not in (None, ""):
        shape["kv_cache_memory_bytes"] = f"{int(space)} GiB"
    return shape


def gate_devices(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The one CPU 'device' the CPU worker prices on: its NUMA node, as the engine printed it."""
    return [{"name": "lab-cpu", "memory": node_memory(case), "kind": "cpu"}]


def pool_verdict(result):
    return next(v for v in result.verdicts if v.rule == "pool_law")


def replay(case: dict) -> tuple[bool, str]:
    """(agrees, what differed) for one stored case."""
    outcome = engine_outcome(case)
    try:
        result = price_shape(gate_shape(case), gate_devices(case))
    except ShapeError as exc:
        if outcome["kind"] == "error":
            return True, f"both refuse: gate {exc}; engine {outcome['text']}"
        return False, f"the gate raised {exc} where the engine {outcome['kind']}: {outcome.get('text') or outcome}"
    kv, law = result.kv, pool_verdict(result)
    if outcome["kind"] == "booted":
        # Any failing verdict is a gate refusal of a shape the engine booted.
        refused = [f"{v.rule}: {v.message}" for v in result.failures]
        predicted = (kv["tokens"], f"{kv_concurrency(result):.2f}", refused)
        printed = (outcome["tokens"], outcome["concurrency"], [])
        return predicted == printed, f"gate {predicted} vs engine {printed} ({kv['basis']}: {kv['note']})"
    if outcome["kind"] == "refused":
        same = not law.ok and kv.get("engine_refusal") is not None and outcome["text"].startswith(kv["engine_refusal"])
        return same, f"gate: {law.message}; engine: {outcome['text'][:200]}"
    if outcome["kind"] == "error":
        return False, f"the engine failed ({outcome['text'][:200]}) and the gate passed the shape: {law.message}"
    return False, "the case has no capacity line, refusal or error (an incomplete boot: re-draw it)"


def kv_concurrency(result) -> float:
    # The unrounded ratio, printed as the engine prints it (%.2f).
    blocks = result.kv.get("num_blocks"), result.kv.get("blocks_per_request")
    return blocks[0] / blocks[1] if None not in blocks else result.kv["concurrency"]


def report(cases: list[dict[str, Any]]) -> str:
    """One line per case, the match rate, and the worst case: a mismatch with the largest token
    error if there is one, else the booted case with the least room (pool blocks over one request)."""
    rows, worst, worst_key = [], None, None
    for case in cases:
        agrees, detail = replay(case)
        outcome = engine_outcome(case)
        rows.append(f"{case['id']} {'agree' if agrees else 'DIFFER'} {outcome['kind']:8} {detail[:150]}")
        try:
            kv = price_shape(gate_shape(case), gate_devices(case)).kv
        except ShapeError:
            kv = {}
        if not agrees:
            key = (1, abs(kv.get("tokens", 0) - outcome.get("tokens", 0)))
        elif outcome["kind"] == "booted" and kv.get("blocks_per_request"):
            key = (0, -kv["num_blocks"] / kv["blocks_per_request"])
        else:
            continue
        if worst_key is None or key > worst_key:
            worst, worst_key = case["id"], key
    agreed = sum(1 for row in rows if " agree " in row)
    kinds = {kind: sum(1 for case in cases if engine_outcome(case)["kind"] == kind) for kind in ("booted", "refused", "error", "incomplete")}
    rows.append(f"{agreed}/{len(cases)} agree ({', '.join(f'{n} {kind}' for kind, n in kinds.items() if n)}); worst case: {worst}")
    return "\n".join(rows)
