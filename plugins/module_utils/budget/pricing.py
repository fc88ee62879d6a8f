# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Price a shape on every device before deploy, and judge it.

price_shape() returns every device's named terms, the KV figures, the client window and each
rule's verdict (see ledger.py). The KV figure rests on the stored boots of the shape's geometry
(calibration.py) where there are any.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import calibration, kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.client_contract import client_window
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.fields import DEFAULT_FREE_FLOOR, DEFAULT_MAX_GAP, ShapeError, _float, _int, _size
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import _load_geometry, assign_layers
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFHeader, read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import (
    BudgetResult,
    DeviceLedger,
    Term,
    Verdict,
    _capacity_verdicts,
    _devices,
    slot_ceiling,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB, SizeError, parse_size

GRAPH_BASE_BYTES = 256 * MIB  # vLLM's own graph-memory estimate: 256 MiB + 52 MiB per captured graph
GRAPH_PER_CAPTURE_BYTES = 52 * MIB


# --- llama.cpp --------------------------------------------------------------------------------


def _price_llamacpp(shape: dict[str, Any], loader: Callable[[str], GGUFHeader], boots: list[dict[str, Any]]) -> BudgetResult:
    devices = _devices(shape)
    geometry = _load_geometry(shape, "model", loader)
    if geometry is None:
        raise ShapeError("model: give the GGUF path (first part of a split set) or model_geometry")
    ctx = _int(shape, "ctx_size", minimum=1)
    if ctx is None:
        raise ShapeError("ctx_size: required for llama.cpp shapes")
    parallel = _int(shape, "parallel", 1, minimum=1) or 1
    type_k = str(shape.get("type_k", "f16"))
    type_v = str(shape.get("type_v", type_k))
    ubatch = _int(shape, "ubatch", 512, minimum=1) or 512
    unified = bool(shape.get("kv_unified", False))
    try:
        kv = kv_law.llamacpp_kv(geometry, ctx, parallel, type_k, type_v, unified=unified, ubatch=ubatch, swa_full=bool(shape.get("swa_full", False)))
    except kv_law.KvLawError as exc:
        raise ShapeError(str(exc)) from None

    split = shape.get("tensor_split")
    if split is not None and not isinstance(split, list):
        split = [float(v) for v in str(split).split(",")]
    placement = assign_layers(geometry.n_layer, len(devices), split)
    last = len(devices) - 1
    weights = [0] * len(devices)
    kv_bytes = [0] * len(devices)
    for il in range(geometry.n_layer):
        weights[placement[il]] += geometry.layer_weight_bytes.get(il, 0)
        kv_bytes[placement[il]] += kv.per_layer[il]
    weights[placement[geometry.n_layer]] += geometry.output_weight_bytes
    for index, device in enumerate(devices):
        layers_here = sum(1 for il in range(geometry.n_layer) if placement[il] == index)
        device.add("weights", weights[index], f"{layers_here} layers" + (" + output" if placement[geometry.n_layer] == index else ""))
        device.add("kv", kv_bytes[index], f"{type_k}/{type_v}")

    compute = shape.get("compute_buffer")
    if isinstance(compute, list):
        if len(compute) != len(devices):
            raise ShapeError(f"compute_buffer: {len(compute)} values for {len(devices)} devices")
        for index, value in enumerate(compute):
            devices[index].add("compute", parse_size(value, f"compute_buffer[{index}]"), f"ubatch {ubatch}")
    elif compute is not None:
        size = _size(shape, "compute_buffer") or 0
        for device in devices:
            device.add("compute", size, f"ubatch {ubatch}")

    projector = _projector_bytes(shape, loader)
    devices[0].add("projector", projector)
    drafter = _load_geometry(shape, "drafter", loader)
    notes: list[str] = []
    if drafter is not None:
        draft_kv = kv_law.llamacpp_kv(
            drafter, ctx, parallel, str(shape.get("drafter_type_k", type_k)), str(shape.get("drafter_type_v", type_v)), unified=unified, ubatch=ubatch
        )
        devices[last].add("drafter_weights", drafter.weight_bytes)
        window_note = f"window {drafter.sliding_window}" if drafter.sliding_window else "no sliding window: caches the full target window"
        devices[last].add("drafter_kv", draft_kv.total_bytes, window_note)
        notes.append(f"drafter KV sized from the drafter's own header ({window_note}): {draft_kv.total_bytes / MIB:,.1f} MiB")
    for index, extra in enumerate(shape.get("extra_terms") or []):
        _add_extra(devices, extra, index)

    host_terms = [Term("input_embeddings", geometry.input_weight_bytes)] if geometry.input_weight_bytes else []
    floor = _size(shape, "free_floor", DEFAULT_FREE_FLOOR) or 0
    max_gap = _size(shape, "max_device_gap", DEFAULT_MAX_GAP)
    verdicts = _capacity_verdicts(devices, floor, max_gap)

    slot_spec = shape.get("slot_calibration")
    if slot_spec:
        fixed, per_slot, ceiling = slot_ceiling(slot_spec.get("boots") or [], devices[0].capacity, floor)
        ok = parallel <= ceiling
        need = fixed + parallel * per_slot
        verdicts.append(
            Verdict(
                "slot_ceiling",
                ok,
                f"{devices[0].name}: measured fixed {fixed / MIB:,.0f} MiB + {per_slot / MIB:,.0f} MiB per slot: at most {ceiling} slots; {parallel} requested"
                + ("" if ok else f", needing {need / MIB:,.0f} MiB + floor: over by {(need + floor - devices[0].capacity) / MIB:,.1f} MiB"),
                devices[0].name,
                "slots",
                None if ok else round((need + floor - devices[0].capacity) / MIB, 1),
            )
        )

    per_slot_state = kv.total_bytes // parallel if not unified else kv.total_bytes
    cache_ram = _size(shape, "cache_ram")
    if cache_ram is not None:
        host_ram = _size(shape, "host_ram")
        holds = cache_ram >= per_slot_state
        verdicts.append(
            Verdict(
                "cache_ram_holds_slot",
                holds,
                f"--cache-ram {cache_ram / MIB:,.0f} MiB "
                + ("holds" if holds else "cannot hold")
                + f" one full slot's state ({per_slot_state / MIB:,.1f} MiB)",
                "host",
                "cache_ram",
                None if holds else round((per_slot_state - cache_ram) / MIB, 1),
            )
        )
        if host_ram is not None:
            under = cache_ram <= host_ram // 2
            verdicts.append(
                Verdict(
                    "cache_ram_half_host",
                    under,
                    f"--cache-ram {cache_ram / MIB:,.0f} MiB " + ("<=" if under else ">") + f" half the host RAM ({host_ram / 2 / MIB:,.0f} MiB)",
                    "host",
                    "cache_ram",
                    None if under else round((cache_ram - host_ram / 2) / MIB, 1),
                )
            )

    ceiling = kv.per_slot_window
    client, client_verdicts = _client(shape, ceiling)
    verdicts.extend(client_verdicts)
    key = calibration.geometry_key("llamacpp", shape, geometry)
    kv_facts = {**kv.as_dict(), "per_slot_state_bytes": per_slot_state, **_llamacpp_basis(kv, boots, key, shape, notes)}
    return BudgetResult("llamacpp", devices, kv_facts, client, verdicts, host_terms, notes, key, calibration.geometry_spec(geometry))


def _llamacpp_basis(kv: kv_law.LlamaCppKv, boots: list[dict[str, Any]], key: str, shape: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """What the KV figure rests on: a stored boot at this very layout, or the law alone (and
    then which layouts of this geometry were measured)."""
    exact, layouts = calibration.llamacpp_measured(boots, key, shape)
    if exact is not None:
        line = exact["ledger"]["kv_caches"][0]
        if calibration.engine_mib(line["size_bytes"]) == calibration.engine_mib(kv.total_bytes):
            return {"basis": "measured", "measured_bytes": line["size_bytes"]}
        notes.append(
            f"kv: a boot of this geometry and layout measured {line['size_bytes'] / MIB:,.2f} MiB, the law says {kv.total_bytes / MIB:,.2f} MiB: "
            "trust the measurement and report the law's miss"
        )
        return {"basis": "measured-differs", "measured_bytes": line["size_bytes"]}
    if layouts:
        notes.append(f"kv: no boot measured at this layout; {len(layouts)} boot(s) of this geometry were, at {layouts}: the law extrapolates")
        return {"basis": "extrapolated"}
    return {"basis": "formula"}


def _projector_bytes(shape: dict[str, Any], loader: Callable[[str], GGUFHeader]) -> int:
    value = shape.get("projector")
    if not value:
        return 0
    if isinstance(value, str) and value.endswith(".gguf"):
        return loader(value).tensor_bytes()
    return _size(shape, "projector") or 0


def _add_extra(devices: list[DeviceLedger], extra: Any, index: int) -> None:
    if not isinstance(extra, dict) or "name" not in extra or "size" not in extra:
        raise ShapeError(f"extra_terms[{index}]: give name, size and optionally device")
    size = parse_size(extra["size"], f"extra_terms[{index}].size")
    target = extra.get("device")
    chosen = [d for d in devices if target in (None, "all", d.name)]
    if not chosen:
        raise ShapeError(f"extra_terms[{index}].device: no device named {target!r}")
    for device in chosen:
        device.add(str(extra["name"]), size, "declared")


def _client(shape: dict[str, Any], ceiling: int) -> tuple[dict[str, Any], list[Verdict]]:
    try:
        window = client_window(ceiling, _int(shape, "client_gap"), _int(shape, "client_max_tokens"))
    except ValueError as exc:
        raise ShapeError(str(exc)) from None
    gap = window.ceiling - window.context_window
    verdict = Verdict(
        "client_window",
        window.safe,
        f"client window {window.context_window:,} (ceiling {ceiling:,}, gap {gap:,}): worst-case request {window.worst_case_tokens:,} tokens"
        + (" fits" if window.safe else f" exceeds the ceiling by {window.worst_case_tokens - ceiling:,}: widen client_gap"),
    )
    return window.as_dict(), [verdict]


# --- vLLM -------------------------------------------------------------------------------------


def _calibrations(shape: dict[str, Any]) -> list[kv_law.VllmCalibration]:
    out = []
    for index, point in enumerate(shape.get("calibration") or []):
        field_name = f"calibration[{index}]"
        if not isinstance(point, dict):
            raise ShapeError(f"{field_name}: expected a mapping with kv_dtype, max_model_len, pool_bytes, tokens")
        tokens = _int(point, "tokens", minimum=1)
        length = _int(point, "max_model_len", minimum=1)
        pool = _size(point, "pool_bytes")
        if tokens is None or length is None or pool is None:
            raise ShapeError(f"{field_name}: kv_dtype, max_model_len, pool_bytes and tokens are all required")
        out.append(kv_law.VllmCalibration(str(point.get("kv_dtype", "auto")), length, pool, tokens, str(point.get("source", ""))))
    return out


def _price_vllm(shape: dict[str, Any], loader: Callable[[str], GGUFHeader], boots: list[dict[str, Any]]) -> BudgetResult:
    devices = _devices(shape)
    tp = _int(shape, "tensor_parallel", 1, minimum=1) or 1
    if tp != len(devices):
        raise ShapeError(f"tensor_parallel: {tp}, but {len(devices)} devices are listed (one rank per device)")
    max_len = _int(shape, "max_model_len", minimum=1)
    if max_len is None:
        raise ShapeError("max_model_len: required for vLLM shapes")
    seqs = _int(shape, "max_num_seqs", 1, minimum=1) or 1
    util = _float(shape, "gpu_memory_utilization", 0.9) or 0.0
    dtype = str(shape.get("kv_cache_dtype", "auto"))
    try:
        kv_law.normalise_vllm_dtype(dtype)
    except kv_law.KvLawError as exc:
        raise ShapeError(str(exc)) from None

    verdicts = [
        Verdict(
            "gpu_memory_utilization",
            0.0 < util < 1.0,
            f"gpu_memory_utilization {util}: "
            + ("below 1.0" if util < 1.0 else "1.0 is unbootable (worker init demands free memory above the budget); use at most 0.98"),
            term=None if util < 1.0 else "gpu_memory_utilization",
        )
    ]
    weights = _size(shape, "weights_per_rank")
    if weights is None:
        total = _size(shape, "weights")
        weights = (total // tp) if total is not None else 0
    pool = _size(shape, "kv_cache_memory_bytes")
    graphs = _size(shape, "graph_memory")
    if graphs is None:
        count = _int(shape, "graph_captures", 0) or 0
        graphs = GRAPH_BASE_BYTES + GRAPH_PER_CAPTURE_BYTES * count if count else 0
    overhead = _size(shape, "runtime_overhead", 0) or 0
    non_torch = _size(shape, "non_torch_memory", 0) or 0
    arena = _size(shape, "expert_arena")
    notes: list[str] = []
    for device in devices:
        budget = int(device.capacity * util)
        device_pool = pool if pool is not None else max(budget - weights - graphs - overhead - (arena or 0), 0)
        device.add("weights", weights)
        device.add("kv_pool", device_pool, "--kv-cache-memory-bytes" if pool is not None else "what the utilization budget leaves")
        device.add("graphs", graphs)
        device.add("runtime_overhead", overhead)
        if shape.get("expert_offload") or arena is not None:
            # The arena takes what remains of the utilization budget unless it is declared; vLLM
            # counts non-torch memory inside that budget.
            remainder = max(budget - weights - device_pool - graphs - overhead - non_torch, 0)
            device.add("expert_arena", arena if arena is not None else remainder, "declared" if arena is not None else "remainder of the budget")
        device.add("non_torch", non_torch)
    for index, extra in enumerate(shape.get("extra_terms") or []):
        _add_extra(devices, extra, index)

    pool_bytes = sum(t.bytes for t in devices[0].terms if t.name == "kv_pool")
    geometry = _load_geometry(shape, "model", loader)
    try:
        key = calibration.geometry_key("vllm", shape, geometry)
        kv = kv_law.vllm_kv(pool_bytes, max_len, dtype, _calibrations(shape) + calibration.vllm_points(boots, key), geometry, tp)
    except kv_law.KvLawError as exc:
        raise ShapeError(str(exc)) from None
    if kv.basis != "measured":
        notes.append(kv.note)
    pool_ok_low = kv.tokens >= max_len
    pool_ok_high = kv.tokens <= seqs * max_len
    verdicts.append(
        Verdict(
            "pool_law",
            pool_ok_low and pool_ok_high,
            f"pool {kv.tokens:,} tokens ({kv.basis}), concurrency {kv.concurrency:.2f}x: "
            + (
                f"must hold at least one max_model_len ({max_len:,}): short by {(max_len - kv.tokens) * kv.bytes_per_token / MIB:,.1f} MiB"
                if not pool_ok_low
                else f"more than max_num_seqs x max_model_len ({seqs * max_len:,}): "
                f"{(kv.tokens - seqs * max_len) * kv.bytes_per_token / MIB:,.1f} MiB the engine can never use; shrink the pool or raise max_num_seqs"
                if not pool_ok_high
                else f"within [{max_len:,}, {seqs * max_len:,}]"
            ),
            None if pool_ok_low and pool_ok_high else devices[0].name,
            None if pool_ok_low and pool_ok_high else "kv_pool",
            None if pool_ok_low else round((max_len - kv.tokens) * kv.bytes_per_token / MIB, 1),
        )
    )
    floor = _size(shape, "free_floor", DEFAULT_FREE_FLOOR) or 0
    verdicts.extend(_capacity_verdicts(devices, floor, _size(shape, "max_device_gap", DEFAULT_MAX_GAP)))
    client, client_verdicts = _client(shape, max_len)
    verdicts.extend(client_verdicts)
    spec = calibration.geometry_spec(geometry) if geometry is not None else None
    return BudgetResult("vllm", devices, kv.as_dict(), client, verdicts, [], notes, key, spec)


def price_shape(shape: dict[str, Any], loader: Callable[[str], GGUFHeader] = read_model, boots: list[dict[str, Any]] | None = None) -> BudgetResult:
    """Price a shape on every device and judge it. Raises ShapeError on malformed input.

    boots: stored boot ledgers (calibration.load_boots); those of this shape's geometry are
    the measurements the KV figure rests on."""
    if not isinstance(shape, dict):
        raise ShapeError("shape: expected a mapping")
    runtime = shape.get("runtime")
    pricers = {"llamacpp": _price_llamacpp, "vllm": _price_vllm}
    if runtime not in pricers:
        raise ShapeError(f"runtime: expected 'llamacpp' or 'vllm', got {runtime!r}")
    try:
        return pricers[runtime](shape, loader, list(boots or []))
    except (SizeError, kv_law.KvLawError) as exc:
        raise ShapeError(str(exc)) from None
