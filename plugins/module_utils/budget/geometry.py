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
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFHeader
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import MAX_LAYERS, ShapeError, parse_bytes, parse_int


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
        try:
            with open(config, encoding="utf-8") as handle:
                return kv_law.geometry_from_hf_config(json.load(handle), config)
        except (OSError, ValueError) as exc:
            raise ShapeError(f"{field_name}: cannot read the model's config {config}: {exc}") from None
    return kv_law.geometry_from_header(loader(path))


def geometry_from_dict(spec: Mapping[str, Any], field_name: str = "geometry") -> kv_law.ModelGeometry:
    """Explicit geometry, for shapes whose payload is not on the controller.

    Keys: n_layer, n_head_kv (int or per-layer list), head_dim (or head_dim_k/head_dim_v), head_dim_swa
    (or head_dim_k_swa/head_dim_v_swa: sliding-window layers' own dims),
    layer_kinds (list of full|swa|recurrent, optional), sliding_window, recurrent_state_bytes,
    layer_bytes (per layer size or list), output_bytes, input_bytes, k_eq_v, nextn_layers (in-file MTP
    layers, whose draft context adds to the saved prompt state).
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
    if not isinstance(kinds, list) or len(kinds) != n_layer or any(k not in ("full", "swa", "recurrent") for k in kinds):
        raise ShapeError(f"{field_name}.layer_kinds: give {n_layer} values, each full, swa or recurrent")
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
    )
