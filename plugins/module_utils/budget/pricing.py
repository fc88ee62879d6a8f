# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Price a shape on every device before deploy, and judge it.

price_shape() takes the typed shape (shape/model.py), the devices it runs on and, where the
payload is readable, the payload directory; it returns every device's named terms, the KV figures,
the client window and each rule's verdict (see ledger.py). The KV figure rests on the stored boots
of the shape's geometry (calibration.py) where there are any.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import calibration, expert_arena, kv_law, placement, rules
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.client_contract import client_window, engine_ceiling
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import load_geometry
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFHeader, read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import (
    BudgetResult,
    DeviceLedger,
    Term,
    Verdict,
    _capacity_verdicts,
    devices_from,
    slot_ceiling,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.placement import HOST, assign_layers
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import (
    LlamaCppShape,
    Shape,
    ShapeError,
    VllmShape,
    override_tensor_order,
    parse_bytes,
    parse_int,
    parse_shape,
    resolve_path,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, MIB, SizeError

GRAPH_BASE_BYTES = 256 * MIB  # vLLM's own graph-memory estimate: 256 MiB + 52 MiB per captured graph
GRAPH_PER_CAPTURE_BYTES = 52 * MIB


class _Payload:
    """Where the budget may read the payload: files under the payload directory on this machine,
    or nothing (then explicit geometries and sizes stand in)."""

    def __init__(self, payload_dir: str | None, loader: Callable[[str], GGUFHeader]) -> None:
        self.payload_dir = payload_dir
        self._loader = loader
        self._headers: dict[str, GGUFHeader] = {}

    def loader(self, path: str) -> GGUFHeader:
        """Each file's header is read once per pricing (the geometry and the tensor placement
        both read the model's: a large MoE lists about 100,000 tensor infos)."""
        if path not in self._headers:
            self._headers[path] = self._loader(path)
        return self._headers[path]

    def path(self, relative: str | None) -> str | None:
        return resolve_path(relative, self.payload_dir) if self.payload_dir and relative else None

    def geometry(self, explicit: Any, relative: str | None, field_name: str) -> kv_law.ModelGeometry | None:
        return load_geometry(explicit, self.path(relative), self.loader, field_name)


# --- llama.cpp --------------------------------------------------------------------------------


def _price_llamacpp(shape: LlamaCppShape, devices: list[DeviceLedger], payload: _Payload, boots: list[dict[str, Any]]) -> BudgetResult:
    geometry = payload.geometry(shape.model_geometry, shape.model_file, "model")
    if geometry is None:
        raise ShapeError("model_file: give the GGUF (first part of a split set) and price where the payload is, or give model_geometry")
    try:
        kv = kv_law.llamacpp_kv(
            geometry, shape.ctx_size, shape.parallel, shape.type_k, shape.cache_type_v, unified=shape.kv_unified, ubatch=shape.ubatch, swa_full=shape.swa_full
        )
    except kv_law.KvLawError as exc:
        raise ShapeError(str(exc)) from None

    layer_device = assign_layers(geometry.n_layer, len(devices), shape.tensor_split, shape.n_gpu_layers)
    last = len(devices) - 1
    weights = [0] * len(devices)
    kv_bytes = [0] * len(devices)
    host_weights = host_kv = 0
    for il in range(geometry.n_layer):
        if layer_device[il] == HOST:
            host_weights += geometry.layer_weight_bytes.get(il, 0)
            host_kv += kv.per_layer[il]
            continue
        weights[layer_device[il]] += geometry.layer_weight_bytes.get(il, 0)
        kv_bytes[layer_device[il]] += kv.per_layer[il]
    output_device = layer_device[geometry.n_layer]
    if output_device == HOST:
        host_weights += geometry.output_weight_bytes
    else:
        weights[output_device] += geometry.output_weight_bytes
    notes: list[str] = []
    overrides, override_verdicts = _override_placement(shape, payload, layer_device, geometry.n_layer, len(devices), notes)
    input_weights = geometry.input_weight_bytes
    if overrides is not None:
        input_weights -= overrides.off_input
        host_weights -= overrides.off_host_layers
    for index, device in enumerate(devices):
        layers_here = sum(1 for il in range(geometry.n_layer) if layer_device[il] == index)
        note = f"{layers_here} layers" + (" + output" if output_device == index else "")
        moved_off = overrides.off_device[index] if overrides is not None else 0
        if moved_off:
            note += f", less {moved_off / MIB:,.1f} MiB of tensors --override-tensor places elsewhere"
        device.add("weights", weights[index] - moved_off, note)
        if overrides is not None:
            device.add("override_tensor_weights", overrides.onto_device[index], "tensors --override-tensor places on this device")
        device.add("kv", kv_bytes[index], f"{shape.type_k}/{shape.cache_type_v}")

    compute = shape.compute_buffer
    if isinstance(compute, tuple):
        if len(compute) != len(devices):
            raise ShapeError(f"compute_buffer: {len(compute)} values for {len(devices)} devices")
        for device, size in zip(devices, compute):
            device.add("compute", size, f"ubatch {shape.ubatch}")
    elif compute is not None:
        for device in devices:
            device.add("compute", compute, f"ubatch {shape.ubatch}")

    devices[0].add("projector", _projector_bytes(shape, payload))
    drafter = payload.geometry(shape.drafter_geometry, shape.drafter, "drafter")
    if shape.drafter and drafter is None:
        raise ShapeError("drafter: its header sizes its KV; price where the payload is, or give drafter_geometry")
    draft_kv_bytes = 0
    if drafter is not None:
        draft_kv = kv_law.llamacpp_kv(
            drafter,
            shape.ctx_size,
            shape.parallel,
            shape.drafter_type_k or shape.type_k,
            shape.drafter_type_v or shape.cache_type_v,
            unified=shape.kv_unified,
            ubatch=shape.ubatch,
        )
        draft_kv_bytes = draft_kv.total_bytes
        devices[last].add("drafter_weights", drafter.weight_bytes)
        window_note = f"window {drafter.sliding_window}" if drafter.sliding_window else "no sliding window: caches the full target window"
        devices[last].add("drafter_kv", draft_kv.total_bytes, window_note)
        notes.append(f"drafter KV sized from the drafter's own header ({window_note}): {draft_kv.total_bytes / MIB:,.1f} MiB")
    for index, extra in enumerate(shape.extra_terms):
        _add_extra(devices, extra, index)
    host_terms = [
        Term(name, size)
        for name, size in (
            ("input_embeddings", input_weights),
            ("host_layers", host_weights),
            ("override_tensor_weights", overrides.to_host if overrides is not None else 0),
            ("host_kv", host_kv),
        )
        if size
    ]
    if host_weights:
        offloaded = sum(1 for device in layer_device if device != HOST)
        notes.append(f"n_gpu_layers {shape.n_gpu_layers}: {geometry.n_layer + 1 - offloaded} of {geometry.n_layer + 1} layers stay in host RAM")
    verdicts = _capacity_verdicts(devices, shape.free_floor, shape.max_device_gap) + override_verdicts
    verdicts += placement.draft_device_verdicts(
        shape.draft_device, shape.drafter_borrows_output, bool(shape.override_tensor), layer_device, [device.name for device in devices]
    )

    if shape.slot_calibration:
        fixed, per_slot, ceiling = slot_ceiling(shape.slot_calibration.get("boots") or [], devices[0].capacity, shape.free_floor)
        ok = shape.parallel <= ceiling
        need = fixed + shape.parallel * per_slot
        over = round((need + shape.free_floor - devices[0].capacity) / MIB, 1)
        verdicts.append(
            Verdict(
                "slot_ceiling",
                ok,
                f"{devices[0].name}: measured fixed {fixed / MIB:,.0f} MiB + {per_slot / MIB:,.0f} MiB per slot: "
                f"at most {ceiling} slots; {shape.parallel} requested" + ("" if ok else f", needing {need / MIB:,.0f} MiB + floor: over by {over:,.1f} MiB"),
                devices[0].name,
                "slots",
                None if ok else over,
            )
        )

    state_per_token = kv_law.prompt_state_per_token(geometry, kv, shape.type_k, shape.cache_type_v)
    per_slot_state = kv.total_bytes // kv.n_streams + (state_per_token - kv.bytes_per_token_full) * kv.cells_per_stream
    verdicts.extend(_cache_ram_verdicts(shape, per_slot_state, geometry.has_recurrent))
    verdicts.extend(rules.judge(shape, devices, geometry, payload.path(shape.model_file), notes))
    client, client_verdicts = _client(shape)
    verdicts.extend(client_verdicts)
    key = calibration.geometry_key(shape, geometry)
    kv_facts = {
        **kv.as_dict(),
        "per_slot_state_bytes": per_slot_state,
        "drafter_kv_bytes": draft_kv_bytes,
        **_llamacpp_basis(kv, boots, key, shape, notes),
    }
    if shape.cache_ram is not None:
        kv_facts["prompt_state_per_token"] = state_per_token
        kv_facts["cache_ram_tokens_held"] = shape.cache_ram // state_per_token if state_per_token else None
    return BudgetResult("llamacpp", devices, kv_facts, client, verdicts, host_terms, notes, key, calibration.geometry_spec(geometry))


def _override_placement(
    shape: LlamaCppShape, payload: _Payload, layer_device: list[int], n_layer: int, n_devices: int, notes: list[str]
) -> tuple[placement.OverridePlacement | None, list[Verdict]]:
    """--override-tensor priced per tensor from the GGUF's tensor infos, in the order llama.cpp
    applies the patterns; without a readable header the overridden tensors stay where the layer
    law puts them, an upper bound on the cards that the notes state."""
    if not shape.override_tensor:
        return None, []
    path = payload.path(shape.model_file)
    try:
        header = payload.loader(path) if path else None
    except OSError:
        header = None  # an explicit geometry priced away from the payload
    if header is None or path is None:
        notes.append(
            f"override_tensor: {len(shape.override_tensor)} pattern(s) move tensors, but no GGUF header is readable here to size them: "
            "the ledger counts those tensors where the layer law puts them (an upper bound on the cards)"
        )
        return None, []
    if not header.tensors:
        raise ShapeError(f"model_file: {path} lists no tensors; give the first part of the split set (the loader merges every part)")
    placed = placement.place_overrides(header.tensors, override_tensor_order(shape.override_tensor), layer_device, n_layer, n_devices)
    verdicts = placement.override_verdicts(placed, len(header.tensors), path)
    if shape.model_geometry:
        # The weights are the explicit geometry's sizes: moving the header's bytes off them would mix two sources.
        notes.append(
            "override_tensor: model_geometry sizes the weights, so the header's overridden tensors are not moved off them "
            "(an upper bound on the cards); drop model_geometry to price them per tensor"
        )
        return None, verdicts
    for pattern in placed.patterns:
        if pattern.taken:
            where = "host RAM" if pattern.target == placement.HOST else pattern.buffer
            notes.append(f"override_tensor {pattern.pattern}={pattern.buffer}: {pattern.taken:,} tensor(s), {pattern.bytes / MIB:,.1f} MiB in {where}")
    return placed, verdicts


def _cache_ram_verdicts(shape: LlamaCppShape, per_slot_state: int, recurrent: bool) -> list[Verdict]:
    """--cache-ram caps the prompt states saved in host RAM, and a state larger than the cap is
    refused outright. On a recurrent hybrid (DeltaNet) a refused state means a full re-prefill, so
    there the cap must hold one full slot's state (seeds/001: "the cap must clear one full slot's
    state"); elsewhere it is a deliberate size (seeds/001: "Gemma4 is not a DeltaNet model, so the"
    ">12.8 GiB CACHE_RAM floor does not apply"). Always: under half the host."""
    if shape.cache_ram is None:
        return []
    cache_ram = shape.cache_ram
    holds = cache_ram >= per_slot_state or not recurrent
    verdicts = [
        Verdict(
            "cache_ram_holds_slot",
            holds,
            f"--cache-ram {cache_ram / MIB:,.0f} MiB "
            + (
                f"is a chosen size: the full-slot rule is for recurrent hybrids (one slot's state {per_slot_state / MIB:,.1f} MiB)"
                if not recurrent
                else ("holds" if holds else "cannot hold") + f" one full slot's state ({per_slot_state / MIB:,.1f} MiB)"
            ),
            "host",
            "cache_ram",
            None if holds else round((per_slot_state - cache_ram) / MIB, 1),
        )
    ]
    if shape.host_ram is not None:
        under = cache_ram <= shape.host_ram // 2
        verdicts.append(
            Verdict(
                "cache_ram_half_host",
                under,
                f"--cache-ram {cache_ram / MIB:,.0f} MiB " + ("<=" if under else ">") + f" half the host RAM ({shape.host_ram / 2 / MIB:,.0f} MiB)",
                "host",
                "cache_ram",
                None if under else round((cache_ram - shape.host_ram / 2) / MIB, 1),
            )
        )
    return verdicts


def _llamacpp_basis(kv: kv_law.LlamaCppKv, boots: list[dict[str, Any]], key: str, shape: LlamaCppShape, notes: list[str]) -> dict[str, Any]:
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


def _projector_bytes(shape: LlamaCppShape, payload: _Payload) -> int:
    path = payload.path(shape.projector)
    if path:
        return payload.loader(path).tensor_bytes()
    if shape.projector and shape.projector_bytes is None:
        raise ShapeError("projector: its size comes from its GGUF; price where the payload is, or give projector_bytes")
    return shape.projector_bytes or 0


def _add_extra(devices: list[DeviceLedger], extra: Any, index: int) -> None:
    if not isinstance(extra, dict) or "name" not in extra or "size" not in extra:
        raise ShapeError(f"extra_terms[{index}]: give name, size and optionally device")
    size = parse_bytes(extra["size"], f"extra_terms[{index}].size")
    target = extra.get("device")
    chosen = [d for d in devices if target in (None, "all", d.name)]
    if not chosen:
        raise ShapeError(f"extra_terms[{index}].device: no device named {target!r}")
    for device in chosen:
        device.add(str(extra["name"]), size, "declared")


def _client(shape: Shape) -> tuple[dict[str, Any], list[Verdict]]:
    ceiling = engine_ceiling(shape)
    try:
        window = client_window(ceiling, shape.client_gap, shape.client_max_tokens)
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


def _calibrations(shape: VllmShape) -> list[kv_law.VllmCalibration]:
    out = []
    for index, point in enumerate(shape.calibration):
        field_name = f"calibration[{index}]"
        if not isinstance(point, dict):
            raise ShapeError(f"{field_name}: expected a mapping with kv_dtype, max_model_len, pool_bytes, tokens")
        missing = [key for key in ("max_model_len", "pool_bytes", "tokens") if point.get(key) is None]
        if missing:
            raise ShapeError(f"{field_name}: kv_dtype, max_model_len, pool_bytes and tokens are all required (missing {', '.join(missing)})")
        out.append(
            kv_law.VllmCalibration(
                str(point.get("kv_dtype", "auto")),
                parse_int(point["max_model_len"], f"{field_name}.max_model_len", 1, 1 << 24),
                parse_bytes(point["pool_bytes"], f"{field_name}.pool_bytes"),
                parse_int(point["tokens"], f"{field_name}.tokens", 1, 1 << 40),
                str(point.get("source", "")),
            )
        )
    return out


def _price_vllm(shape: VllmShape, devices: list[DeviceLedger], payload: _Payload, boots: list[dict[str, Any]]) -> BudgetResult:
    tp = shape.tensor_parallel
    if tp != len(devices):
        raise ShapeError(f"tensor_parallel: {tp}, but {len(devices)} devices are listed (one rank per device)")
    max_len = shape.max_model_len
    try:
        kv_law.normalise_vllm_dtype(shape.kv_cache_dtype)
    except kv_law.KvLawError as exc:
        raise ShapeError(str(exc)) from None

    weights = shape.weights_per_rank
    if weights is None:
        weights = (shape.weights // tp) if shape.weights is not None else 0
    pool = shape.kv_cache_memory_bytes
    graphs = shape.graph_memory
    if graphs is None:
        graphs = GRAPH_BASE_BYTES + GRAPH_PER_CAPTURE_BYTES * shape.graph_captures if shape.graph_captures else 0
    non_torch, arena = shape.non_torch_memory, shape.expert_arena
    overhead = expert_arena.shape_overhead(shape)
    notes: list[str] = []
    arena_facts: dict[str, Any] = {}
    for device in devices:
        budget = int(device.capacity * shape.gpu_memory_utilization)
        plan = None
        if shape.expert_offload and arena is None and overhead:
            plan = expert_arena.plan_arena(
                budget=budget,
                non_expert=weights,
                graphs=graphs,
                overhead=overhead,
                max_model_len=max_len,
                reserve_per_token=shape.kv_reserve_per_token,
                slot_bytes=shape.expert_slot_bytes,
                calibration=expert_arena.arena_calibration_from(shape.expert_arena_calibration),
                capacity=device.capacity,
                utilization=shape.gpu_memory_utilization,
            )
        device_arena = plan.arena_bytes if plan is not None else (arena or 0)
        device_pool = pool if pool is not None else max(budget - weights - graphs - overhead - device_arena, 0)
        device.add("weights", weights)
        device.add("kv_pool", device_pool, "--kv-cache-memory-bytes" if pool is not None else "what the utilization budget leaves")
        device.add("graphs", graphs)
        if plan is not None:
            # The planner's overhead is a reservation inside its plan, not memory the card holds
            # (seeds/000: "weights 6.28 + pool 6.80 + graphs 0.55 + arena 16.65 + non-torch 1.45 = 31.73").
            arena_note = f"max_model_len x {shape.kv_reserve_per_token} B reserve, overhead {overhead / GIB:.2f} GiB ({plan.basis})"
            device.add("expert_arena", plan.arena_bytes, arena_note)
            arena_facts = {
                "arena_bytes": plan.arena_bytes,
                "arena_gib": round(plan.arena_bytes / GIB, 2),
                "arena_slots": plan.slots,
                "planner_overhead_bytes": overhead,
                "kv_reserve_bytes": plan.reserve,
                "arena_basis": plan.basis,
            }
            if plan.note not in notes:
                notes.append(plan.note)
        else:
            device.add("runtime_overhead", overhead)
            if shape.expert_offload or arena is not None:
                # No planner overhead to size the arena by: the arena takes what remains of the
                # utilization budget (an upper bound); vLLM counts non-torch memory inside it.
                remainder = max(budget - weights - device_pool - graphs - overhead - non_torch, 0)
                device.add("expert_arena", arena if arena is not None else remainder, "declared" if arena is not None else "remainder of the budget")
                if arena is None and "expert arena: no runtime_overhead, so the remainder of the budget (an upper bound)" not in notes:
                    notes.append("expert arena: no runtime_overhead, so the remainder of the budget (an upper bound)")
        device.add("non_torch", non_torch)
    for index, extra in enumerate(shape.extra_terms):
        _add_extra(devices, extra, index)

    pool_bytes = sum(t.bytes for t in devices[0].terms if t.name == "kv_pool")
    geometry = payload.geometry(shape.model_geometry, shape.model_file, "model")
    try:
        key = calibration.geometry_key(shape, geometry)
        kv = kv_law.vllm_kv(pool_bytes, max_len, shape.kv_cache_dtype, _calibrations(shape) + calibration.vllm_points(boots, key), geometry, tp)
    except kv_law.KvLawError as exc:
        raise ShapeError(str(exc)) from None
    if kv.basis != "measured":
        notes.append(kv.note)
    # vLLM's pool law is one-sided: the pool must hold one max_model_len, and may hold more than
    # max_num_seqs x max_model_len (seeds/000: 3 x 262,144 fp8 at 6.1e9 B served 792,069 tokens,
    # 3.02x). The two-sided ctx <= pool <= slots x ctx law is another engine's (halogen).
    pool_ok = kv.tokens >= max_len
    short_mib = round((max_len - kv.tokens) * kv.bytes_per_token / MIB, 1)
    verdicts = [
        Verdict(
            "pool_law",
            pool_ok,
            f"pool {kv.tokens:,} tokens ({kv.basis}), concurrency {kv.concurrency:.2f}x: "
            + (f"holds at least one max_model_len ({max_len:,})" if pool_ok else f"must hold one max_model_len ({max_len:,}): short by {short_mib:,.1f} MiB"),
            None if pool_ok else devices[0].name,
            None if pool_ok else "kv_pool",
            None if pool_ok else short_mib,
        )
    ]
    verdicts.extend(_capacity_verdicts(devices, shape.free_floor, shape.max_device_gap))
    verdicts.extend(rules.judge(shape, devices, geometry, payload.path(shape.model_file), notes))
    client, client_verdicts = _client(shape)
    verdicts.extend(client_verdicts)
    spec = calibration.geometry_spec(geometry) if geometry is not None else None
    return BudgetResult("vllm", devices, {**kv.as_dict(), **arena_facts}, client, verdicts, [], notes, key, spec)


def price_shape(
    shape: Shape | Any,
    devices: Any,
    payload_dir: str | None = None,
    loader: Callable[[str], GGUFHeader] = read_model,
    boots: list[dict[str, Any]] | None = None,
) -> BudgetResult:
    """Price a shape (typed, or a mapping parsed here) on every device and judge it. Raises
    ShapeError on malformed input.

    devices: [{name, memory}], one per GPU rank or the host. payload_dir: where the payload is
    readable on this machine (the model's header or config, the projector, the drafter); without
    it the shape's explicit geometries and sizes stand in. boots: stored boot ledgers
    (calibration.load_boots); those of this shape's geometry are what the KV figure rests on."""
    typed = parse_shape(shape)
    ledgers = devices_from(devices)
    payload = _Payload(payload_dir, loader)
    try:
        if isinstance(typed, LlamaCppShape):
            return _price_llamacpp(typed, ledgers, payload, list(boots or []))
        return _price_vllm(typed, ledgers, payload, list(boots or []))  # type: ignore[arg-type]
    except (SizeError, kv_law.KvLawError) as exc:
        raise ShapeError(str(exc)) from None
