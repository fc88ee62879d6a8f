# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The per-device ledger: price a shape on every device before deploy, and judge it.

A shape is a plain dict, as an inventory holds it (see docs/vram_budget.md). price_shape() returns
every device's named terms, the KV figures, the client window and each rule's verdict; `fits` is
false when any rule fails, and the failures name the device, the term and the overage in MiB.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils import calibration, kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.client_contract import client_window
from ansible_collections.frank.llm_fleet.plugins.module_utils.gguf_header import GGUFHeader, read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB, SizeError, parse_size

GRAPH_BASE_BYTES = 256 * MIB  # vLLM's own graph-memory estimate: 256 MiB + 52 MiB per captured graph
GRAPH_PER_CAPTURE_BYTES = 52 * MIB
DEFAULT_FREE_FLOOR = "1.5 GiB"
DEFAULT_MAX_GAP = "0.5 GiB"


class ShapeError(ValueError):
    """A shape field that is missing, of the wrong kind or out of range."""


@dataclass
class Term:
    name: str
    bytes: int
    note: str = ""


@dataclass
class DeviceLedger:
    name: str
    capacity: int
    terms: list[Term] = field(default_factory=list)

    def add(self, name: str, size: int, note: str = "") -> None:
        if size:
            self.terms.append(Term(name, int(size), note))

    @property
    def used(self) -> int:
        return sum(term.bytes for term in self.terms)

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def crossing_term(self) -> Term | None:
        """The term at which the running total first passes the capacity."""
        running = 0
        for term in self.terms:
            running += term.bytes
            if running > self.capacity:
                return term
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.name,
            "capacity_bytes": self.capacity,
            "used_bytes": self.used,
            "free_bytes": self.free,
            "terms": [{"name": t.name, "bytes": t.bytes, "mib": round(t.bytes / MIB, 2), **({"note": t.note} if t.note else {})} for t in self.terms],
        }


@dataclass
class Verdict:
    rule: str
    ok: bool
    message: str
    device: str | None = None
    term: str | None = None
    overage_mib: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "ok": self.ok, "message": self.message}
        for key in ("device", "term", "overage_mib"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass
class BudgetResult:
    runtime: str
    devices: list[DeviceLedger]
    kv: dict[str, Any]
    client: dict[str, Any]
    verdicts: list[Verdict]
    host_terms: list[Term] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    geometry_key: str = ""
    model_geometry: dict[str, Any] | None = None  # the explicit form, for stored boots

    @property
    def fits(self) -> bool:
        return all(v.ok for v in self.verdicts)

    @property
    def failures(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.ok]

    def as_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "fits": self.fits,
            "ledger": [d.as_dict() for d in self.devices],
            "host_terms": [{"name": t.name, "bytes": t.bytes} for t in self.host_terms],
            "kv": self.kv,
            "client": self.client,
            "rules": [v.as_dict() for v in self.verdicts],
            "notes": self.notes,
            "geometry_key": self.geometry_key,
            "model_geometry": self.model_geometry,
        }


# --- shape field helpers: every error names the field -----------------------------------------


def _size(shape: dict[str, Any], key: str, default: Any = None) -> int | None:
    value = shape.get(key, default)
    if value is None:
        return None
    try:
        return parse_size(value, key)
    except SizeError as exc:
        raise ShapeError(str(exc)) from None


def _int(shape: dict[str, Any], key: str, default: int | None = None, minimum: int = 0) -> int | None:
    value = shape.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ShapeError(f"{key}: expected a whole number, got {value!r}")
    try:
        number = int(str(value).replace(",", "").replace("_", ""))
    except ValueError:
        raise ShapeError(f"{key}: expected a whole number, got {value!r}") from None
    if number < minimum:
        raise ShapeError(f"{key}: must be at least {minimum}, got {number}")
    return number


def _float(shape: dict[str, Any], key: str, default: float | None = None) -> float | None:
    value = shape.get(key, default)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ShapeError(f"{key}: expected a number, got {value!r}") from None


def _devices(shape: dict[str, Any]) -> list[DeviceLedger]:
    devices = shape.get("devices")
    if not devices or not isinstance(devices, list):
        raise ShapeError("devices: give at least one device, e.g. [{name: cuda0, memory: '24,576 MiB'}]")
    out = []
    for index, device in enumerate(devices):
        if not isinstance(device, dict) or "memory" not in device:
            raise ShapeError(f"devices[{index}]: each device needs a name and a memory size")
        try:
            capacity = parse_size(device["memory"], f"devices[{index}].memory")
        except SizeError as exc:
            raise ShapeError(str(exc)) from None
        if capacity <= 0:
            raise ShapeError(f"devices[{index}].memory: must be positive")
        out.append(DeviceLedger(str(device.get("name", f"dev{index}")), capacity))
    return out


