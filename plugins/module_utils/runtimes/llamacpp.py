# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llama.cpp runtime: `llama-server`, its shape keys, argv, ledger, boot lines and metrics.

Rules kept here so no inventory can forget them:
- the argv always carries `--metrics` (else /metrics answers 501) and `--alias` (the served id);
  speculation uses the b11030-era flags the fleet ran (`--spec-type`, `--model-draft`,
  `--spec-draft-n-max`); `--override-tensor` patterns are joined into ONE flag, most specific
  (longest) first, because llama.cpp applies the first match and a broad pattern first would
  swallow the specific ones;
- the ledger: weights per device by the layer split and the override patterns (budget/placement.py),
  KV by the exact law (budget/kv_law.py `llamacpp_kv`), the projector and the drafter from their
  own headers, the prompt cache in host RAM;
- the boot lines: `llama_kv_cache: size = ...`, `<dev> model|KV|compute|output|RS buffer size`,
  and the exit `memory breakdown [MiB]` table.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import calibration, graph_law, kv_law, placement, rules
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import SPLIT_NAME_RE
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import (
    BudgetResult,
    DeviceLedger,
    Term,
    Verdict,
    _capacity_verdicts,
    slot_ceiling,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.placement import HOST, assign_layers
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.pricing import PayloadReader, add_extra_terms, client_verdicts
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.identity import PayloadName
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.base import AlertRule, Panel, RefusalContract, Runtime, json_flag, serving
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.boot_ledger import SIZE, BootLedger, LlamaCppKvLine
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import (
    MAX_LAYERS,
    MAX_SLOTS,
    MAX_TOKENS,
    Shape,
    ShapeError,
    key,
    override_tensor_order,
    resolve_path,
    spec_chain,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB, parse_size

NAME = "llamacpp"

# --- the shape ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaCppShape(Shape):
    """llama.cpp `llama-server`."""

    ctx_size: int = key("int", "llama.cpp --ctx-size: the pool, divided into --parallel windows.", required=True, minimum=1, maximum=MAX_TOKENS)
    parallel: int = key("int", "llama.cpp --parallel (slots); each gets ctx_size / parallel positions.", default=1, minimum=1, maximum=MAX_SLOTS)
    type_k: str = key("str", "llama.cpp K cache type (f16, q8_0, q4_0, ...).", default="f16")
    type_v: str | None = key("str", "llama.cpp V cache type (default: type_k).")
    kv_unified: bool = key("bool", "llama.cpp --kv-unified (one pool shared by all slots).", default=False)
    swa_full: bool = key("bool", "llama.cpp --swa-full (full-size sliding-window caches).", default=False)
    batch: int | None = key("int", "llama.cpp --batch-size.", minimum=1, maximum=1 << 20)
    ubatch: int = key("int", "llama.cpp --ubatch-size (compute buffers scale with it).", default=512, minimum=1, maximum=1 << 16)
    n_gpu_layers: int = key("int", "llama.cpp --n-gpu-layers: the last N layers go to the devices.", default=999, maximum=MAX_LAYERS)
    tensor_split: tuple[float, ...] | None = key("split", "llama.cpp --tensor-split, a list of shares or 'a,b' (whole layers move).")
    override_tensor: tuple[tuple[str, str], ...] | None = key(
        "overrides", "llama.cpp --override-tensor, a mapping pattern -> buffer (most specific pattern first in the flag)."
    )
    projector: str | None = key("str", "llama.cpp --mmproj: the vision projector, relative to the payload directory.")
    projector_bytes: int | None = key("size", "Budget - the projector's size, when its GGUF is not readable where the budget runs.", group="budget")
    drafter: str | None = key("str", "llama.cpp --model-draft: the drafter GGUF, relative to the payload directory (its own header sizes its KV).")
    drafter_geometry: Mapping[str, Any] | None = key("mapping", "Budget - the drafter's geometry, when its header is not readable.", group="budget")
    drafter_type_k: str | None = key(
        "str",
        "llama.cpp --cache-type-k-draft: KV cache data type for K for the draft model (the --model-draft drafter or the in-file MTP "
        "context): f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1; the engine's default is f16 whatever type_k is.",
    )
    drafter_type_v: str | None = key(
        "str",
        "llama.cpp --cache-type-v-draft: KV cache data type for V for the draft model (the --model-draft drafter or the in-file MTP "
        "context): f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1; the engine's default is f16 whatever type_v is.",
    )
    spec_type: str | None = key(
        "str",
        "llama.cpp --spec-type, e.g. draft-mtp,ngram-mod: at most ONE draft-* type; ngram-* are draftless.",
    )
    draft_max: int | None = key("int", "llama.cpp --spec-draft-n-max (draft depth; b11030-era flag).", minimum=1, maximum=64)
    drafter_block_size: int | None = key(
        "int",
        "The drafter's block size (DFlash2 8, DSpark 7): draft_max <= block size - 1. Not a flag.",
        minimum=2,
        maximum=64,
    )
    draft_device: str | None = key("str", "llama.cpp --device-draft: the device the drafter runs on (ROCm1, CUDA0).")
    drafter_borrows_output: bool = key(
        "bool",
        "The drafter borrows the target's output head (a shared MTP head): with override_tensor it must run on the output layer's device. Not a flag.",
        default=False,
    )
    cache_ram: int | None = key("size", "llama.cpp --cache-ram: the prompt cache in host RAM, as a size.")
    host_ram: int | None = key("size", "Budget - the host's RAM, for the prompt-cache law.", group="budget")
    jinja: bool = key("bool", "llama.cpp --jinja (the model's chat template).", default=True)
    chat_template_file: str | None = key("str", "llama.cpp --chat-template-file, relative to the payload directory.")
    reasoning_format: str | None = key("str", "llama.cpp --reasoning-format (e.g. deepseek: reasoning lands in reasoning_content).")
    flash_attn: bool | None = key("bool", "llama.cpp --flash-attn: true renders 'on', false 'off'; unset leaves the build's auto.")
    log_verbosity: int | None = key(
        "int", "llama.cpp --log-verbosity (-lv); 4 prints the per-buffer load ledger (KV, compute, projector) a boot record needs.", maximum=10
    )
    compute_buffer: int | tuple[int, ...] | None = key(
        "sizes", "Budget - compute buffers, one size or one per device (they scale with ubatch).", group="budget"
    )
    slot_calibration: Mapping[str, Any] | None = key("mapping", "Budget - two measured boots {boots: [{slots, used}, ...]}: the slot ceiling.", group="budget")

    @property
    def slots(self) -> int:
        return self.parallel

    @property
    def cache_type_v(self) -> str:
        return self.type_v or self.type_k

    @property
    def kv_dtypes(self) -> tuple[str, ...]:
        return (self.type_k, self.cache_type_v)

    RUNTIME: ClassVar[str] = NAME
    # llama-server reads `_` as `-` in a `--` flag's name (no `=` form, no prefixes); -hft is --hf-token.
    CREDENTIAL_FLAGS: ClassVar[tuple[str, ...]] = ("--api-key", "--api_key", "--hf-token", "--hf_token", "-hft")
    ADDRESS_FLAGS: ClassVar[tuple[str, ...]] = ("--host", "--port")
    FLAG_UNDERSCORES: ClassVar[bool] = True
    FLAG_PREFIXES: ClassVar[bool] = False
    LAYOUT_KEYS: ClassVar[tuple[str, ...]] = ("ctx_size", "parallel", "kv_unified", "ubatch", "swa_full")
    KV_DTYPE_FIELD: ClassVar[str] = "type_k/type_v"

    @property
    def request_ceiling(self) -> int:
        # llama.cpp pads the context and divides it over the slots (unless they share one pool).
        return kv_law.llamacpp_per_slot_window(self.ctx_size, self.parallel, self.kv_unified)

    @property
    def request_window(self) -> int:
        return self.ctx_size if self.kv_unified else self.ctx_size // self.parallel

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        # An illegal cache type is refused with the shape, not first by the budget or the engine.
        for name in ("type_k", "type_v", "drafter_type_k", "drafter_type_v"):
            if values.get(name) is not None and str(values[name]).lower() not in kv_law.LLAMACPP_KV_TYPES:
                raise ShapeError(f"{name}: unknown cache type {values[name]!r}; expected one of {', '.join(kv_law.LLAMACPP_KV_TYPES)}")
        _check_speculation(values)


# The engine's spellings of the draft cache types (common/arg.cpp; `llama-server --help`:
# "--spec-draft-type-k, -ctkd, --cache-type-k-draft TYPE").
DRAFT_CACHE_FLAGS = {
    "drafter_type_k": ("--cache-type-k-draft", "-ctkd", "--spec-draft-type-k"),
    "drafter_type_v": ("--cache-type-v-draft", "-ctvd", "--spec-draft-type-v"),
}


def _check_speculation(values: dict[str, Any]) -> None:
    """llama.cpp speculation: one draft context per process, and a depth the drafter can hold."""
    chain = spec_chain(values.get("spec_type"))
    for part in chain:
        if not (part.startswith("draft-") or part.startswith("ngram-")):
            raise ShapeError(
                f"spec_type: {part!r} is not a speculative type; use draft-* (model-backed, e.g. draft-mtp) or ngram-* (draftless, e.g. ngram-mod)"
            )
    drafters = [part for part in chain if part.startswith("draft-")]
    if len(drafters) > 1:
        # 'spec-type draft-mtp,draft-dflash' dies at load: the chain has ONE draft context.
        raise ShapeError(
            f"spec_type: {','.join(drafters)} chains {len(drafters)} model-backed drafters, but a chain has ONE draft context; "
            "keep one draft-* type (ngram-* types are draftless and may chain behind it)"
        )
    depth = values.get("draft_max")
    if depth is not None and not drafters and not values.get("drafter"):
        raise ShapeError("draft_max: sets the draft depth of a model-backed drafter; add spec_type (e.g. draft-mtp) or remove draft_max")
    for field, spellings in DRAFT_CACHE_FLAGS.items():
        for arg in values.get("extra_args") or ():
            flag = str(arg).split("=", 1)[0].replace("_", "-")
            if flag in spellings:
                raise ShapeError(f"extra_args: {arg} sets the draft context's cache type, which the budget prices from {field} only; set {field} instead")
        if values.get(field) is not None and not drafters and not values.get("drafter"):
            raise ShapeError(f"{field}: sets the draft context's cache type; add spec_type (e.g. draft-mtp) or drafter, or remove {field}")
    block = values.get("drafter_block_size")
    if block is not None and depth is not None and depth > block - 1:
        raise ShapeError(f"draft_max: {depth} exceeds drafter_block_size {block} - 1; llama.cpp asserts n_max <= block_size - 1: use at most {block - 1}")


# --- argv ----------------------------------------------------------------------------------------


def override_tensor_flag(pairs: tuple[tuple[str, str], ...]) -> str:
    """`pattern=buffer` pairs joined with commas, in the order llama.cpp applies them."""
    return ",".join(f"{pattern}={buffer}" for pattern, buffer in override_tensor_order(pairs))


def llamacpp_argv(shape: LlamaCppShape, model_root: str = "", binary: str = "/usr/bin/llama-server") -> list[str]:
    model, served_id, port = serving(shape, model_root)
    argv = [binary, "--model", model, "--alias", served_id, "--host", shape.bind, "--port", port]
    argv += ["--ctx-size", str(shape.ctx_size), "--parallel", str(shape.parallel)]
    argv += ["--cache-type-k", shape.type_k, "--cache-type-v", shape.cache_type_v]
    if shape.flash_attn is not None:
        argv += ["--flash-attn", "on" if shape.flash_attn else "off"]
    if shape.kv_unified:
        argv.append("--kv-unified")
    if shape.swa_full:
        argv.append("--swa-full")
    argv += ["--n-gpu-layers", str(shape.n_gpu_layers)]
    if shape.tensor_split:
        argv += ["--tensor-split", ",".join(f"{share:g}" for share in shape.tensor_split)]
    if shape.batch:
        argv += ["--batch-size", str(shape.batch)]
    argv += ["--ubatch-size", str(shape.ubatch)]  # explicit: the budget priced this value
    if shape.override_tensor:
        argv += ["--override-tensor", override_tensor_flag(shape.override_tensor)]
    if shape.projector:
        argv += ["--mmproj", str(resolve_path(shape.projector, model_root))]
    if shape.spec_type:
        argv += ["--spec-type", shape.spec_type]
    if shape.drafter:
        argv += ["--model-draft", str(resolve_path(shape.drafter, model_root))]
    if shape.draft_max:
        argv += ["--spec-draft-n-max", str(shape.draft_max)]
    if shape.draft_device:
        argv += ["--device-draft", shape.draft_device]
    # The draft context's cache types are flags of their own: the budget prices what is rendered
    # here, and the engine's f16 default where nothing is.
    if shape.drafter_type_k:
        argv += ["--cache-type-k-draft", shape.drafter_type_k]
    if shape.drafter_type_v:
        argv += ["--cache-type-v-draft", shape.drafter_type_v]

    if shape.cache_ram is not None:
        argv += ["--cache-ram", str(shape.cache_ram >> 20)]  # MiB
    if shape.jinja:
        argv.append("--jinja")
    if shape.chat_template_file:
        argv += ["--chat-template-file", str(resolve_path(shape.chat_template_file, model_root))]
    if shape.chat_template_kwargs:
        argv += ["--chat-template-kwargs", json_flag(shape.chat_template_kwargs)]
    if shape.reasoning_format:
        argv += ["--reasoning-format", shape.reasoning_format]
    if shape.log_verbosity is not None:
        argv += ["--log-verbosity", str(shape.log_verbosity)]
    argv.append("--metrics")  # always: without it /metrics answers 501
    return argv + list(shape.extra_args)


# --- the ledger ----------------------------------------------------------------------------------


def gguf_names(field: str, path: str | None) -> list[PayloadName]:
    """A GGUF the shape names and, for the first part of a split set, every other part llama.cpp
    opens beside it (STEM-0000K-of-0000N.gguf, never concatenated)."""
    if not path:
        return []
    names = [PayloadName(field, path)]
    match = SPLIT_NAME_RE.match(posixpath.basename(path))
    if match and int(match.group("no")) == 1:
        count, folder, stem = int(match.group("count")), posixpath.dirname(path), match.group("stem")
        for no in range(2, count + 1):
            names.append(PayloadName(f"{field} (split part {no} of {count})", posixpath.join(folder, f"{stem}-{no:05d}-of-{count:05d}.gguf")))
    return names


def _price_llamacpp(shape: LlamaCppShape, devices: list[DeviceLedger], payload: PayloadReader, boots: list[dict[str, Any]]) -> BudgetResult:
    geometry = payload.geometry(shape.model_geometry, shape.model_file, "model")
    if geometry is None:
        raise ShapeError("model_file: give the GGUF (first part of a split set) and price where the payload is, or give model_geometry")
    _check_flash_attn(shape)
    batch = graph_law.llamacpp_batch(shape.ctx_size, shape.parallel, shape.batch, shape.ubatch, _n_draft(shape))
    try:
        # The sliding window holds window + n_ubatch cells, n_ubatch as the context caps it (by
        # --batch-size and --ctx-size), not the flag as given.
        kv = kv_law.llamacpp_kv(
            geometry,
            shape.ctx_size,
            shape.parallel,
            shape.type_k,
            shape.cache_type_v,
            unified=shape.kv_unified,
            ubatch=batch.n_ubatch,
            swa_full=shape.swa_full,
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

    host_compute = _compute_terms(shape, devices, geometry, kv, batch, layer_device, notes)

    devices[0].add("projector", _projector_bytes(shape, payload))
    drafter = payload.geometry(shape.drafter_geometry, shape.drafter, "drafter")
    output_bytes = graph_law.output_buffer_bytes(geometry, batch.n_outputs_max)
    if shape.drafter and drafter is None:
        raise ShapeError("drafter: its header sizes its KV; price where the payload is, or give drafter_geometry")
    draft_type_k, draft_type_v = shape.drafter_type_k or DRAFT_CACHE_TYPE, shape.drafter_type_v or DRAFT_CACHE_TYPE
    draft_kv_bytes = 0
    if drafter is None and "draft-mtp" in spec_chain(shape.spec_type):
        draft_kv_bytes, mtp_host_kv = _mtp_draft_terms(shape, geometry, devices, layer_device, draft_type_k, draft_type_v, notes)
        host_kv += mtp_host_kv
        if draft_kv_bytes:
            # The MTP context's logits: n_outputs_max = n_parallel (`cparams_mtp.n_outputs_max`).
            output_bytes += graph_law.output_buffer_bytes(geometry, min(batch.n_batch, shape.parallel))
    if drafter is not None:
        # The draft context's cache types are its own flags, --cache-type-k-draft / -v-draft,
        # default f16 whatever the target's (common/speculative.cpp
        # `common_base_params_to_speculative`: `result.cache_type_k = params_spec.cache_type_k`);
        # it inherits the target's n_ctx, slots, unified flag, swa_full and n_ubatch.
        draft_kv = kv_law.llamacpp_kv(
            drafter,
            shape.ctx_size,
            shape.parallel,
            draft_type_k,
            draft_type_v,
            unified=shape.kv_unified,
            ubatch=batch.n_ubatch,
            swa_full=shape.swa_full,
        )
        # The draft context's logits: n_outputs_max = n_parallel (common_speculative_init_result).
        output_bytes += graph_law.output_buffer_bytes(drafter, min(batch.n_batch, shape.parallel))
        draft_kv_bytes = draft_kv.total_bytes
        devices[last].add("drafter_weights", drafter.weight_bytes)
        window_note = f"window {drafter.sliding_window}" if drafter.sliding_window else "no sliding window: caches the full target window"
        devices[last].add("drafter_kv", draft_kv.total_bytes, window_note)
        notes.append(f"drafter KV sized from the drafter's own header ({window_note}): {draft_kv.total_bytes / MIB:,.1f} MiB")
    add_extra_terms(devices, shape.extra_terms)
    host_terms = [
        Term(name, size)
        for name, size in (
            ("input_embeddings", input_weights),
            ("host_layers", host_weights),
            ("override_tensor_weights", overrides.to_host if overrides is not None else 0),
            ("host_kv", host_kv),
            ("output_buffer", output_bytes),
            ("host_compute", host_compute),
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

    state_per_token = kv_law.prompt_state_per_token(geometry, kv, draft_type_k, draft_type_v)
    per_slot_state = kv.total_bytes // kv.n_streams + (state_per_token - kv.bytes_per_token_full) * kv.cells_per_stream
    verdicts.extend(_cache_ram_verdicts(shape, per_slot_state, geometry.has_recurrent))
    verdicts.extend(rules.judge(shape, devices, geometry, payload.path(shape.model_file), notes))
    _draft_depth_note(shape, notes)
    client, client_judged = client_verdicts(shape)
    verdicts.extend(client_judged)
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
    return BudgetResult(NAME, devices, kv_facts, client, verdicts, host_terms, notes, key, calibration.geometry_spec(geometry))


DRAFT_CACHE_TYPE = "f16"  # common/common.h: cache_type_k_draft / cache_type_v_draft default GGML_TYPE_F16


def _mtp_draft_terms(
    shape: LlamaCppShape,
    geometry: kv_law.ModelGeometry,
    devices: list[DeviceLedger],
    layer_device: list[int],
    type_k: str,
    type_v: str,
    notes: list[str],
) -> tuple[int, int]:
    """The in-file MTP draft context's cache (`--spec-type draft-mtp`, no --model-draft): each MTP
    layer's cells at the draft cache types, where the layer is (a device, or host RAM when the layer
    stays there; the last device where a typed geometry does not say which layer it is). Returns
    (bytes billed in all, bytes of them in host RAM)."""
    try:
        per_layer = kv_law.llamacpp_mtp_kv(geometry, shape.ctx_size, shape.parallel, type_k, type_v, unified=shape.kv_unified)
    except kv_law.KvLawError as exc:
        raise ShapeError(str(exc)) from None
    total = host = 0
    for il, size in per_layer:
        device = layer_device[il] if il is not None else len(devices) - 1
        total += size
        if device == HOST:
            host += size
            continue
        devices[device].add("drafter_kv", size, f"in-file MTP layer{'' if il is None else f' {il}'}, {type_k}/{type_v}")
    if per_layer:
        notes.append(f"drafter KV: the in-file MTP context at the draft cache types {type_k}/{type_v} (not the target's): {total / MIB:,.1f} MiB")
    else:
        notes.append("drafter KV: spec_type draft-mtp, but the geometry declares no MTP (nextn) layer: nothing billed")
    return total, host


def _n_draft(shape: LlamaCppShape) -> int:
    """Draft tokens per slot the server sizes its outputs for: --spec-draft-n-max with a
    model-backed speculator (default 3), none without one."""
    if not (shape.drafter or any(part.startswith("draft-") for part in spec_chain(shape.spec_type))):
        return 0
    return shape.draft_max or 3


def _check_flash_attn(shape: LlamaCppShape) -> None:
    """llama.cpp refuses a quantised V cache without flash attention (src/llama-context.cpp,
    `llama_init_from_model`: "quantized V cache requires flash_attn to be enabled")."""
    if shape.flash_attn is False and shape.cache_type_v.lower() not in ("f32", "f16", "bf16"):
        raise ShapeError(
            f"type_v: {shape.cache_type_v} is a quantised V cache, which llama.cpp refuses with flash_attn off "
            "(quantized V cache requires flash_attn to be enabled); turn flash_attn on (or leave it unset: auto) or use f16"
        )


def _compute_terms(
    shape: LlamaCppShape,
    devices: list[DeviceLedger],
    geometry: kv_law.ModelGeometry,
    kv: kv_law.LlamaCppKv,
    batch: graph_law.LlamaCppBatch,
    layer_device: list[int],
    notes: list[str],
) -> int:
    """The compute buffers: the shape's compute_buffer pin where given (one size, or one per
    device), else the graph law on each device that holds layers, and on the host when it computes
    layers itself. Returns the host's term."""
    pinned = shape.compute_buffer
    if isinstance(pinned, tuple):
        if len(pinned) != len(devices):
            raise ShapeError(f"compute_buffer: {len(pinned)} values for {len(devices)} devices")
        for device, size in zip(devices, pinned):
            device.add("compute", size, f"ubatch {shape.ubatch}, pinned")
        return 0
    if pinned is not None:
        for device in devices:
            device.add("compute", pinned, f"ubatch {shape.ubatch}, pinned")
        return 0
    if not geometry.n_embd or not (geometry.n_vocab and (geometry.n_ff or geometry.ssm_d_inner)):
        notes.append("compute: the geometry gives no n_embd, n_vocab and n_ff to size the compute buffer by its law; pin compute_buffer (0 billed)")
        return 0
    flash_attn = shape.flash_attn is not False  # auto resolves on where the device supports it (CPU, CUDA)
    size = graph_law.compute_buffer_bytes(geometry, kv, batch, shape.parallel, flash_attn, shape.type_k, shape.cache_type_v, unified=shape.kv_unified)
    note = f"law: n_ubatch {batch.n_ubatch}, flash attention {'on' if flash_attn else 'off'}"
    for index, device in enumerate(devices):
        if index in layer_device:
            device.add("compute", size, note)
    notes.append(
        f"compute: {size / MIB:,.1f} MiB per device holding layers, by the graph law calibrated on the CPU backend's boots "
        "(extrapolated to GPU devices); pin compute_buffer from a boot's sched_reserve line to override"
    )
    return size if HOST in layer_device[: geometry.n_layer] else 0


def _draft_depth_note(shape: LlamaCppShape, notes: list[str]) -> None:
    if "draft-dflash" in spec_chain(shape.spec_type) and shape.draft_max and not shape.drafter_block_size:
        notes.append(
            f"WARNING: draft_max {shape.draft_max} is unchecked against the drafter's block size (llama.cpp asserts "
            "n_max <= block_size - 1); give drafter_block_size (DFlash2 8, DSpark 7)"
        )


def _override_placement(
    shape: LlamaCppShape, payload: PayloadReader, layer_device: list[int], n_layer: int, n_devices: int, notes: list[str]
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
    exact, layouts = llamacpp_measured(boots, key, shape)
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


def _projector_bytes(shape: LlamaCppShape, payload: PayloadReader) -> int:
    path = payload.path(shape.projector)
    if path:
        return payload.loader(path).tensor_bytes()
    if shape.projector and shape.projector_bytes is None:
        raise ShapeError("projector: its size comes from its GGUF; price where the payload is, or give projector_bytes")
    return shape.projector_bytes or 0


# --- boot lines and calibration -------------------------------------------------------------------

_LCPP_KV = re.compile(
    r"llama_kv_cache(?:_unified)?:\s*size\s*=\s*" + SIZE + r"\s*\(\s*(\d+)\s*cells,\s*(\d+)\s*layers,\s*(\d+)\s*/\s*(\d+)\s*seqs\s*\),"
    r"\s*K\s*\((\w+)\):\s*" + SIZE + r",\s*V\s*\((\w+)\):\s*" + SIZE
)
_LCPP_BUFFER = re.compile(r"(\w+):\s+(\S+)\s+(model|KV|compute|output|RS)\s+buffer size\s*=\s*" + SIZE)
_LCPP_BREAKDOWN_GPU = re.compile(r"\|\s*-\s*(.+?)\s*\|\s*(\d+)\s*=\s*(\d+)\s*\+\s*\(\s*(\d+)\s*=\s*(\d+)\s*\+\s*(\d+)\s*\+\s*(\d+)\s*\)\s*\+\s*(-?\d+)\s*\|")
_LCPP_BREAKDOWN_HOST = re.compile(r"\|\s*-\s*(.+?)\s*\|\s*(\d+)\s*=\s*(\d+)\s*\+\s*(\d+)\s*\+\s*(\d+)\s*\|")


def _parse_llamacpp_line(line: str, ledger: BootLedger) -> None:
    match = _LCPP_KV.search(line)
    if match:
        ledger.kv_caches.append(
            LlamaCppKvLine(
                size_bytes=parse_size(match.group(1)),
                cells=int(match.group(2)),
                layers=int(match.group(3)),
                seqs_used=int(match.group(4)),
                seqs_max=int(match.group(5)),
                type_k=match.group(6),
                k_bytes=parse_size(match.group(7)),
                type_v=match.group(8),
                v_bytes=parse_size(match.group(9)),
            )
        )
        return
    match = _LCPP_BUFFER.search(line)
    if match:
        device, kind = match.group(2), match.group(3)
        # Several buffers of one kind on one device add up (iSWA prints a full and a sliding KV buffer).
        per_device = ledger.buffers.setdefault(kind, {})
        per_device[device] = per_device.get(device, 0) + parse_size(match.group(4))
        return
    if "memory breakdown" in line or "|" not in line:
        return
    match = _LCPP_BREAKDOWN_GPU.search(line)
    if match:
        names = ("total", "free", "self", "model", "context", "compute", "unaccounted")
        ledger.breakdown[match.group(1)] = {name: int(match.group(i + 2)) for i, name in enumerate(names)}
        return
    match = _LCPP_BREAKDOWN_HOST.search(line)
    if match:
        names = ("self", "model", "context", "compute")
        ledger.breakdown[match.group(1)] = {name: int(match.group(i + 2)) for i, name in enumerate(names)}


def llamacpp_measured(boots: list[dict[str, Any]], key: str, shape: LlamaCppShape) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the boot measured at this exact cache layout or None, the layouts measured for this geometry)."""
    layout = shape.layout()
    same_key = [(b, calibration.stored_shape(b, LlamaCppShape)) for b in boots if b.get("geometry_key") == key and (b.get("ledger") or {}).get("kv_caches")]
    readable = [(b, s) for b, s in same_key if isinstance(s, LlamaCppShape)]
    exact = next((b for b, s in reversed(readable) if s.layout() == layout), None)
    return exact, [s.layout() for _b, s in readable]


def _compare_llamacpp(shape: LlamaCppShape, ledger: dict[str, Any], geometry: kv_law.ModelGeometry | None) -> dict[str, Any]:
    lines = ledger.get("kv_caches") or []
    if not lines:
        return {"agree": None, "detail": "the boot printed no llama_kv_cache line (run the engine with --log-verbosity 4)"}
    if geometry is None:
        return {"agree": None, "detail": "no stored geometry to predict from"}
    kv = kv_law.llamacpp_kv(
        geometry, shape.ctx_size, shape.parallel, shape.type_k, shape.cache_type_v, unified=shape.kv_unified, ubatch=shape.ubatch, swa_full=shape.swa_full
    )
    line = lines[0]  # the target's cache; a drafter's follows it
    predicted = {
        "cells": kv.cells_per_stream,
        "seqs": kv.n_streams,
        "k_mib": calibration.engine_mib(kv.k_bytes),
        "v_mib": calibration.engine_mib(kv.v_bytes),
        "kv_mib": calibration.engine_mib(kv.total_bytes),
    }
    measured = {
        "cells": line["cells"],
        "seqs": line["seqs_max"],
        "k_mib": calibration.engine_mib(line["k_bytes"]),
        "v_mib": calibration.engine_mib(line["v_bytes"]),
        "kv_mib": calibration.engine_mib(line["size_bytes"]),
    }
    return {"predicted": predicted, "measured": measured, "agree": predicted == measured, "detail": "exact law"}


# --- the driver ------------------------------------------------------------------------------------


class LlamaCpp(Runtime):
    name = NAME
    shape_class = LlamaCppShape
    api_key_env = "LLAMA_API_KEY"
    native_program = "/usr/bin/llama-server"
    image_starts_program = True  # llama.cpp images start llama-server themselves
    in_flight_gauges = ("llamacpp:requests_processing", "llamacpp:requests_deferred")
    metrics_need_key = True  # llama-server guards /metrics with its API key
    alert_rules = (
        AlertRule("RequestsQueueing", "llamacpp:requests_deferred{sel} > 0", "5m", "warning", "{name}: requests wait for a free slot"),
        AlertRule(
            "SpeculativeDecodingOff",
            "rate(llamacpp:tokens_predicted_total{sel}[10m]) > 0 and rate(llamacpp:spec_decode_num_drafts_total{sel}[10m]) == 0",
            "10m",
            "warning",
            "{name}: generating without drafts although the shape has a drafter",
            "has_drafter",
        ),
    )
    panels = (
        Panel(
            "Requests processing / deferred",
            (("llamacpp:requests_processing{sel}", "{{job}} processing"), ("llamacpp:requests_deferred{sel}", "{{job}} deferred")),
        ),
        Panel("Generation tokens/s", (("rate(llamacpp:tokens_predicted_total{sel}[1m])", "{{job}}"),)),
        Panel("Prompt tokens/s (excluding cache)", (("rate(llamacpp:prompt_tokens_total{sel}[1m])", "{{job}}"),)),
        Panel("Prompt tokens reused from cache/s", (("rate(llamacpp:prompt_tokens_cached_total{sel}[1m])", "{{job}}"),)),
        Panel("Busy slots per decode", (("llamacpp:n_busy_slots_per_decode{sel}", "{{job}}"),)),
        Panel("Largest sequence (tokens)", (("llamacpp:n_tokens_max{sel}", "{{job}}"),)),
        Panel(
            "Draft acceptance",
            (("rate(llamacpp:spec_decode_num_accepted_tokens_total{sel}[5m]) / rate(llamacpp:spec_decode_num_draft_tokens_total{sel}[5m])", "{{job}}"),),
            "percentunit",
        ),
    )
    # "the request exceeds the available context size (4096 tokens)"; its JSON body also carries
    # n_ctx and n_prompt_tokens, which the capacity probe reads first.
    refusal = RefusalContract(
        (re.compile(r"exceeds the available context size \((\d+) tokens\)"),),
        (re.compile(r"request \((\d+) tokens\)"),),
    )

    def argv(self, shape: Any, model_root: str = "", entry: list[str] | None = None) -> list[str]:
        return llamacpp_argv(shape, model_root, (entry or [self.native_program])[0])

    def price(self, shape: Any, devices: list[DeviceLedger], payload: PayloadReader, boots: list[dict[str, Any]]) -> BudgetResult:
        return _price_llamacpp(shape, devices, payload, boots)

    def payload_names(self, shape: Any) -> list[PayloadName]:
        # Every file llama-server opens: the model (each part of a split set), --mmproj,
        # --model-draft and --chat-template-file.
        names = gguf_names("model_file", shape.model_file) + gguf_names("drafter", shape.drafter)
        names += [PayloadName(field, path) for field, path in (("projector", shape.projector), ("chat_template_file", shape.chat_template_file)) if path]
        return names

    def parse_boot_line(self, line: str, ledger: BootLedger) -> None:
        _parse_llamacpp_line(line, ledger)

    def claims_boot(self, ledger: BootLedger) -> bool:
        return bool(ledger.kv_caches or ledger.buffers)

    def compare_boot(self, boot: dict[str, Any], boots: list[dict[str, Any]], shape: Any, geometry: Any) -> dict[str, Any]:
        return _compare_llamacpp(shape, boot.get("ledger") or {}, geometry)


DRIVER = LlamaCpp()
