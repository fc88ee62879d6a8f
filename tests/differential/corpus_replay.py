"""The differential corpus priced by the gate, term by term against the engine's own lines: shared
by the replay test (test_llamacpp_corpus.py) and `scripts/differential.py --report`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import graph_law, kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import geometry_mapping
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ggml_graph import Graph
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFHeader, TensorInfo
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import geometry_from_header
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_boot_log, price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

CORPUS = Path(__file__).parent / "corpus" / "llamacpp"
MIB = 1 << 20
# The lab's engine has no GPU: every buffer is the CPU's, so a case is priced with every layer in
# host RAM (n_gpu_layers 0) and compared as one pool, whatever -ngl its argv carried.
LAB_DEVICES = [{"name": "lab-cpu", "memory": "64 GiB"}]
# Flash attention off, a quantised cache whose block does not divide the head dim: the engine does
# not check it, cuts blocks across heads in its per-head views, and one overruns its tensor.
VIEW_ABORT = "GGML_ASSERT(view_src"


def _jsonl(name: str) -> list[dict[str, Any]]:
    path = CORPUS / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


MODELS = {record["model"]: record for record in _jsonl("models.jsonl")}
CASES = _jsonl("cases.jsonl")
# The compute buffer's exact bytes per served boot (scripts/engine_graph.py exact: the engine prints
# MiB to two decimals; a preloaded wrapper reads the scheduler's own byte count).
COMPUTE_BYTES = {record["id"]: record["compute_bytes"] for record in _jsonl("compute_bytes.jsonl")}


def header_of(record: dict[str, Any]) -> GGUFHeader:
    metadata = dict(record["metadata"])
    count = metadata.pop("tokenizer.ggml.tokens.count", 0)
    tensors = [TensorInfo(name, tuple(shape), ggml_type, offset) for name, shape, ggml_type, offset in record["tensors"]]
    return GGUFHeader(record["model"], 3, metadata, tensors, record["data_offset"], record["file_size"], {"tokenizer.ggml.tokens": count})


def mapping_of(model: str) -> dict[str, Any]:
    """The stored header read as the gate reads a GGUF, as the explicit model_geometry mapping."""
    return geometry_mapping(geometry_from_header(header_of(MODELS[model])))


def engine_flash_attn(case: dict[str, Any]) -> bool:
    """Whether the engine ran flash attention: auto resolves at the fused-op check (b11669 prints
    "Flash Attention enabled" or "disabled"), an explicit setting is printed as such."""
    for line in case["lines"]:
        if "Flash Attention" in line:
            return "enabled" in line
    for line in case["lines"]:
        if "llama_context: flash_attn" in line and "auto" not in line:
            return line.rstrip().endswith("enabled")
    return case["shape"].get("flash_attn") is not False


def case_graphs(case: dict[str, Any], flash_attn: bool) -> list[tuple[tuple[int, int, int], Graph]]:
    shape = case["shape"]
    geometry = kv_law.geometry_from_header(header_of(MODELS[case["model"]]))
    batch = graph_law.llamacpp_batch(shape["ctx_size"], shape["parallel"], shape.get("batch"), shape["ubatch"])
    kv = kv_law.llamacpp_kv(
        geometry,
        shape["ctx_size"],
        shape["parallel"],
        shape["type_k"],
        shape["type_v"],
        unified=shape.get("kv_unified", False),
        ubatch=batch.n_ubatch,
        swa_full=shape.get("swa_full", False),
    )
    return graph_law.replay_graphs(geometry, kv, batch, shape["parallel"], flash_attn, shape["type_k"], shape["type_v"], shape.get("kv_unified", False))


def priced(case: dict[str, Any]):
    shape = {**case["shape"], "n_gpu_layers": 0, "model_geometry": mapping_of(case["model"])}
    return price_shape(shape, LAB_DEVICES)


def engine_refusal(lines: list[str]) -> str:
    """The engine's reason, as the words the gate's message must carry."""
    text = "\n".join(lines)
    if re.search(r"cache type \S+ with block size \d+ does not divide n_embd_head", text) or VIEW_ABORT in text:
        return "does not divide head dim"
    if "quantized V cache requires flash_attn" in text:
        return "quantized V cache requires flash_attn"
    return "unknown: " + next((line for line in lines if "ASSERT" in line or "error" in line.lower()), text[-200:])


def terms(result) -> dict[str, int]:
    out: dict[str, int] = {}
    for term in [*result.host_terms, *(t for device in result.devices for t in device.terms)]:
        out[term.name] = out.get(term.name, 0) + term.bytes
    return out


def mib(value: int) -> str:
    return f"{value / MIB:.2f}"


@dataclass
class Comparison:
    case: dict[str, Any]
    refused_by_gate: str = ""  # the gate's ShapeError, when it refuses
    # term -> (engine bytes, ledger bytes); kv per printed cache line
    pairs: dict[str, tuple[int, int]] = field(default_factory=dict)
    kv_lines: list[tuple[tuple[int, int, str, str, str], tuple[int, int, str, str, str]]] = field(default_factory=list)


def compare(case: dict[str, Any]) -> Comparison:
    out = Comparison(case)
    try:
        result = priced(case)
    except ShapeError as exc:
        out.refused_by_gate = str(exc)
        return out
    if not case["served"]:
        return out
    ledger = parse_boot_log("\n".join(case["lines"]), "llamacpp")
    for line, law in zip(ledger.kv_caches, result.kv["caches"]):
        engine = (line.cells, line.layers, mib(line.k_bytes), mib(line.v_bytes), mib(line.size_bytes))
        ours = (law["cells"], law["layers"], mib(law["k_bytes"]), mib(law["v_bytes"]), mib(law["k_bytes"] + law["v_bytes"]))
        out.kv_lines.append((engine, ours))
    if len(ledger.kv_caches) != len(result.kv["caches"]):
        out.kv_lines.append(((len(ledger.kv_caches), 0, "", "", ""), (len(result.kv["caches"]), 0, "", "", "")))

    def engine(kind: str) -> int:
        return sum((ledger.buffers.get(kind) or {}).values())

    ours = terms(result)
    out.pairs = {
        "rs": (engine("RS"), result.kv["recurrent_bytes"]),
        "output": (engine("output"), ours.get("output_buffer", 0)),
        "weights": (engine("model"), ours.get("input_embeddings", 0) + ours.get("host_layers", 0)),
        "compute": (COMPUTE_BYTES.get(case["id"], engine("compute")), ours.get("host_compute", 0)),
        "total": (sum(sum(per.values()) for per in ledger.buffers.values()), sum(ours.values())),
    }
    return out


# How close each term must be: exact to the engine's two decimals of MiB, or a relative bound.
# (The KV is checked line by line in kv_lines: a sum of the printed buffers carries their rounding.)
TOLERANCE = {"rs": "exact", "output": "exact", "weights": 0.01, "compute": 0.05, "total": 0.03}


def matches(term: str, engine: int, ours: int) -> bool:
    bound = TOLERANCE[term]
    if bound == "exact":
        return mib(engine) == mib(ours)
    if engine == 0:
        return ours == 0
    return abs(ours / engine - 1) <= bound


def report() -> str:
    """Per term: the share of cases that match, and the worst case with its shape."""
    rows = [compare(case) for case in CASES]
    lines = [f"{len(CASES)} cases ({sum(c['served'] for c in CASES)} served, {sum(not c['served'] for c in CASES)} refused by the engine)"]
    refusals = [row for row in rows if not row.case["served"]]
    agree = sum(engine_refusal(row.case["lines"]) in row.refused_by_gate for row in refusals)
    lines.append(f"refusal: {agree}/{len(refusals)} refused by the gate for the engine's reason")
    stricter = [row for row in rows if row.case["served"] and row.refused_by_gate]
    lines.append(f"stricter: {len(stricter)} served boots the gate refuses ({', '.join(r.case['id'] for r in stricter[:8])})")
    priced_rows = [row for row in rows if row.case["served"] and not row.refused_by_gate]
    kv_ok = sum(all(e == o for e, o in row.kv_lines) for row in priced_rows)
    lines.append(f"kv lines (cells, layers, K, V, size): {kv_ok}/{len(priced_rows)} exact")
    for term in TOLERANCE:
        pairs = [(row, *row.pairs[term]) for row in priced_rows]
        ok = sum(matches(term, e, o) for _r, e, o in pairs)
        if bound_is_exact := TOLERANCE[term] == "exact":
            worst = max(pairs, key=lambda p: abs(p[2] - p[1]))
        else:
            worst = max(pairs, key=lambda p: abs(p[2] / p[1] - 1) if p[1] else (0 if p[2] == 0 else 1e9))
        row, e, o = worst
        off = f"{o - e:+,} B" if bound_is_exact else f"{(o / e - 1):+.1%}" if e else f"{o} B where the engine has 0"
        shape = {k: v for k, v in row.case["shape"].items() if k not in ("runtime", "served_id", "port", "jinja", "model_file")}
        bound = TOLERANCE[term]
        lines.append(
            f"{term:8s} {ok}/{len(pairs)} ({ok / len(pairs):.0%}) {'exact' if bound == 'exact' else f'within {bound:.0%}'}; "
            f"worst {row.case['id']} {row.case['model']}: engine {mib(e)} MiB, ledger {mib(o)} MiB ({off}) {shape}"
        )
    lines.append("compute per architecture (within 5%): " + ", ".join(f"{arch} {ok}/{n}" for arch, (ok, n) in compute_by_architecture(priced_rows).items()))
    exact = compute_exact_by_architecture(priced_rows)
    lines.append("compute to the byte (the engine's exact count): " + ", ".join(f"{arch} {ok}/{n}" for arch, (ok, n) in exact.items()))
    return "\n".join(lines)


def compute_by_architecture(rows: list[Comparison]) -> dict[str, tuple[int, int]]:
    """Per architecture: (boots whose compute buffer is within its tolerance, boots priced)."""
    out: dict[str, list[int]] = {}
    for row in rows:
        tally = out.setdefault(MODELS[row.case["model"]]["generator"]["arch"], [0, 0])
        tally[0] += matches("compute", *row.pairs["compute"])
        tally[1] += 1
    return {arch: (ok, n) for arch, (ok, n) in sorted(out.items())}


def compute_exact_by_architecture(rows: list[Comparison]) -> dict[str, tuple[int, int]]:
    """Per architecture: (boots whose compute buffer the ledger prices to the byte, boots with an
    exact engine count)."""
    out: dict[str, list[int]] = {}
    for row in rows:
        if row.case["id"] not in COMPUTE_BYTES:
            continue
        engine, ours = row.pairs["compute"]
        tally = out.setdefault(MODELS[row.case["model"]]["generator"]["arch"], [0, 0])
        tally[0] += engine == ours
        tally[1] += 1
    return {arch: (ok, n) for arch, (ok, n) in sorted(out.items())}