def _load_geometry(shape: dict[str, Any], key: str, loader: Callable[[str], GGUFHeader]) -> kv_law.ModelGeometry | None:
    """A model geometry from a GGUF path or a Hugging Face model directory (`key`), or an explicit
    `<key>_geometry` dict."""
    explicit = shape.get(f"{key}_geometry")
    if explicit:
        return geometry_from_dict(explicit, f"{key}_geometry")
    path = shape.get(key)
    if not path:
        return None
    config = os.path.join(str(path), "config.json") if os.path.isdir(str(path)) else str(path)
    if config.endswith(".json"):
        # A Hugging Face model directory (vLLM): the geometry is in its config.
        try:
            with open(config, encoding="utf-8") as handle:
                return kv_law.geometry_from_hf_config(json.load(handle), config)
        except (OSError, ValueError) as exc:
            raise ShapeError(f"{key}: cannot read the model's config {config}: {exc}") from None
    return kv_law.geometry_from_header(loader(str(path)))


def geometry_from_dict(spec: dict[str, Any], field_name: str = "geometry") -> kv_law.ModelGeometry:
    """Explicit geometry, for shapes whose payload is not on the controller.

    Keys: n_layer, n_head_kv (int or per-layer list), head_dim (or head_dim_k/head_dim_v),
    layer_kinds (list of full|swa|recurrent, optional), sliding_window, recurrent_state_bytes,
    layer_bytes (per layer size or list), output_bytes, input_bytes.
    """
    n_layer = _int(spec, "n_layer", minimum=1)
    if n_layer is None:
        raise ShapeError(f"{field_name}.n_layer: required")
    heads = spec.get("n_head_kv")
    if heads is None:
        raise ShapeError(f"{field_name}.n_head_kv: required")
    heads_list = heads if isinstance(heads, list) else [heads] * n_layer
    if len(heads_list) != n_layer:
        raise ShapeError(f"{field_name}.n_head_kv: {len(heads_list)} values for {n_layer} layers")
    dim_k = _int(spec, "head_dim_k", spec.get("head_dim"), minimum=1)
    dim_v = _int(spec, "head_dim_v", spec.get("head_dim"), minimum=1)
    if dim_k is None or dim_v is None:
        raise ShapeError(f"{field_name}.head_dim: required")
    kinds = spec.get("layer_kinds") or ["full"] * n_layer
    if len(kinds) != n_layer or any(k not in ("full", "swa", "recurrent") for k in kinds):
        raise ShapeError(f"{field_name}.layer_kinds: give {n_layer} values, each full, swa or recurrent")
    state = _size(spec, "recurrent_state_bytes", 0) or 0
    layers = [
        kv_law.LayerKV("recurrent", recurrent_state_bytes=state)
        if kind == "recurrent"
        else kv_law.LayerKV(kind, int(heads_list[il]), dim_k, dim_v, bool(spec.get("k_eq_v", False)))
        for il, kind in enumerate(kinds)
    ]
    layer_bytes_spec = spec.get("layer_bytes", 0)
    if isinstance(layer_bytes_spec, list):
        if len(layer_bytes_spec) != n_layer:
            raise ShapeError(f"{field_name}.layer_bytes: {len(layer_bytes_spec)} values for {n_layer} layers")
        layer_bytes = {il: parse_size(v, f"{field_name}.layer_bytes[{il}]") for il, v in enumerate(layer_bytes_spec)}
    else:
        each = parse_size(layer_bytes_spec, f"{field_name}.layer_bytes")
        layer_bytes = dict.fromkeys(range(n_layer), each)
    return kv_law.ModelGeometry(
        architecture=str(spec.get("architecture", "explicit")),
        layers=layers,
        sliding_window=_int(spec, "sliding_window", 0) or 0,
        layer_weight_bytes=layer_bytes,
        input_weight_bytes=_size(spec, "input_bytes", 0) or 0,
        output_weight_bytes=_size(spec, "output_bytes", 0) or 0,
    )


# --- layer placement --------------------------------------------------------------------------


def assign_layers(n_layer: int, n_devices: int, tensor_split: list[float] | None) -> list[int]:
    """Device index per layer, plus one entry for the output layer (index n_layer).

    llama.cpp's rule: normalised cumulative split fractions; layer il goes to the first device
    whose cumulative share exceeds il / (n_layer + 1). Whole layers move, never parts.
    """
    split = tensor_split or [1.0] * n_devices
    if len(split) != n_devices:
        raise ShapeError(f"tensor_split: {len(split)} values for {n_devices} devices")
    if any(s < 0 for s in split) or sum(split) <= 0:
        raise ShapeError("tensor_split: values must be non-negative and not all zero")
    if n_devices == 1:
        return [0] * (n_layer + 1)
    total = float(sum(split))
    cumulative = []
    running = 0.0
    for share in split:
        running += share
        cumulative.append(running / total)
    n_offload = n_layer + 1
    return [min(bisect.bisect_right(cumulative, il / n_offload), n_devices - 1) for il in range(n_layer + 1)]


