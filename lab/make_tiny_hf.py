#!/usr/bin/env python3
"""Write a tiny random-weight llama in Hugging Face format for the lab's real vLLM.

config.json, model.safetensors (bf16), a byte-level BPE tokenizer.json (the same vocabulary as
the lab's GGUF models), tokenizer_config.json with a ChatML template, generation_config.json,
and a payload manifest beside the directory. Deterministic (fixed seed): a rerun writes the
same bytes, and an existing model is kept.

The geometry is the one the KV law is checked against: 2 layers, 4 heads, 2 KV heads of 32 dims,
so one token costs 2 layers x 2 heads x 32 x (K, V) x 2 B = 512 B of bf16 cache. `write_model`
takes another geometry (`TinyGeometry`: layers, heads, KV heads, head dim, a sliding-window layer
mix, vocabulary) for the differential harness (scripts/differential_vllm.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_gguf import CHATML, tokenizer

NAME = "tiny-llama-hf-h4kv2d32"
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 128, 2, 4, 2, 256
MAX_POSITIONS = 32768
SEED = 20261129


@dataclass(frozen=True)
class TinyGeometry:
    """A tiny llama's geometry. layer_types: None, or one of full_attention | sliding_attention
    per layer (vLLM's llama reads `layer_types` and `sliding_window` from the config); vocab_pad:
    embedding rows past the tokenizer's vocabulary."""

    hidden: int = HIDDEN
    layers: int = LAYERS
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    head_dim: int = HIDDEN // HEADS
    ffn: int = FFN
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    vocab_pad: int = 0
    max_positions: int = MAX_POSITIONS
    seed: int = SEED


def bf16_bytes(array: np.ndarray) -> bytes:
    """float32 -> bfloat16 by rounding to nearest even on the upper 16 bits."""
    bits = array.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(tensors: dict[str, np.ndarray], path: Path) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        blob = bf16_bytes(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for blob in blobs:
            handle.write(blob)


def tokenizer_json(tokens: list[str], merges: list[str], specials: list[str]) -> dict[str, object]:
    normal = [t for t in tokens if t not in specials]
    vocab = {token: index for index, token in enumerate(normal)}
    added = [
        {"id": len(normal) + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for i, s in enumerate(specials)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def write_model(out: Path, geo: TinyGeometry | None = None) -> None:
    geo = geo or TinyGeometry()
    rng = np.random.default_rng(geo.seed)
    tokens, _types, merges = tokenizer()
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    vocab_size = len(tokens) + geo.vocab_pad
    hidden, head_dim, ffn = geo.hidden, geo.head_dim, geo.ffn
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)

    def weight(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.02

    embed = weight(vocab_size, hidden)
    # The output head speaks printable ASCII only: rows of other bytes and of special tokens are
    # zero, so their logit is 0 while some ASCII token's is positive. Random weights otherwise emit
    # lone UTF-8 lead bytes, which a detokenizer rightly holds back: an "empty" answer.
    lm_head = weight(vocab_size, hidden)
    for index in range(vocab_size):
        if index >= len(tokens) or (index < 256 and not 32 <= index < 127) or tokens[index] in specials:
            lm_head[index] = 0.0
    tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": np.ones(hidden, np.float32), "lm_head.weight": lm_head}
    for layer in range(geo.layers):
        p = f"model.layers.{layer}"
        tensors.update(
            {
                f"{p}.input_layernorm.weight": np.ones(hidden, np.float32),
                f"{p}.post_attention_layernorm.weight": np.ones(hidden, np.float32),
                f"{p}.self_attn.q_proj.weight": weight(geo.heads * head_dim, hidden),
                f"{p}.self_attn.k_proj.weight": weight(geo.kv_heads * head_dim, hidden),
                f"{p}.self_attn.v_proj.weight": weight(geo.kv_heads * head_dim, hidden),
                f"{p}.self_attn.o_proj.weight": weight(hidden, geo.heads * head_dim),
                f"{p}.mlp.gate_proj.weight": weight(ffn, hidden),
                f"{p}.mlp.up_proj.weight": weight(ffn, hidden),
                f"{p}.mlp.down_proj.weight": weight(hidden, ffn),
            }
        )
    write_safetensors(tensors, tmp / "model.safetensors")
    bos, eos = len(tokens) - 1, len(tokens) - 2  # <|endoftext|>, <|im_end|>
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": geo.layers,
        "num_attention_heads": geo.heads,
        "num_key_value_heads": geo.kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": geo.max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": bos,
        "eos_token_id": eos,
    }
    if geo.layer_types is not None:
        config["layer_types"] = list(geo.layer_types)
        config["sliding_window"] = geo.sliding_window
    files = {
        "config.json": config,
        "generation_config.json": {"bos_token_id": bos, "eos_token_id": eos},
        "tokenizer.json": tokenizer_json(tokens, merges, specials),
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "model_max_length": geo.max_positions,
            "chat_template": CHATML,
        },
    }
    for name, content in files.items():
        (tmp / name).write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n")
    if out.exists():  # --force: the new model replaces the old one whole
        shutil.rmtree(out)
    os.replace(tmp, out)


def write_manifest(model_dir: Path) -> None:
    """The payload manifest hf_payload_gate verifies, pinned to a hash of the content."""
    entries = []
    digest = hashlib.sha1()
    for path in sorted(model_dir.iterdir()):
        data = path.read_bytes()
        digest.update(path.name.encode() + data)
        # Paths are relative to the payload directory, which holds the model directory.
        entry = {"path": f"{model_dir.name}/{path.name}", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        entries.append({**entry, "lfs": path.suffix == ".safetensors"})
    manifest = {"repo_id": f"lab/{model_dir.name}", "revision": digest.hexdigest(), "repo_type": "model", "files": entries}
    target = model_dir.with_name(model_dir.name + ".manifest.json")
    text = json.dumps(manifest, indent=2) + "\n"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--force", action="store_true", help="rewrite the model if it exists")
    args = parser.parse_args(argv)
    model_dir = args.out_dir / NAME
    if args.force or not model_dir.exists():
        write_model(model_dir)
        size = sum(p.stat().st_size for p in model_dir.iterdir())
        print(f"[lab] wrote {model_dir} ({size:,} bytes)", file=sys.stderr)
    write_manifest(model_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
