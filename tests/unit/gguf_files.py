"""Write GGUF files for tests with the gguf package's own writer (an independent implementation)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_gguf(
    path: Path,
    arch: str = "llama",
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 2,
    n_head_kv: int | list[int] = 1,
    extra_kv: dict | None = None,
    tensor_dtype=np.float16,
    extra_tensors: int = 0,
    n_expert: int = 0,
) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(n_layer)
    writer.add_embedding_length(n_embd)
    writer.add_context_length(4096)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    for key, value in (extra_kv or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_string(key, value)
    head_dim = n_embd // n_head
    writer.add_tensor("token_embd.weight", np.zeros((32, n_embd), dtype=tensor_dtype))
    for il in range(n_layer):
        kv = (n_head_kv[il] if isinstance(n_head_kv, list) else n_head_kv) * head_dim
        writer.add_tensor(f"blk.{il}.attn_q.weight", np.zeros((n_embd, n_embd), dtype=tensor_dtype))
        writer.add_tensor(f"blk.{il}.attn_k.weight", np.zeros((max(kv, 1), n_embd), dtype=tensor_dtype))
        writer.add_tensor(f"blk.{il}.attn_v.weight", np.zeros((max(kv, 1), n_embd), dtype=tensor_dtype))
        writer.add_tensor(f"blk.{il}.ffn_down.weight", np.zeros((n_embd, 2 * n_embd * (il + 1)), dtype=tensor_dtype))
        if n_expert:
            # A MoE block as llama.cpp names it: the router and the routed experts' three matrices.
            writer.add_tensor(f"blk.{il}.ffn_gate_inp.weight", np.zeros((n_expert, n_embd), dtype=np.float32))
            for part in ("gate", "up", "down"):
                writer.add_tensor(f"blk.{il}.ffn_{part}_exps.weight", np.zeros((n_expert, 2 * n_embd, n_embd), dtype=tensor_dtype))
    for index in range(extra_tensors):
        writer.add_tensor(f"extra.{index}.weight", np.zeros((1,), dtype=np.float32))
    writer.add_tensor("output.weight", np.zeros((32, n_embd), dtype=tensor_dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_gguf_header(path: Path, arch: str, n_layer: int, tensors: list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType]]) -> Path:
    """A GGUF with metadata and tensor infos only (no tensor data): the header of a model too large
    to write, which is all the budget reads. dims as the header lists them (innermost first)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(n_layer)
    writer.add_embedding_length(64)
    writer.add_context_length(4096)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    for name, dims, qtype in tensors:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        elements = int(np.prod(dims))
        writer.add_tensor_info(name, tuple(reversed(dims)), np.dtype(np.float32), elements // block * size, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path
