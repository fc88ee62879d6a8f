# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model's geometry for the budget: from a GGUF header, a Hugging Face config or an explicit
`<key>_geometry` mapping, and llama.cpp's placement of its layers on the devices."""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Callable
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.fields import ShapeError, _int, _size
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFHeader
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import parse_size


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
