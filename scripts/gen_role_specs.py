#!/usr/bin/env python3
"""Generate the per-endpoint roles (frank_primary, frank_secondary, frank_large) from one source.

The three roles differ only in identity; their mechanics live in roles/endpoint. This script
writes each role's defaults, tasks (main: deploy; bench and probe: measure), meta and argument_specs (with every shape key declared, so a
typo in an inventory fails at the start of the play). `--check` exits 1 when a committed file
differs from what it would write (the unit tests run it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from generated import report, sync

ROOT = Path(__file__).resolve().parents[1]

ENDPOINTS = {
    "frank_primary": ("frank-primary", 7770, "vLLM on dankserver, TP=2, podman"),
    "frank_secondary": ("frank-secondary", 7771, "llama.cpp on the RTX 3090 of dankclaw, native"),
    "frank_large": ("frank-large", 7770, "llama.cpp on the Strix Halo iGPU of dankclaw, native, one long slot"),
}

# key: (type, description, choices)
SHAPE_KEYS = {
    "runtime": ("str", "The engine: llamacpp or vllm.", ["llamacpp", "vllm"]),
    "launch": ("str", "native (a binary under the unit) or podman (a container under the unit).", ["native", "podman"]),
    "served_id": ("str", "The model id clients ask for (llama.cpp --alias, vLLM --served-model-name).", None),
    "port": ("int", "The endpoint's port.", None),
    "bind": ("str", "Address the engine listens on.", None),
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

# role variable suffix: (type, description, required, default)
ROLE_VARS = [
    (
        "shape",
        "dict",
        "The endpoint's shape (runtime, launch, context, slots, KV, batch, split, drafter, parsers, budget terms). Unknown keys fail the play.",
        True,
        None,
    ),
    ("devices", "list", "Devices to price on - [{name, memory}], one per GPU rank or the host.", False, "[]"),
    ("payload_dir", "str", "Directory holding the payload on the host.", True, None),
    ("payload_manifest", "raw", "The payload manifest (path on the host, or a mapping).", True, None),
    ("payload_fetch", "bool", "Fetch what is missing before verifying.", False, "false"),
    ("payload_check_hash", "bool", "Verify sha256 too (reads all data; stamps make reruns cheap).", False, "false"),
    ("model_root", "str", "Where the engine sees the payload (default /models in a container, payload_dir natively).", False, '""'),
    ("image", "str", "Engine image repository and tag (launch podman).", False, '""'),
    ("image_digest", "str", "The pinned image digest, sha256:... (launch podman).", False, '""'),
    ("container", "dict", "Container knobs - runtime, cgroups, ulimits, gpu_vendor, gpu_devices, ipc, shm_size, cache_dir, network, extra_args.", False, "{}"),
    ("binary", "str", "The engine binary (launch native).", False, "/usr/bin/llama-server"),
    ("user", "str", "Service user for a native engine.", False, '""'),
    ("unit_extra", "dict", "Further [Service] directives.", False, "{}"),
    ("environment", "dict", "Engine environment.", False, "{}"),
    ("secret_environment", "dict", "Secret engine environment (never logged).", False, "{}"),
    ("budget", "bool", "Run the budget gate.", False, "true"),
    ("health_timeout", "int", "Seconds the health gate waits.", False, "600"),
    ("probe", "bool", "Run the smoke probe (a chat completion).", False, "true"),
    ("rollback", "bool", "Restore the last-known-good shape when the new one fails.", False, "true"),
]


def render(role: str) -> dict[str, str]:
    name, port, what = ENDPOINTS[role]
    defaults = ["---", f"# Identity of {name}; its shape and host facts come from the inventory.", f"{role}_name: {name}"]
    defaults += [f"{role}_shape_defaults:", f"  served_id: {name}", f"  port: {port}", "  bind: 127.0.0.1"]
    defaults += [f"{role}_{key}: {default}" for key, _t, _d, required, default in ROLE_VARS if not required]
    tasks = [
        "---",
        f"- name: Deploy {name} through the shared gate sequence",
        "  ansible.builtin.import_role:",
        "    name: frank.llm_fleet.endpoint",
        "  vars:",
    ]
    tasks.append(f'    endpoint_name: "{{{{ {role}_name }}}}"')
    tasks.append(f'    endpoint_shape: "{{{{ {role}_shape_defaults | combine({role}_shape) }}}}"')
    tasks += [f'    endpoint_{key}: "{{{{ {role}_{key} }}}}"' for key, *_rest in ROLE_VARS if key != "shape"]
    measuring = {}
    for entry, verb in (("bench", "Bench and probe"), ("probe", "Smoke-probe")):
        measuring[entry] = [
            "---",
            f"- name: {verb} {name}",
            "  ansible.builtin.import_role:",
            "    name: frank.llm_fleet.endpoint",
            f"    tasks_from: {entry}.yml",
            "  vars:",
            f'    endpoint_name: "{{{{ {role}_name }}}}"',
            f'    endpoint_shape: "{{{{ {role}_shape_defaults | combine({role}_shape) }}}}"',
        ]
    meta = [
        "---",
        "galaxy_info:",
        "  author: frank.llm_fleet maintainers",
        f"  description: Deploy {name} ({what}) through the shared gate sequence.",
        "  license: GPL-3.0-or-later",
        '  min_ansible_version: "2.16"',
        "  platforms:",
        "    - name: Debian",
        "      versions:",
        "        - bookworm",
        "dependencies: []",
    ]
    spec = [
        "---",
        "# Generated by scripts/gen_role_specs.py from one list of shape keys; edit that script.",
        "argument_specs:",
        "  main:",
        f"    short_description: Deploy {name} ({what}).",
        "    description:",
        "      - Runs the shared gate sequence of frank.llm_fleet.endpoint - budget, payload, image or binary,",
        "        unit, health, probe, last-known-good - with automatic rollback.",
        "    options:",
        f"      {role}_name:",
        "        type: str",
        f"        default: {name}",
        "        description: Name of the unit and container.",
        f"      {role}_shape_defaults:",
        "        type: dict",
        "        description: Identity defaults merged under the shape (served_id, port, bind).",
    ]
    for key, kind, description, required, _default in ROLE_VARS:
        spec += [f"      {role}_{key}:", f"        type: {kind}"]
        if kind == "list":
            spec.append("        elements: raw")
        if required:
            spec.append("        required: true")
        spec.append(f'        description: "{description}"')
        if key == "shape":
            spec.append("        options:")
            for shape_key, (shape_kind, shape_description, choices) in SHAPE_KEYS.items():
                spec += [f"          {shape_key}:", f"            type: {shape_kind}"]
                if choices:
                    spec.append(f"            choices: [{', '.join(choices)}]")
                if shape_kind == "list":
                    spec.append("            elements: raw")
                spec.append(f'            description: "{shape_description}"')
    base = f"roles/{role}"
    return {
        f"{base}/defaults/main.yml": "\n".join(defaults) + "\n",
        f"{base}/tasks/main.yml": "\n".join(tasks) + "\n",
        f"{base}/tasks/bench.yml": "\n".join(measuring["bench"]) + "\n",
        f"{base}/tasks/probe.yml": "\n".join(measuring["probe"]) + "\n",
        f"{base}/meta/main.yml": "\n".join(meta) + "\n",
        f"{base}/meta/argument_specs.yml": "\n".join(spec) + "\n",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="report drift instead of writing")
    args = parser.parse_args()
    files = {relative: text for role in ENDPOINTS for relative, text in render(role).items()}
    return report(sync(ROOT, files, args.check), "scripts/gen_role_specs.py")


if __name__ == "__main__":
    sys.exit(main())