# --- rules shared by both runtimes ------------------------------------------------------------


def _capacity_verdicts(devices: list[DeviceLedger], floor: int, max_gap: int | None) -> list[Verdict]:
    verdicts = []
    for device in devices:
        crossing = device.crossing_term()
        if crossing is not None:
            over = -device.free / MIB
            verdicts.append(
                Verdict(
                    "fits",
                    False,
                    f"{device.name}: {device.used / MIB:,.1f} MiB needed of {device.capacity / MIB:,.1f} MiB: "
                    f"over by {over:,.1f} MiB at term '{crossing.name}' ({crossing.bytes / MIB:,.1f} MiB)",
                    device.name,
                    crossing.name,
                    round(over, 1),
                )
            )
            continue
        verdicts.append(Verdict("fits", True, f"{device.name}: {device.used / MIB:,.1f} of {device.capacity / MIB:,.1f} MiB", device.name))
        if device.free < floor:
            short = (floor - device.free) / MIB
            largest = max(device.terms, key=lambda t: t.bytes)
            verdicts.append(
                Verdict(
                    "free_floor",
                    False,
                    f"{device.name}: {device.free / MIB:,.1f} MiB free, below the floor of {floor / MIB:,.1f} MiB by {short:,.1f} MiB "
                    f"(largest term '{largest.name}', {largest.bytes / MIB:,.1f} MiB)",
                    device.name,
                    largest.name,
                    round(short, 1),
                )
            )
        else:
            verdicts.append(Verdict("free_floor", True, f"{device.name}: {device.free / MIB:,.1f} MiB free >= floor {floor / MIB:,.1f} MiB", device.name))
    if max_gap is not None and len(devices) > 1:
        ranked = sorted(devices, key=lambda d: d.used)
        low, high = ranked[0], ranked[-1]
        gap = high.used - low.used
        ok = gap <= max_gap
        verdicts.append(
            Verdict(
                "device_gap",
                ok,
                f"{high.name} uses {gap / MIB:,.1f} MiB more than {low.name} (limit {max_gap / MIB:,.1f} MiB)" + ("" if ok else ": rebalance tensor_split"),
                None if ok else high.name,
                None,
                None if ok else round((gap - max_gap) / MIB, 1),
            )
        )
    return verdicts


def slot_ceiling(boots: list[dict[str, Any]], capacity: int, floor: int) -> tuple[int, int, int]:
    """From two measured boots (slots, used): fixed cost, per-slot cost and the largest slot count that fits."""
    if len(boots) < 2:
        raise ShapeError("slot_calibration.boots: give two measured boots with different slot counts")
    (s1, u1), (s2, u2) = ((_int(b, "slots", minimum=1), parse_size(b.get("used"), "slot_calibration.boots[].used")) for b in boots[:2])
    if s1 is None or s2 is None:
        raise ShapeError("slot_calibration.boots[].slots: required")
    if s1 == s2:
        raise ShapeError("slot_calibration.boots: the two boots must differ in slot count")
    per_slot = (u2 - u1) // (s2 - s1)
    fixed = u1 - s1 * per_slot
    if per_slot <= 0:
        raise ShapeError("slot_calibration.boots: more slots must use more memory")
    return fixed, per_slot, max((capacity - floor - fixed) // per_slot, 0)


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


def render_table(result: BudgetResult) -> str:
    """The ledger as a plain-text table, one column per device."""
    names = []
    for device in result.devices:
        for term in device.terms:
            if term.name not in names:
                names.append(term.name)
    header = ["term"] + [d.name for d in result.devices]
    rows = []
    for name in names:
        row = [name]
        for device in result.devices:
            size = sum(t.bytes for t in device.terms if t.name == name)
            row.append(f"{size / MIB:,.1f}" if size else "-")
        rows.append(row)
    rows.append(["used"] + [f"{d.used / MIB:,.1f}" for d in result.devices])
    rows.append(["capacity"] + [f"{d.capacity / MIB:,.1f}" for d in result.devices])
    rows.append(["free"] + [f"{d.free / MIB:,.1f}" for d in result.devices])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))) + "   (MiB)"]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        if row[0] == "used":
            lines.append("  ".join("-" * w for w in widths))
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    lines.append("")
    for verdict in result.verdicts:
        lines.append(f"[{'ok' if verdict.ok else 'FAIL'}] {verdict.rule}: {verdict.message}")
    for note in result.notes:
        lines.append(f"note: {note}")
    lines.append(f"fits: {'yes' if result.fits else 'NO'}")
    return "\n".join(lines)
