#!/usr/bin/env python3
"""Write tiny random-weight llama GGUF models for the lab (real llama-server loads them).

Deterministic (fixed seed), so a rerun produces the same bytes; an existing file is kept.
Each geometry differs in head counts and head dims so the KV law is exercised on more than one
shape. Head dims are multiples of 32 so quantised KV types (q8_0, q4_0: blocks of 32) apply.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class Geometry:
    name: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int = 32768


GEOMETRIES = (
    # 2 layers, 2 KV heads x 32 dim: the shape the domain brief quotes from a real boot.
    Geometry("tiny-llama-h4kv2d32", n_embd=128, n_layer=2, n_head=4, n_head_kv=2, n_ff=256),
    # A second geometry: 3 layers, 1 KV head x 64 dim.
    Geometry("tiny-llama-h4kv1d64", n_embd=256, n_layer=3, n_head=4, n_head_kv=1, n_ff=512),
)

VOCAB_SIZE = 512


def byte_level_alphabet() -> list[str]:
    """GPT-2's reversible byte -> printable character map, as byte-level BPE vocabularies use."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    mapping = dict(zip(printable, chars))
    return [chr(mapping[b]) for b in range(256)]


def tokenizer() -> tuple[list[str], list[int], list[str]]:
    alphabet = byte_level_alphabet()
    tokens = alphabet[:]
    merges: list[str] = []
    # Merge pairs of printable ASCII letters until the vocabulary is full (at least one merge is
    # required by llama.cpp's BPE loader).
    letters = [c for c in alphabet if c.isalpha() and c.isascii()]
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    for a in letters:
        for b in letters:
            if len(tokens) >= VOCAB_SIZE - len(specials):
                break
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    token_types = [gguf.TokenType.NORMAL] * len(tokens) + [gguf.TokenType.CONTROL] * len(specials)
    tokens += specials
    return tokens, [int(t) for t in token_types], merges


CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def add_tokenizer(writer: gguf.GGUFWriter, tokens: list[str], token_types: list[int], merges: list[str]) -> None:
    """The byte-level BPE vocabulary, its special ids (the last two tokens) and the ChatML template."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 1)
    writer.add_eos_token_id(len(tokens) - 2)
    writer.add_chat_template(CHATML)


def write_model(geometry: Geometry, path: Path) -> None:
    rng = np.random.default_rng(20261129)
    head_dim = geometry.n_embd // geometry.n_head
    tokens, token_types, merges = tokenizer()
    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(geometry.name)
    writer.add_context_length(geometry.n_ctx_train)
    writer.add_embedding_length(geometry.n_embd)
    writer.add_block_count(geometry.n_layer)
    writer.add_feed_forward_length(geometry.n_ff)
    writer.add_head_count(geometry.n_head)
    writer.add_head_count_kv(geometry.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tokenizer(writer, tokens, token_types, merges)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    kv_dim = geometry.n_head_kv * head_dim
    writer.add_tensor("token_embd.weight", weight(len(tokens), geometry.n_embd))
    for layer in range(geometry.n_layer):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(geometry.n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", weight(geometry.n_embd, geometry.n_embd))
        writer.add_tensor(f"{prefix}.attn_k.weight", weight(kv_dim, geometry.n_embd))
        writer.add_tensor(f"{prefix}.attn_v.weight", weight(kv_dim, geometry.n_embd))
        writer.add_tensor(f"{prefix}.attn_output.weight", weight(geometry.n_embd, geometry.n_embd))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(geometry.n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weight(geometry.n_ff, geometry.n_embd))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weight(geometry.n_ff, geometry.n_embd))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weight(geometry.n_embd, geometry.n_ff))
    writer.add_tensor("output_norm.weight", np.ones(geometry.n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weight(len(tokens), geometry.n_embd))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--force", action="store_true", help="rewrite models that already exist")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for geometry in GEOMETRIES:
        path = args.out_dir / f"{geometry.name}.gguf"
        if path.exists() and not args.force:
            continue
        write_model(geometry, path)
        print(f"[lab] wrote {path} ({path.stat().st_size:,} bytes)", file=sys.stderr)
    write_manifests(args.out_dir)
    return 0


def write_manifests(out_dir: Path) -> None:
    """A payload manifest per model (the format hf_payload_gate verifies), pinned to a content hash."""
    for geometry in GEOMETRIES:
        model = out_dir / f"{geometry.name}.gguf"
        data = model.read_bytes()
        manifest = {
            "repo_id": f"lab/{geometry.name}",
            "revision": hashlib.sha1(data).hexdigest(),
            "repo_type": "model",
            "files": [{"path": model.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "lfs": True}],
        }
        target = out_dir / f"{geometry.name}.manifest.json"
        text = json.dumps(manifest, indent=2) + "\n"
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
