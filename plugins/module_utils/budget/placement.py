# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where llama.cpp puts a model's weights: whole layers by --n-gpu-layers and --tensor-split
(assign_layers), then single tensors by --override-tensor (place_overrides).

llama.cpp's loader (llama-model-loader.cpp, create_tensor) gives every weight tensor a home by
its layer (`blk.N.*` on layer N's device, token embeddings in host memory, everything else with
the output layer), then walks the override list in the flag's order and takes the FIRST pattern
whose regex is found anywhere in the tensor name (std::regex_search); that pattern's buffer wins.
`CPU` is host memory; `ROCm0`, `CUDA1`, `Vulkan0` ... name a device by its index. So the bytes
an override moves are exact: each matched tensor's elements x its type's block size, read from
the header (gguf_header.TensorInfo.n_bytes), moved from its home to the pattern's buffer.
The per-card split of every tensor no pattern matches stays the layer law's (geometry.assign_layers).
"""

from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass, field

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import TensorInfo
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import Verdict
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

HOST = -1  # host memory: a layer beyond --n-gpu-layers, the token embeddings, a tensor overridden to CPU
# Layers beyond the layer law's count (e.g. a block the header lists past block_count): the law
# prices none of them, so an override of one moves nothing the ledger holds.
UNPRICED = -2

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
_DEVICE_BUFFER_RE = re.compile(r"^[A-Za-z][A-Za-z_]*?(\d+)$")  # ROCm0, CUDA1, Vulkan0, SYCL0


def assign_layers(n_layer: int, n_devices: int, tensor_split: tuple[float, ...] | list[float] | None, n_gpu_layers: int = 999) -> list[int]:
    """Device index per layer (HOST for a layer left in host RAM), plus one entry for the output
    layer (index n_layer).

    llama.cpp's rule: the last `n_gpu_layers` of the n_layer + 1 (the output counts as one) go to
    the devices; among those, layer il goes to the first device whose normalised cumulative split
    exceeds (il - first) / offloaded. Whole layers move, never parts.
    """
    split = list(tensor_split or [1.0] * n_devices)
    if len(split) != n_devices:
        raise ShapeError(f"tensor_split: {len(split)} values for {n_devices} devices")
    if any(s < 0 for s in split) or sum(split) <= 0:
        raise ShapeError("tensor_split: values must be non-negative and not all zero")
    first = max(n_layer + 1 - n_gpu_layers, 0)
    offloaded = min(n_gpu_layers, n_layer + 1)
    total = float(sum(split))
    cumulative = []
    running = 0.0
    for share in split:
        running += share
        cumulative.append(running / total)
    placement = []
    for il in range(n_layer + 1):
        if il < first or offloaded <= 0:
            placement.append(HOST)
        else:
            placement.append(min(bisect.bisect_right(cumulative, (il - first) / offloaded), n_devices - 1))
    return placement


def buffer_device(buffer: str, n_devices: int, field_name: str) -> int:
    """The ledger index a buffer type or device names: HOST for CPU, N for a backend's Nth device."""
    if buffer.upper() == "CPU":
        return HOST
    match = _DEVICE_BUFFER_RE.match(buffer)
    if not match:
        raise ShapeError(f"{field_name}: buffer {buffer!r} is no buffer type llama.cpp lists; use CPU or a device buffer such as ROCm0 or CUDA0")
    index = int(match.group(1))
    if index >= n_devices:
        raise ShapeError(f"{field_name}: buffer {buffer} names device {index}, but the shape lists {n_devices} device(s)")
    return index


def tensor_home(name: str, layer_device: list[int], n_layer: int) -> int:
    """Where the layer law puts a tensor: its block's device, host for the token embeddings, the
    output layer's device for every other non-block tensor."""
    match = _LAYER_RE.match(name)
    if match:
        layer = int(match.group(1))
        return layer_device[layer] if layer < n_layer else UNPRICED
    if name.startswith("token_embd"):
        return HOST
    return layer_device[n_layer]


@dataclass
class PatternPlacement:
    pattern: str
    buffer: str
    target: int
    matched: int = 0  # tensors whose name the regex finds, taken or not
    taken: int = 0  # tensors this pattern placed (the first match)
    bytes: int = 0


