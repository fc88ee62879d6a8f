# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An endpoint's typed shape -> the engine's exact argv (llama.cpp `llama-server` or vLLM).

The shape is the one the budget prices (shape/model.py): the gate and the launch read the same
typed object, so they cannot disagree on a default. Payload paths (`model_file`, `projector`,
`drafter`) are placed under `model_root`, where the engine sees the payload. Rules kept here so no
inventory can forget them:
- llama.cpp always gets `--metrics` (else /metrics answers 501) and `--alias` (the served id);
  speculation uses the b11030-era flags the fleet ran (`--spec-type`, `--model-draft`,
  `--spec-draft-n-max`);
  `--override-tensor` patterns are joined into ONE flag, most specific (longest) first, because
  llama.cpp applies the first match and a broad pattern first would swallow the specific ones.
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import (
    LlamaCppShape,
    Shape,
    ShapeError,
    VllmShape,
    override_tensor_order,
    parse_shape,
    resolve_path,
)


class ArgvError(ValueError):
    """A shape that cannot become an engine command line; names the field."""


def override_tensor_flag(pairs: tuple[tuple[str, str], ...]) -> str:
    """`pattern=buffer` pairs joined with commas, in the order llama.cpp applies them."""
    return ",".join(f"{pattern}={buffer}" for pattern, buffer in override_tensor_order(pairs))


def _json_flag(value: Any) -> str:
    """A mapping as the compact JSON the engines parse (keys sorted, so the argv is stable)."""
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"))


def _serving(shape: Shape, model_root: str) -> tuple[str, str, str]:
    """The model path, the served id and the port: without them there is nothing to launch."""
    for key in ("model_file", "served_id", "port"):
        if getattr(shape, key) in (None, ""):
            raise ArgvError(f"{key}: required to build the {shape.runtime} command line")
    try:
        model = resolve_path(shape.model_file, model_root)
    except ShapeError as exc:
        raise ArgvError(str(exc)) from None
    return str(model), str(shape.served_id), str(shape.port)


def llamacpp_argv(shape: LlamaCppShape, model_root: str = "", binary: str = "/usr/bin/llama-server") -> list[str]:
    model, served_id, port = _serving(shape, model_root)
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
    if shape.cache_ram is not None:
        argv += ["--cache-ram", str(shape.cache_ram >> 20)]  # MiB
    if shape.jinja:
        argv.append("--jinja")
    if shape.chat_template_file:
        argv += ["--chat-template-file", str(resolve_path(shape.chat_template_file, model_root))]
    if shape.chat_template_kwargs:
        argv += ["--chat-template-kwargs", _json_flag(shape.chat_template_kwargs)]
    if shape.reasoning_format:
        argv += ["--reasoning-format", shape.reasoning_format]
    if shape.log_verbosity is not None:
        argv += ["--log-verbosity", str(shape.log_verbosity)]
    argv.append("--metrics")  # always: without it /metrics answers 501
    return argv + list(shape.extra_args)


def vllm_argv(shape: VllmShape, model_root: str = "", entry: list[str] | None = None) -> list[str]:
    """Arguments for vLLM's OpenAI server (`entry` is the program part, e.g. the image's default)."""
    model, served_id, port = _serving(shape, model_root)
    argv = list(entry or [])
    argv += ["--model", model, "--served-model-name", served_id, "--host", shape.bind, "--port", port]
    argv += ["--max-model-len", str(shape.max_model_len), "--max-num-seqs", str(shape.max_num_seqs)]
    argv += ["--kv-cache-dtype", shape.kv_cache_dtype]
    if shape.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(shape.kv_cache_memory_bytes)]
    if shape.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(shape.max_num_batched_tokens)]
    argv += ["--tensor-parallel-size", str(shape.tensor_parallel)]
    argv += ["--gpu-memory-utilization", f"{shape.gpu_memory_utilization:g}"]
    if shape.prefix_caching:
        argv.append("--enable-prefix-caching")
    if shape.tool_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", shape.tool_parser]
    if shape.reasoning_parser:
        argv += ["--reasoning-parser", shape.reasoning_parser]
    if shape.chat_template_kwargs:
        argv += ["--default-chat-template-kwargs", _json_flag(shape.chat_template_kwargs)]
    if shape.attention_backend:
        argv += ["--attention-backend", shape.attention_backend]
    if shape.expert_offload:
        argv.append("--enable-expert-offload")
    if shape.expert_precise_memory:
        argv.append("--expert-precise-memory")
    if shape.speculative_config:
        # A drafter (draft model, MTP or n-gram), passed through as vLLM's JSON argument.
        argv += ["--speculative-config", _json_flag(shape.speculative_config)]
    return argv + list(shape.extra_args)


def engine_argv(shape: Shape | Any, model_root: str = "", entry: list[str] | None = None, name: str | None = None) -> list[str]:
    """The engine's argv for a shape (typed, or a mapping parsed here); `name` is the endpoint's,
    the default served id."""
    try:
        typed = parse_shape(shape, name)
    except ShapeError as exc:
        raise ArgvError(str(exc)) from None
    if isinstance(typed, LlamaCppShape):
        return llamacpp_argv(typed, model_root, (entry or ["/usr/bin/llama-server"])[0])
    return vllm_argv(typed, model_root, entry)
