#!/usr/bin/env python3
"""Tiny random-geometry GGUF models for the differential harness (scripts/differential.py).

`draw_geometry(rng)` picks an architecture (llama, gemma2, gemma3 with sliding windows, mamba) and
its dimensions at random; `write_model(geometry, path)` writes a GGUF llama-server loads (random
weights in f32, f16 or q8_0, a byte-level BPE vocabulary of the drawn size). Same geometry, same
bytes: the weights are seeded from the geometry's own digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np
from make_tiny_gguf import add_tokenizer, byte_level_alphabet  # lab/, on sys.path beside this file


@dataclass(frozen=True)
class RandomGeometry:
    arch: str  # llama | gemma2 | gemma3 | mamba
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    weight_type: str  # f32 | f16 | q8_0
    sliding_window: int = 0
    swa_pattern: int = 0  # gemma3: written as the integer key when set (else the arch default)
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_dt_rank: int = 0
    tied_output: bool = False
    n_ctx_train: int = 32768

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        return f"rand-{self.arch}-{self.digest}"


def draw_geometry(rng: random.Random) -> RandomGeometry:
    """One geometry at random: GQA ratios 1-8, head dims mostly multiples of 32 (quantised KV
    applies) and some that are not (the engine's own refusal is then the expected answer)."""
    arch = rng.choices(["llama", "gemma3", "gemma2", "mamba"], weights=[50, 22, 16, 12])[0]
    n_layer = rng.randint(1, 6)
    weight_type = rng.choice(["f32", "f16", "q8_0"])
    n_vocab = rng.choice([300, 512, 777, 1000, 2048, 3001, 4096, 8000, 12345, 16384, 32000])
    n_embd = rng.choice([64, 96, 128, 192, 256, 384, 512])
    while n_vocab * n_embd > 2_000_000:  # a few MiB per model: the lab's disk is shared
        n_embd //= 2
    if arch == "mamba":
        d_inner = n_embd * 2
        return RandomGeometry(
            arch,
            n_embd,
            n_layer,
            0,
            0,
            0,
            0,
            n_vocab,
            weight_type,
            ssm_d_conv=4,
            ssm_d_inner=d_inner,
            ssm_d_state=rng.choice([16, 32]),
            ssm_dt_rank=max(1, n_embd // 16),
            tied_output=rng.random() < 0.3,
        )
    n_head_kv = rng.choice([1, 1, 2, 2, 3, 4])
    n_head = n_head_kv * rng.choice([1, 2, 4, 8])
    head_dim = rng.choices([32, 64, 96, 128, 256, 48, 80, 40], weights=[20, 25, 10, 15, 5, 8, 8, 4])[0]
    n_ff = rng.choice([64, 128, 256, 320, 512, 768, 1024, 1536])
    window = 0
    pattern = 0
    if arch in ("gemma2", "gemma3"):
        window = rng.choice([32, 64, 100, 128, 256, 512, 1000, 4096])
        if arch == "gemma3" and rng.random() < 0.4:
            pattern = rng.choice([2, 3, 4])
    if weight_type == "q8_0" and (n_embd % 32 or n_ff % 32 or (n_head * head_dim) % 32):
        weight_type = "f16"
    return RandomGeometry(
        arch,
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_vocab,
        weight_type,
        window,
        pattern,
        # gemma2 never loads an output.weight (the head is the embeddings): llama.cpp counts it as an extra tensor.
        tied_output=arch == "gemma2" or (arch == "gemma3" and rng.random() < 0.5),
    )


def tokenizer(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary of exactly n_vocab tokens (at least 259)."""
    alphabet = byte_level_alphabet()
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    tokens = alphabet[: max(0, n_vocab - len(specials))]
    merges: list[str] = []
    letters = [c for c in alphabet if c.isalpha() and c.isascii()]
    for a in letters:
        for b in letters:
            if len(tokens) >= n_vocab - len(specials):
                break
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    filler = 0
    while len(tokens) < n_vocab - len(specials):
        tokens.append(f"<unused{filler}>")
        filler += 1
    types = [int(gguf.TokenType.NORMAL)] * len(tokens) + [int(gguf.TokenType.CONTROL)] * len(specials)
    return tokens + specials, types, merges or ["a b"]


_QTYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}


def write_model(geometry: RandomGeometry, path: Path) -> None:
    g = geometry
    rng = np.random.default_rng(int(g.digest, 16))
    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), g.arch)
    writer.add_name(g.name)
    writer.add_context_length(g.n_ctx_train)
    writer.add_embedding_length(g.n_embd)
    writer.add_block_count(g.n_layer)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[g.weight_type])
    if g.arch == "mamba":
        writer.add_feed_forward_length(0)
        writer.add_head_count(0)
        writer.add_ssm_conv_kernel(g.ssm_d_conv)
        writer.add_ssm_inner_size(g.ssm_d_inner)
        writer.add_ssm_state_size(g.ssm_d_state)
        writer.add_ssm_time_step_rank(g.ssm_dt_rank)
    else:
        writer.add_feed_forward_length(g.n_ff)
        writer.add_head_count(g.n_head)
        writer.add_head_count_kv(g.n_head_kv)
        writer.add_key_length(g.head_dim)
        writer.add_value_length(g.head_dim)
        writer.add_rope_dimension_count(g.head_dim)
        if g.sliding_window:
            writer.add_sliding_window(g.sliding_window)
        if g.swa_pattern:
            writer.add_uint32(f"{g.arch}.attention.sliding_window_pattern", g.swa_pattern)
        if g.arch == "gemma2":
            writer.add_float32(f"{g.arch}.attn_logit_softcapping", 50.0)
            writer.add_float32(f"{g.arch}.final_logit_softcapping", 30.0)
    add_tokenizer(writer, *tokenizer(g.n_vocab))

    def matrix(name: str, rows: int, cols: int) -> None:
        """A ggml {cols, rows} matrix (numpy shape rows x cols) in the geometry's weight type."""
        data = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        qtype = _QTYPES[g.weight_type]
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, data)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    def vector(name: str, n: int, value: float = 1.0) -> None:
        writer.add_tensor(name, np.full(n, value, dtype=np.float32))

    matrix("token_embd.weight", g.n_vocab, g.n_embd)
    for il in range(g.n_layer):
        p = f"blk.{il}"
        vector(f"{p}.attn_norm.weight", g.n_embd)
        if g.arch == "mamba":
            d_inner, d_state, dt_rank = g.ssm_d_inner, g.ssm_d_state, g.ssm_dt_rank
            writer.add_tensor(f"{p}.ssm_in.weight", (rng.standard_normal((2 * d_inner, g.n_embd)) * 0.02).astype(np.float32))
            writer.add_tensor(f"{p}.ssm_conv1d.weight", (rng.standard_normal((d_inner, g.ssm_d_conv)) * 0.02).astype(np.float32))
            vector(f"{p}.ssm_conv1d.bias", d_inner, 0.0)
            writer.add_tensor(f"{p}.ssm_x.weight", (rng.standard_normal((dt_rank + 2 * d_state, d_inner)) * 0.02).astype(np.float32))
            writer.add_tensor(f"{p}.ssm_dt.weight", (rng.standard_normal((d_inner, dt_rank)) * 0.02).astype(np.float32))
            vector(f"{p}.ssm_dt.bias", d_inner, 0.0)
            writer.add_tensor(f"{p}.ssm_a", -np.ones((d_inner, d_state), dtype=np.float32))
            vector(f"{p}.ssm_d", d_inner)
            writer.add_tensor(f"{p}.ssm_out.weight", (rng.standard_normal((g.n_embd, d_inner)) * 0.02).astype(np.float32))
            continue
        q_dim, kv_dim = g.n_head * g.head_dim, g.n_head_kv * g.head_dim
        matrix(f"{p}.attn_q.weight", q_dim, g.n_embd)
        matrix(f"{p}.attn_k.weight", kv_dim, g.n_embd)
        matrix(f"{p}.attn_v.weight", kv_dim, g.n_embd)
        matrix(f"{p}.attn_output.weight", g.n_embd, q_dim)
        if g.arch == "gemma3":
            vector(f"{p}.attn_q_norm.weight", g.head_dim)
            vector(f"{p}.attn_k_norm.weight", g.head_dim)
        if g.arch in ("gemma2", "gemma3"):
            vector(f"{p}.post_attention_norm.weight", g.n_embd)
            vector(f"{p}.post_ffw_norm.weight", g.n_embd)
        vector(f"{p}.ffn_norm.weight", g.n_embd)
        matrix(f"{p}.ffn_gate.weight", g.n_ff, g.n_embd)
        matrix(f"{p}.ffn_up.weight", g.n_ff, g.n_embd)
        matrix(f"{p}.ffn_down.weight", g.n_embd, g.n_ff)
    vector("output_norm.weight", g.n_embd)
    if not g.tied_output:
        matrix("output.weight", g.n_vocab, g.n_embd)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)


def ensure_model(geometry: RandomGeometry, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{geometry.name}.gguf"
    if not path.exists():
        write_model(geometry, path)
    return path