@dataclass
class OverridePlacement:
    """The bytes the overrides move: off each device, onto each device, off and onto the host."""

    patterns: list[PatternPlacement]
    off_device: list[int]
    onto_device: list[int]
    to_host: int = 0
    off_host_layers: int = 0
    off_input: int = 0
    moved: dict[str, int] = field(default_factory=dict)  # tensor name -> target, for tests and notes


def place_overrides(
    tensors: list[TensorInfo], overrides: tuple[tuple[str, str], ...], layer_device: list[int], n_layer: int, n_devices: int
) -> OverridePlacement:
    """Apply `overrides` (in the order llama.cpp receives them) to every tensor of the header."""
    patterns = []
    for pattern, buffer in overrides:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ShapeError(f"override_tensor.{pattern}: not a regular expression ({exc}); llama.cpp matches it against tensor names") from None
        patterns.append((regex, PatternPlacement(pattern, buffer, buffer_device(buffer, n_devices, f"override_tensor.{pattern}"))))
    result = OverridePlacement([p for _regex, p in patterns], [0] * n_devices, [0] * n_devices)
    for tensor in tensors:
        winner = None
        for regex, placed in patterns:
            if regex.search(tensor.name):
                placed.matched += 1
                if winner is None:
                    winner = placed
        if winner is None:
            continue
        size = tensor.n_bytes
        winner.taken += 1
        winner.bytes += size
        home = tensor_home(tensor.name, layer_device, n_layer)
        if home == UNPRICED or home == winner.target:
            continue
        result.moved[tensor.name] = winner.target
        if home != HOST:
            result.off_device[home] += size
        elif tensor.name.startswith("token_embd"):
            result.off_input += size
        else:
            result.off_host_layers += size
        if winner.target == HOST:
            result.to_host += size
        else:
            result.onto_device[winner.target] += size
    return result


def override_verdicts(placed: OverridePlacement, n_tensors: int, model_path: str) -> list[Verdict]:
    """A pattern that places nothing looks like a working override and is not one: one that
    matches no tensor (seed 001: "The placeholder pattern ngram_embeddings matched nothing"), or one
    whose every match an earlier pattern already took (llama.cpp's first match wins)."""
    out = []
    for pattern in placed.patterns:
        if pattern.taken:
            continue
        if pattern.matched:
            why = f"places nothing: each of the {pattern.matched:,} tensors it matches is taken by an earlier pattern (the first match wins)"
        else:
            why = f"matches none of the {n_tensors:,} tensors of {os.path.basename(model_path)}"
        out.append(
            Verdict("override_tensor", False, f"override_tensor: {pattern.pattern}={pattern.buffer} {why}; fix the pattern or drop it", term="override_tensor")
        )
    return out


def draft_device_verdicts(
    draft_device: str | None, borrows_output: bool, has_overrides: bool, layer_device: list[int], device_names: list[str]
) -> list[Verdict]:
    """A drafter that borrows the target's output head must run where the layer law puts the output
    layer. Seed 001: "The shared MTP head borrows the main model output head, which a -ts 1,1" "layer
    split places on ROCm1. With tensor overrides set, n_copies==1 in the" "draft's scheduler, and a
    borrowed output.weight in a ROCm1 buffer aborts the" "draft graph (ggml-backend.cpp:941) when the
    draft context is on ROCm0" - "the unit crash-looped 4x"; "ROCm1 loads and serves". The seeds saw
    the abort with tensor overrides set, so the rule holds there."""
    if not (draft_device and borrows_output and has_overrides):
        return []
    output = layer_device[-1]
    index = buffer_device(draft_device, len(device_names), "draft_device")
    if index == output:
        return []
    where = "host RAM" if output == HOST else f"{device_names[output]} (device {output})"
    return [
        Verdict(
            "draft_device",
            False,
            f"draft_device {draft_device}: the drafter borrows the target's output head, which the layer split puts on {where}; with override_tensor "
            "the draft graph aborts on any other device: run the drafter there",
            None if index == HOST else device_names[index],
            "draft_device",
        )
    ]
