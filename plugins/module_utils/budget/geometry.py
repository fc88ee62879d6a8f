# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model's geometry for the budget: from a GGUF header, a Hugging Face config or an explicit
`<key>_geometry` mapping (llama.cpp's placement of its layers and tensors: placement.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import (
    MAX_ARRAY_LENGTH,
    MAX_BLOCK_COUNT,
    MAX_CONTEXT_LENGTH,
    MAX_EMBEDDING_LENGTH,
    MAX_EXPERT_COUNT,
    MAX_HEAD_COUNT,
    MAX_HEAD_DIM,
    MAX_WINDOW,
    GGUFHeader,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import MAX_LAYERS, ShapeError, parse_bytes, parse_int

# A model's config.json is a few KiB (the largest, with a vision tower, tens of KiB).
MAX_CONFIG_BYTES = 4 << 20
MAX_CONFIG_STRING = 256  # an architecture, model type or layer kind name
# config.json counts and dimensions the budget reads or a caller may size work by: key ->
# (minimum, maximum, the bound's name). The maxima are gguf_header's, so both formats of one model
# meet the same bounds. A key that is absent or null is left to the KV law's default.
_CONFIG_NUMBERS: dict[str, tuple[int, int, str]] = {
    "num_hidden_layers": (1, MAX_BLOCK_COUNT, "MAX_BLOCK_COUNT"),
    "num_attention_heads": (1, MAX_HEAD_COUNT, "MAX_HEAD_COUNT"),
    "num_key_value_heads": (0, MAX_HEAD_COUNT, "MAX_HEAD_COUNT"),
    "head_dim": (1, MAX_HEAD_DIM, "MAX_HEAD_DIM"),
    "hidden_size": (1, MAX_EMBEDDING_LENGTH, "MAX_EMBEDDING_LENGTH"),
    "intermediate_size": (0, MAX_EMBEDDING_LENGTH * 64, "MAX_EMBEDDING_LENGTH x 64"),
    "moe_intermediate_size": (0, MAX_EMBEDDING_LENGTH * 64, "MAX_EMBEDDING_LENGTH x 64"),
    "vocab_size": (0, MAX_ARRAY_LENGTH, "MAX_ARRAY_LENGTH"),
    "max_position_embeddings": (0, MAX_CONTEXT_LENGTH, "MAX_CONTEXT_LENGTH"),
    "sliding_window": (0, MAX_WINDOW, "MAX_WINDOW"),
    "num_local_experts": (0, MAX_EXPERT_COUNT, "MAX_EXPERT_COUNT"),
    "num_experts": (0, MAX_EXPERT_COUNT, "MAX_EXPERT_COUNT"),
    "n_routed_experts": (0, MAX_EXPERT_COUNT, "MAX_EXPERT_COUNT"),
    "n_shared_experts": (0, MAX_EXPERT_COUNT, "MAX_EXPERT_COUNT"),
    "num_experts_per_tok": (0, MAX_EXPERT_COUNT, "MAX_EXPERT_COUNT"),
    "kv_lora_rank": (0, MAX_HEAD_DIM, "MAX_HEAD_DIM"),
    "q_lora_rank": (0, MAX_HEAD_DIM, "MAX_HEAD_DIM"),
    "qk_rope_head_dim": (0, MAX_HEAD_DIM, "MAX_HEAD_DIM"),
    "qk_nope_head_dim": (0, MAX_HEAD_DIM, "MAX_HEAD_DIM"),
    "v_head_dim": (0, MAX_HEAD_DIM, "MAX_HEAD_DIM"),
    "num_nextn_predict_layers": (0, MAX_BLOCK_COUNT, "MAX_BLOCK_COUNT"),
}


def load_geometry(explicit: Mapping[str, Any] | None, path: str | None, loader: Callable[[str], GGUFHeader], field_name: str) -> kv_law.ModelGeometry | None:
    """A model geometry: the explicit mapping when given (`<field>_geometry`), else read from the
    file at `path` (a GGUF, or a Hugging Face model directory's config.json); None without either."""
    if explicit:
        return geometry_from_dict(explicit, f"{field_name}_geometry")
    if not path:
        return None
    config = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if config.endswith(".json"):
        # A Hugging Face model directory (vLLM): the geometry is in its config.
        data = read_hf_config(config, field_name)
        try:
            return kv_law.geometry_from_hf_config(data, config)
        except ValueError as exc:
            raise ShapeError(f"{field_name}: {exc}") from None
    return kv_law.geometry_from_header(loader(path))


def read_hf_config(config: str, field_name: str) -> dict[str, Any]:
    """A Hugging Face config.json, read within MAX_CONFIG_BYTES and checked (check_hf_config)
    before any of it sizes work: ShapeError names the field, the file and the key."""
    try:
        with open(config, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_CONFIG_BYTES:
                raise ShapeError(
                    f"{field_name}: {config} is {size} bytes, above MAX_CONFIG_BYTES ({MAX_CONFIG_BYTES}); "
                    f"a model's config.json is a few KiB: replace it with the model's own, or give {field_name}_geometry"
                )
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ShapeError(f"{field_name}: cannot read the model's config {config}: {exc}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ShapeError(f"{field_name}: {config}: not JSON a budget can read (nested too deep); replace it with the model's own config.json") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise ShapeError(f"{field_name}: {config}: not JSON ({exc}); replace it with the model's own config.json") from None
    check_hf_config(data, config, field_name)
    return data


def check_hf_config(data: Any, config: str, field_name: str) -> None:
    """Type-check and bound every count, dimension and list of a config.json the KV law reads
    (and the usual expert and vocabulary counts), so a hostile or broken config is refused naming
    its key and file, never priced as a million layers or a division by zero."""

    def refuse(what: str) -> ShapeError:
        fix = f"this is no config vLLM loads: replace it with the model's own config.json, or give {field_name}_geometry"
        return ShapeError(f"{field_name}: {config}: {what}; {fix}")

    if not isinstance(data, dict):
        raise refuse(f"expected a JSON object, got a {type(data).__name__}")
    nested = data.get("text_config")
    if nested is not None and not isinstance(nested, dict):
        raise refuse(f"text_config is a {type(nested).__name__}, expected a mapping (the language model's config)")
    # As the KV law reads it: a multimodal config nests the language model's keys.
    text, prefix = (nested, "text_config.") if nested else (data, "")
    numbers: dict[str, int] = {}
    for key, (low, high, bound) in _CONFIG_NUMBERS.items():
        value = text.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise refuse(f"{prefix}{key} is {repr(value)[:40]}, expected a whole number in {low}-{high}")
        if not low <= value <= high:
            raise refuse(f"{prefix}{key} is {value}, outside {low}-{high} ({bound})")
        numbers[key] = value
    for key in ("num_hidden_layers", "num_attention_heads"):
        if key not in numbers:
            raise refuse(f"{prefix}{key} is missing; it is required to price the cache")
    if not numbers.get("head_dim"):
        if "hidden_size" not in numbers:
            raise refuse(f"{prefix}hidden_size is missing; it is needed for the head dim when head_dim is absent")
        if numbers["hidden_size"] // numbers["num_attention_heads"] < 1:
            raise refuse(
                f"{prefix}hidden_size {numbers['hidden_size']} over num_attention_heads {numbers['num_attention_heads']} is a head dim of 0 (give head_dim)"
            )
    n_layer = numbers["num_hidden_layers"]
    kinds = text.get("layer_types")
    if kinds:
        if not isinstance(kinds, list):
            raise refuse(f"{prefix}layer_types is a {type(kinds).__name__}, expected a list of {n_layer} layer kinds")
        if len(kinds) != n_layer:
            raise refuse(f"{prefix}layer_types has {len(kinds)} entries for {n_layer} layers (num_hidden_layers)")
        for index, kind in enumerate(kinds):
            if not isinstance(kind, str) or len(kind) > MAX_CONFIG_STRING:
                raise refuse(f"{prefix}layer_types[{index}] is {repr(kind)[:40]}, expected a layer kind string")
    architectures = data.get("architectures")
    if architectures:
        if not isinstance(architectures, list):
            raise refuse(f"architectures is a {type(architectures).__name__}, expected a list of strings")
        for index, name in enumerate(architectures):
            if not isinstance(name, str) or len(name) > MAX_CONFIG_STRING:
                raise refuse(f"architectures[{index}] is {repr(name)[:40]}, expected a string")
    model_type = data.get("model_type")
    if model_type is not None and (not isinstance(model_type, str) or len(model_type) > MAX_CONFIG_STRING):
        raise refuse(f"model_type is {repr(model_type)[:40]}, expected a string")


def geometry_from_dict(spec: Mapping[str, Any], field_name: str = "geometry") -> kv_law.ModelGeometry:
    """Explicit geometry, for shapes whose payload is not on the controller.

    Keys: n_layer, n_head_kv (int or per-layer list), head_dim (or head_dim_k/head_dim_v), head_dim_swa
    (or head_dim_k_swa/head_dim_v_swa: sliding-window layers' own dims),
    layer_kinds (list of full|swa|recurrent, optional), sliding_window, recurrent_state_bytes,
    layer_bytes (per layer size or list), output_bytes, input_bytes, k_eq_v, nextn_layers (in-file MTP
    layers, whose draft context adds to the saved prompt state); for llama.cpp's compute and output
    buffers: n_vocab, n_embd, n_head, n_ff (and ssm_d_inner, ssm_d_state, ssm_d_conv, ssm_dt_rank for
    Mamba).
    """
    if not isinstance(spec, Mapping):
        raise ShapeError(f"{field_name}: expected a mapping with n_layer, n_head_kv and head_dim")

    def number(key: str, default: Any = None, minimum: int = 0, maximum: int | None = None) -> int | None:
        value = spec.get(key, default)
        return None if value is None else parse_int(value, f"{field_name}.{key}", minimum, maximum)

    def size(key: str) -> int:
        return parse_bytes(spec.get(key, 0), f"{field_name}.{key}")

    n_layer = number("n_layer", minimum=1, maximum=MAX_LAYERS)
    if n_layer is None:
        raise ShapeError(f"{field_name}.n_layer: required")
    heads = spec.get("n_head_kv")
    if heads is None:
        raise ShapeError(f"{field_name}.n_head_kv: required")
    heads_list = heads if isinstance(heads, list) else [heads] * n_layer
    if len(heads_list) != n_layer:
        raise ShapeError(f"{field_name}.n_head_kv: {len(heads_list)} values for {n_layer} layers")
    heads_list = [parse_int(h, f"{field_name}.n_head_kv[{il}]", 0, 65536) for il, h in enumerate(heads_list)]
    dim_k = number("head_dim_k", spec.get("head_dim"), 1, 65536)
    dim_v = number("head_dim_v", spec.get("head_dim"), 1, 65536)
    if dim_k is None or dim_v is None:
        raise ShapeError(f"{field_name}.head_dim: required")
    # Sliding-window layers may carry their own head dims (Gemma-4: 512 full, 256 SWA).
    dim_k_swa = number("head_dim_k_swa", spec.get("head_dim_swa", dim_k), 1, 65536) or dim_k
    dim_v_swa = number("head_dim_v_swa", spec.get("head_dim_swa", dim_v), 1, 65536) or dim_v
    kinds = spec.get("layer_kinds") or ["full"] * n_layer
    if not isinstance(kinds, list) or len(kinds) != n_layer or any(k not in ("full", "swa", "recurrent", "nextn") for k in kinds):
        raise ShapeError(f"{field_name}.layer_kinds: give {n_layer} values, each full, swa, recurrent or nextn")
    state = size("recurrent_state_bytes")
    k_eq_v = bool(spec.get("k_eq_v", False))
    layers = [
        kv_law.LayerKV("recurrent", recurrent_state_bytes=state)
        if kind == "recurrent"
        else kv_law.LayerKV(kind, heads_list[il], dim_k_swa if kind == "swa" else dim_k, dim_v_swa if kind == "swa" else dim_v, k_eq_v)
        for il, kind in enumerate(kinds)
    ]
    layer_bytes_spec = spec.get("layer_bytes", 0)
    if isinstance(layer_bytes_spec, list):
        if len(layer_bytes_spec) != n_layer:
            raise ShapeError(f"{field_name}.layer_bytes: {len(layer_bytes_spec)} values for {n_layer} layers")
        layer_bytes = {il: parse_bytes(v, f"{field_name}.layer_bytes[{il}]") for il, v in enumerate(layer_bytes_spec)}
    else:
        layer_bytes = dict.fromkeys(range(n_layer), size("layer_bytes"))
    return kv_law.ModelGeometry(
        architecture=str(spec.get("architecture", "explicit")),
        layers=layers,
        sliding_window=number("sliding_window", 0, 0, 1 << 24) or 0,
        layer_weight_bytes=layer_bytes,
        input_weight_bytes=size("input_bytes"),
        output_weight_bytes=size("output_bytes"),
        nextn_layers=number("nextn_layers", 0, 0, 64) or 0,
        n_ctx_train=number("n_ctx_train", 0, 0, MAX_CONTEXT_LENGTH) or 0,
        n_embd=number("n_embd", 0, 0, MAX_EMBEDDING_LENGTH) or 0,
        n_vocab=number("n_vocab", 0, 0, MAX_ARRAY_LENGTH) or 0,
        n_head=number("n_head", 0, 0, MAX_HEAD_COUNT) or 0,
        n_ff=number("n_ff", 0, 0, MAX_EMBEDDING_LENGTH * 64) or 0,
        ssm_d_inner=number("ssm_d_inner", 0, 0, 1 << 20) or 0,
        ssm_d_state=number("ssm_d_state", 0, 0, 1 << 20) or 0,
        ssm_d_conv=number("ssm_d_conv", 0, 0, 1 << 10) or 0,
        ssm_dt_rank=number("ssm_dt_rank", 0, 0, 1 << 20) or 0,
    )


def geometry_mapping(geometry: kv_law.ModelGeometry) -> dict[str, Any]:
    """The explicit `model_geometry` mapping that prices as `geometry` does (geometry_from_dict's
    keys): what a shape carries when its header is not readable where the budget runs."""
    layers = geometry.layers
    attn = [layer for layer in layers if layer.kind in ("full", "nextn")] or [layer for layer in layers if layer.kind == "swa"]
    swa = [layer for layer in layers if layer.kind == "swa"] or attn
    state = next((layer.recurrent_state_bytes for layer in layers if layer.kind == "recurrent"), 0)
    spec: dict[str, Any] = {
        "architecture": geometry.architecture,
        "n_layer": len(layers),
        "n_head_kv": [layer.n_head_kv for layer in layers],
        "head_dim_k": attn[0].head_dim_k if attn else 1,
        "head_dim_v": attn[0].head_dim_v if attn else 1,
        "head_dim_k_swa": swa[0].head_dim_k if swa else 1,
        "head_dim_v_swa": swa[0].head_dim_v if swa else 1,
        "layer_kinds": [layer.kind for layer in layers],
        "layer_bytes": [geometry.layer_weight_bytes.get(il, 0) for il in range(len(layers))],
        "input_bytes": geometry.input_weight_bytes,
        "output_bytes": geometry.output_weight_bytes,
    }
    optional = {
        "sliding_window": geometry.sliding_window,
        "recurrent_state_bytes": state,
        "k_eq_v": any(layer.k_eq_v for layer in layers),
        "nextn_layers": geometry.nextn_layers,
        "n_ctx_train": geometry.n_ctx_train,
        "n_embd": geometry.n_embd,
        "n_vocab": geometry.n_vocab,
        "n_head": geometry.n_head,
        "n_ff": geometry.n_ff,
        "ssm_d_inner": geometry.ssm_d_inner,
        "ssm_d_state": geometry.ssm_d_state,
        "ssm_d_conv": geometry.ssm_d_conv,
        "ssm_dt_rank": geometry.ssm_dt_rank,
    }
    spec.update({key: value for key, value in optional.items() if value})
    return spec
