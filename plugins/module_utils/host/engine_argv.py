# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An endpoint's shape -> the engine's exact argv (llama.cpp `llama-server` or vLLM).

The shape is the same mapping the budget prices (see docs/vram_budget.md), plus the serving
keys: `served_id`, `bind`, `port`, `model_path` (where the engine sees the payload), parsers,
`extra_args`. Rules kept here so no inventory can forget them:
- llama.cpp always gets `--metrics` (else /metrics answers 501) and `--alias` (the served id);
  `--override-tensor` patterns are joined into ONE flag, most specific (longest) first, because
  llama.cpp applies the first match and a broad pattern first would swallow the specific ones;
- vLLM's `--gpu-memory-utilization` must stay below 1.0 (1.0 is unbootable).
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import SizeError, parse_size


class ArgvError(ValueError):
    """A shape that cannot become an engine command line; names the field."""


def _require(shape: dict[str, Any], key: str) -> Any:
    value = shape.get(key)
    if value in (None, ""):
        raise ArgvError(f"{key}: required to build the {shape.get('runtime')} command line")
    return value


def _int_str(shape: dict[str, Any], key: str) -> str:
    value = shape[key]
    if isinstance(value, bool):
        raise ArgvError(f"{key}: expected a whole number, got {value!r}")
    try:
        return str(int(str(value).replace(",", "").replace("_", "")))
    except ValueError:
        raise ArgvError(f"{key}: expected a whole number, got {value!r}") from None


def override_tensor_flag(patterns: list[dict[str, str]] | dict[str, str]) -> str:
    """`pattern=buffer` pairs joined with commas, longest (most specific) pattern first."""
    pairs = list(patterns.items()) if isinstance(patterns, dict) else [(p["pattern"], p["buffer"]) for p in patterns]
    for pattern, buffer in pairs:
        if not pattern or not buffer or "," in pattern or "=" in pattern:
            raise ArgvError(f"override_tensor: {pattern!r}={buffer!r} is not a usable pattern=buffer pair")
    ordered = sorted(pairs, key=lambda pair: -len(pair[0]))
    return ",".join(f"{pattern}={buffer}" for pattern, buffer in ordered)


def llamacpp_argv(shape: dict[str, Any], binary: str = "/usr/bin/llama-server") -> list[str]:
    argv = [binary, "--model", str(_require(shape, "model_path"))]
    argv += ["--alias", str(_require(shape, "served_id"))]
    argv += ["--host", str(shape.get("bind", "127.0.0.1")), "--port", _int_str({"port": _require(shape, "port")}, "port")]
    argv += ["--ctx-size", _int_str({"ctx_size": _require(shape, "ctx_size")}, "ctx_size")]
    argv += ["--parallel", _int_str({"parallel": shape.get("parallel", 1)}, "parallel")]
    type_k = str(shape.get("type_k", "f16"))
    argv += ["--cache-type-k", type_k, "--cache-type-v", str(shape.get("type_v", type_k))]
    if shape.get("kv_unified"):
        argv.append("--kv-unified")
    argv += ["--n-gpu-layers", str(shape.get("n_gpu_layers", 999))]
    if shape.get("tensor_split"):
        split = shape["tensor_split"]
        argv += ["--tensor-split", ",".join(str(v) for v in split) if isinstance(split, list) else str(split)]
    if shape.get("batch"):
        argv += ["--batch-size", _int_str(shape, "batch")]
    if shape.get("ubatch"):
        argv += ["--ubatch-size", _int_str(shape, "ubatch")]
    if shape.get("override_tensor"):
        argv += ["--override-tensor", override_tensor_flag(shape["override_tensor"])]
    if shape.get("projector_path"):
        argv += ["--mmproj", str(shape["projector_path"])]
    if shape.get("drafter_path"):
        argv += ["--model-draft", str(shape["drafter_path"])]
        if shape.get("draft_max"):
            argv += ["--draft-max", _int_str(shape, "draft_max")]
    if shape.get("cache_ram") is not None:
        try:
            argv += ["--cache-ram", str(parse_size(shape["cache_ram"], "cache_ram") >> 20)]  # MiB
        except SizeError as exc:
            raise ArgvError(str(exc)) from None
    if shape.get("jinja", True):
        argv.append("--jinja")
    argv.append("--metrics")  # always: without it /metrics answers 501
    argv += [str(arg) for arg in shape.get("extra_args") or []]
    return argv


def vllm_argv(shape: dict[str, Any], entry: list[str] | None = None) -> list[str]:
    """Arguments for vLLM's OpenAI server (`entry` is the program part, e.g. the image's default)."""
    argv = list(entry or [])
    argv += ["--model", str(_require(shape, "model_path"))]
    argv += ["--served-model-name", str(_require(shape, "served_id"))]
    argv += ["--host", str(shape.get("bind", "127.0.0.1")), "--port", _int_str({"port": _require(shape, "port")}, "port")]
    argv += ["--max-model-len", _int_str({"max_model_len": _require(shape, "max_model_len")}, "max_model_len")]
    argv += ["--max-num-seqs", _int_str({"max_num_seqs": shape.get("max_num_seqs", 1)}, "max_num_seqs")]
    if shape.get("kv_cache_dtype"):
        argv += ["--kv-cache-dtype", str(shape["kv_cache_dtype"])]
    if shape.get("kv_cache_memory_bytes") is not None:
        try:
            argv += ["--kv-cache-memory-bytes", str(parse_size(shape["kv_cache_memory_bytes"], "kv_cache_memory_bytes"))]
        except SizeError as exc:
            raise ArgvError(str(exc)) from None
    if shape.get("max_num_batched_tokens"):
        argv += ["--max-num-batched-tokens", _int_str(shape, "max_num_batched_tokens")]
    argv += ["--tensor-parallel-size", _int_str({"tensor_parallel": shape.get("tensor_parallel", 1)}, "tensor_parallel")]
    util = shape.get("gpu_memory_utilization")
    if util is not None:
        if not 0 < float(util) < 1.0:
            raise ArgvError(f"gpu_memory_utilization: {util} is unbootable; it must be below 1.0 (e.g. 0.98)")
        argv += ["--gpu-memory-utilization", str(util)]
    if shape.get("prefix_caching"):
        argv.append("--enable-prefix-caching")
    if shape.get("tool_parser"):
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", str(shape["tool_parser"])]
    if shape.get("reasoning_parser"):
        argv += ["--reasoning-parser", str(shape["reasoning_parser"])]
    if shape.get("speculative_config"):
        # A drafter (draft model, MTP or n-gram), passed through as vLLM's JSON argument.
        argv += ["--speculative-config", json.dumps(shape["speculative_config"], sort_keys=True, separators=(",", ":"))]
    argv += [str(arg) for arg in shape.get("extra_args") or []]
    return argv


def engine_argv(shape: dict[str, Any], entry: list[str] | None = None) -> list[str]:
    runtime = shape.get("runtime")
    if runtime == "llamacpp":
        return llamacpp_argv(shape, (entry or ["/usr/bin/llama-server"])[0])
    if runtime == "vllm":
        return vllm_argv(shape, entry)
    raise ArgvError(f"runtime: expected 'llamacpp' or 'vllm', got {runtime!r}")
