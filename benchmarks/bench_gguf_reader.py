#!/usr/bin/env python3
"""GGUF header reader vs the gguf package's GGUFReader.

(a) a synthetic file with 100,000 tensor infos (tiny tensors, so the header dominates);
(b) a 50 GiB sparse file: a real header followed by a hole (reading data would take minutes).
Goals: (a) >= 50x faster than GGUFReader; (b) under 50 ms.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))

import gguf  # noqa: E402
import numpy as np  # noqa: E402

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_header  # noqa: E402


def write_many_tensors(path: Path, count: int) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(count // 10)
    tiny = np.zeros((1,), dtype=np.float32)
    for index in range(count):
        writer.add_tensor(f"blk.{index // 10}.ffn_down_exps.{index % 10}.weight", tiny)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _run in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tensors", type=int, default=100_000)
    parser.add_argument("--sparse-gib", type=int, default=50)
    parser.add_argument("--reference-runs", type=int, default=1, help="GGUFReader runs (slow)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        many = Path(tmp) / "many.gguf"
        write_many_tensors(many, args.tensors)
        ours = best_of(lambda: read_header(many), 5)
        assert len(read_header(many).tensors) == args.tensors
        theirs = best_of(lambda: gguf.GGUFReader(str(many)), args.reference_runs)
        print(f"(a) {args.tensors:,} tensor infos: ours {ours * 1000:.1f} ms, GGUFReader {theirs * 1000:.0f} ms: {theirs / ours:.0f}x faster (goal >= 50x)")

        sparse = Path(tmp) / "sparse.gguf"
        write_many_tensors(sparse, 2000)
        with open(sparse, "r+b") as handle:
            handle.truncate(args.sparse_gib << 30)
        cold = best_of(lambda: read_header(sparse), 1)
        warm = best_of(lambda: read_header(sparse), 5)
        print(f"(b) {args.sparse_gib} GiB sparse file: first read {cold * 1000:.2f} ms, best {warm * 1000:.2f} ms (goal < 50 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
