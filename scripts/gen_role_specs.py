#!/usr/bin/env python3
"""Generate the shape keys of the endpoint role's argument specs from one table.

Every endpoint is an inventory host deployed by roles/endpoint; its shape is the host variable
`endpoint_shape`. This script writes the `options:` of `endpoint_shape` in
roles/endpoint/meta/argument_specs.yml (between two marker comments; the rest of that file is
written by hand), so every shape key is declared and a typo in an inventory fails at the start of
the play. `--check` exits 1 when the committed file differs from what it would write (the unit
tests run it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from generated import report, sync

ROOT = Path(__file__).resolve().parents[1]

# key: (type, description, choices)
SHAPE_KEYS = {
    "runtime": ("str", "The engine: llamacpp or vllm.", ["llamacpp", "vllm"]),
    "launch": ("str", "native (a binary under the unit) or podman (a container under the unit).", ["native", "podman"]),
    "served_id": ("str", "The model id clients ask for (llama.cpp --alias, vLLM --served-model-name); default the endpoint's name.", None),
    "port": ("int", "The endpoint's port (every endpoint writes it; two endpoints on one machine need two ports).", None),
    "bind": ("str", "Address the engine listens on; default 127.0.0.1.", None),
    "probe_host": ("str", "Address the health gate and probes use.", None),
    "model_file": ("str", "The model's path relative to the payload directory (first part of a split GGUF).", None),
    "ctx_size": ("int", "llama.cpp --ctx-size (divided into --parallel windows).", None),
    "parallel": ("int", "llama.cpp --parallel (slots).", None),
    "type_k": ("str", "llama.cpp K cache type.", None),
    "type_v": ("str", "llama.cpp V cache type.", None),
    "kv_unified": ("bool", "llama.cpp --kv-unified.", None),
    "swa_full": ("bool", "llama.cpp full-size SWA cache.", None),
    "batch": ("int", "llama.cpp --batch-size.", None),
    "ubatch": ("int", "llama.cpp --ubatch-size.", None),
    "n_gpu_layers": ("int", "llama.cpp --n-gpu-layers.", None),
    "tensor_split": ("raw", "llama.cpp --tensor-split, a list or 'a,b'.", None),
    "override_tensor": ("raw", "llama.cpp --override-tensor patterns, a mapping pattern -> buffer.", None),
    "projector_path": ("str", "llama.cpp --mmproj path as the engine sees it.", None),
    "drafter_path": ("str", "llama.cpp --model-draft path as the engine sees it.", None),
    "draft_max": ("int", "llama.cpp --draft-max (drafter depth).", None),
    "cache_ram": ("raw", "llama.cpp --cache-ram as a size (also priced by the budget).", None),
    "jinja": ("bool", "llama.cpp --jinja (default on).", None),
    "extra_args": ("list", "Further engine arguments.", None),
    "max_model_len": ("int", "vLLM --max-model-len.", None),
    "max_num_seqs": ("int", "vLLM --max-num-seqs.", None),
    "kv_cache_dtype": ("str", "vLLM --kv-cache-dtype.", None),
    "kv_cache_memory_bytes": ("raw", "vLLM --kv-cache-memory-bytes per rank, as a size.", None),
    "max_num_batched_tokens": ("int", "vLLM --max-num-batched-tokens.", None),
    "tensor_parallel": ("int", "vLLM --tensor-parallel-size.", None),
    "gpu_memory_utilization": ("float", "vLLM --gpu-memory-utilization (below 1.0).", None),
    "prefix_caching": ("bool", "vLLM --enable-prefix-caching.", None),
    "tool_parser": ("str", "vLLM --tool-call-parser (enables auto tool choice).", None),
    "reasoning_parser": ("str", "vLLM --reasoning-parser.", None),
    "speculative_config": ("dict", "vLLM --speculative-config (a drafter; its metrics get a speculative-decoding alert).", None),
    "reasoning_control": (
        "str",
        "Client contract - how the chat template switches reasoning: enable_thinking, reasoning_effort or none.",
        ["enable_thinking", "reasoning_effort", "none"],
    ),
    "client_base_url": ("str", "The URL clients use, for the client contract (default http://HOST:PORT/v1).", None),
    "restart_sec": ("int", "The unit's RestartSec.", None),
    "calibration": ("list", "Budget - measured vLLM boots.", None),
    "weights_per_rank": ("raw", "Budget - vLLM weights per rank.", None),
    "weights": ("raw", "Budget - vLLM weights in total.", None),
    "graph_memory": ("raw", "Budget - measured graph memory.", None),
    "graph_captures": ("int", "Budget - captured graphs (estimate).", None),
    "runtime_overhead": ("raw", "Budget - vLLM runtime overhead.", None),
    "non_torch_memory": ("raw", "Budget - non-torch memory.", None),
    "expert_arena": ("raw", "Budget - expert arena (declared).", None),
    "expert_offload": ("bool", "Budget - the arena takes what remains.", None),
    "free_floor": ("raw", "Budget - per-device free floor.", None),
    "max_device_gap": ("raw", "Budget - maximum gap between devices.", None),
    "extra_terms": ("list", "Budget - declared extra terms.", None),
    "compute_buffer": ("raw", "Budget - llama.cpp compute buffers (one size or per device).", None),
    "projector": ("raw", "Budget - projector GGUF path or size.", None),
    "drafter": ("str", "Budget - drafter GGUF path (its own header sizes its KV).", None),
    "model_geometry": ("dict", "Budget - explicit geometry when the payload is not readable where the budget runs.", None),
    "drafter_geometry": ("dict", "Budget - explicit drafter geometry.", None),
    "slot_calibration": ("dict", "Budget - two measured boots for the slot ceiling.", None),
    "host_ram": ("raw", "Budget - host RAM for the prompt-cache law.", None),
    "client_gap": ("int", "Client contract gap.", None),
    "client_max_tokens": ("int", "Client maxTokens.", None),
}

SPEC = "roles/endpoint/meta/argument_specs.yml"
BEGIN = "        # Generated by scripts/gen_role_specs.py from its SHAPE_KEYS table; edit that table, not these lines."
END = "        # End of the generated shape keys."


def render_shape_options() -> list[str]:
    """The `options:` of endpoint_shape, indented for its place in the endpoint role's spec."""
    lines = ["        options:"]
    for key, (kind, description, choices) in SHAPE_KEYS.items():
        lines += [f"          {key}:", f"            type: {kind}"]
        if choices:
            lines.append(f"            choices: [{', '.join(choices)}]")
        if kind == "list":
            lines.append("            elements: raw")
        lines.append(f'            description: "{description}"')
    return lines


def render(current: str) -> str:
    """The spec file with the lines between BEGIN and END replaced by the generated shape keys."""
    lines = current.splitlines()
    try:
        first, last = lines.index(BEGIN), lines.index(END)
    except ValueError:
        raise SystemExit(f"{SPEC}: the markers of the generated shape keys are missing:\n{BEGIN}\n{END}") from None
    return "\n".join([*lines[: first + 1], *render_shape_options(), *lines[last:]]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="report drift instead of writing")
    args = parser.parse_args()
    files = {SPEC: render((ROOT / SPEC).read_text())}
    return report(sync(ROOT, files, args.check), "scripts/gen_role_specs.py")


if __name__ == "__main__":
    sys.exit(main())
