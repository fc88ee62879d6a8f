#!/usr/bin/env python3
"""Pricing from the Hub by range requests vs downloading the same files, against the Hub emulator.

Two models, served by lab/hub_emulator.py over real HTTP on loopback (LFS files through its CDN
redirect), their tensor data sparse holes so the files are large but cost no disk:
(a) a split GGUF: 4 parts, 40,000 tensor infos, a 151,936-token vocabulary with its merges
    (a long header, as a Qwen model's), each part --part-mib MiB;
(b) a safetensors model: config.json, model.safetensors.index.json and 2 shards (a 24-layer
    model of hidden size 1024 in bf16, about 750 MB).
For each: price_from_hub (best of --repeat; the bytes and requests the emulator counted, every hop
included: the revision, the resolve redirects, the CDN's ranges), then the payload gate's own
fetch of the same files (build_manifest + fetch_payload, sha256 verified), and the local pricing
of the downloaded files (read_model / config.json), whose shape keys must equal the Hub's.

The emulator's sockets get TCP_NODELAY here, as a CDN's have: without it each small ranged answer
(headers, then a short body) waits for the client's delayed ACK, about 40 ms a request.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT / "lab"))

import gguf  # noqa: E402
import hub_emulator  # noqa: E402
import numpy as np  # noqa: E402

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import kv_law  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import geometry_mapping, read_hf_config  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_model  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import build_manifest, fetch_payload  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_pricing import price_from_hub  # noqa: E402

GGUF_REPO = "bench/split-gguf"
HF_REPO = "bench/safetensors"
PARTS = 4
TENSORS_PER_PART = 10_000
VOCAB = 151_936
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, HF_VOCAB = 1024, 24, 8, 2, 2816, 32000


def nodelay_setup(self) -> None:
    original_setup(self)
    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


original_setup = hub_emulator._HubHandler.setup


def sparse_extend(path: Path, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)


def write_split_gguf(directory: Path, part_mib: int) -> list[str]:
    """The parts' names; each part a real header, then a hole for its tensors' data."""
    names = [f"gguf/model-{no:05d}-of-{PARTS:05d}.gguf" for no in range(1, PARTS + 1)]
    (directory / "gguf").mkdir(parents=True, exist_ok=True)
    # One F16 tensor's elements, so a part's tensors fill about part_mib MiB.
    columns = max(1, (part_mib << 20) // (TENSORS_PER_PART * HIDDEN * 2))
    blocks = PARTS * TENSORS_PER_PART // 1000
    for index, name in enumerate(names):
        writer = gguf.GGUFWriter(str(directory / name), "qwen3moe")
        if index == 0:
            writer.add_block_count(blocks)
            writer.add_embedding_length(HIDDEN)
            writer.add_context_length(32768)
            writer.add_head_count(HEADS)
            writer.add_head_count_kv(KV_HEADS)
            writer.add_feed_forward_length(FFN)
            writer.add_tokenizer_model("gpt2")
            writer.add_token_list([f"tok{n:06d}" for n in range(VOCAB)])
            writer.add_token_types([1] * VOCAB)
            writer.add_token_merges([f"t{n} o{n}" for n in range(VOCAB)])
        writer.add_uint16("split.no", index)
        writer.add_uint16("split.count", PARTS)
        writer.add_int32("split.tensors.count", PARTS * TENSORS_PER_PART)
        data = 0
        for number in range(index * TENSORS_PER_PART, (index + 1) * TENSORS_PER_PART):
            nbytes = HIDDEN * columns * 2
            tensor = f"blk.{number // 1000}.t{number % 1000}.weight"
            writer.add_tensor_info(tensor, (columns, HIDDEN), np.dtype(np.float16), nbytes, raw_dtype=gguf.GGMLQuantizationType.F16)
            data += (nbytes + 31) // 32 * 32
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        writer.close()
        path = directory / name
        header = path.stat().st_size
        sparse_extend(path, (header + 31) // 32 * 32 + data)
    return names


def write_safetensors_model(directory: Path) -> list[str]:
    """config.json, the index and two shards: real headers, the data a hole."""
    model = directory
    model.mkdir(parents=True, exist_ok=True)
    shapes = {"model.embed_tokens.weight": [HF_VOCAB, HIDDEN], "lm_head.weight": [HF_VOCAB, HIDDEN], "model.norm.weight": [HIDDEN]}
    head_dim = HIDDEN // HEADS
    for layer in range(LAYERS):
        p = f"model.layers.{layer}"
        shapes.update(
            {
                f"{p}.input_layernorm.weight": [HIDDEN],
                f"{p}.post_attention_layernorm.weight": [HIDDEN],
                f"{p}.self_attn.q_proj.weight": [HEADS * head_dim, HIDDEN],
                f"{p}.self_attn.k_proj.weight": [KV_HEADS * head_dim, HIDDEN],
                f"{p}.self_attn.v_proj.weight": [KV_HEADS * head_dim, HIDDEN],
                f"{p}.self_attn.o_proj.weight": [HIDDEN, HEADS * head_dim],
                f"{p}.mlp.gate_proj.weight": [FFN, HIDDEN],
                f"{p}.mlp.up_proj.weight": [FFN, HIDDEN],
                f"{p}.mlp.down_proj.weight": [HIDDEN, FFN],
            }
        )
    names = sorted(shapes)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    weight_map = {}
    for shard, tensors in shards.items():
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name in tensors:
            nbytes = int(np.prod(shapes[name])) * 2
            header[name] = {"dtype": "BF16", "shape": shapes[name], "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = shard
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        path = model / shard
        path.write_bytes(struct.pack("<Q", len(raw)) + raw)
        sparse_extend(path, 8 + len(raw) + offset)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 32768,
        "vocab_size": HF_VOCAB,
    }
    (model / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1) + "\n")
    return ["config.json", "model.safetensors.index.json", *shards]


def served(emulator: hub_emulator.HubEmulator, requests_before: int) -> tuple[int, int]:
    time.sleep(0.05)  # the emulator counts a body after sending it
    return sum(emulator.bytes_served.values()), len(emulator.requests) - requests_before


def best_pricing(emulator: hub_emulator.HubEmulator, client: HubClient, repo: str, model_file: str, repeat: int) -> tuple:
    """(seconds, bytes the emulator sent, its requests, the pricing) of the fastest of `repeat` runs."""
    best = None
    for _run in range(repeat):
        emulator.bytes_served.clear()
        before = len(emulator.requests)
        started = time.perf_counter()
        priced = price_from_hub(client, repo, model_file)
        seconds = time.perf_counter() - started
        bytes_sent, requests = served(emulator, before)
        if best is None or seconds < best[0]:
            best = (seconds, bytes_sent, requests, priced)
    return best


def measure(emulator: hub_emulator.HubEmulator, label: str, repo: str, model_file: str, files: list[str], workdir: Path, repeat: int, local, hf_mem) -> dict:
    client = HubClient(emulator.hub_url)
    seconds, bytes_sent, requests, priced = best_pricing(emulator, client, repo, model_file, repeat)
    # A mirror that answers the resolve URL itself (no CDN redirect): the other endpoint kind.
    emulator.mirror = True
    try:
        mirror_seconds, mirror_bytes, mirror_requests, mirrored = best_pricing(emulator, client, repo, model_file, repeat)
    finally:
        emulator.mirror = False
    total = sum(emulator.repos[repo].files[path].size for path in files)
    other = run_hf_mem(emulator, hf_mem, repo, model_file) if hf_mem else {}
    emulator.bytes_served.clear()
    before = len(emulator.requests)
    dest = Path(tempfile.mkdtemp(prefix="bench-download-", dir=workdir))
    started = time.perf_counter()
    manifest = build_manifest(client, repo, "main", files)
    results = fetch_payload(client, manifest, str(dest))
    download_seconds = time.perf_counter() - started
    download_bytes, download_requests = served(emulator, before)
    failed = [f"{r.path}: {r.detail}" for r in results if r.action == "failed"]
    if failed:
        raise SystemExit(f"{label}: the download failed: {failed}")
    started = time.perf_counter()
    local_keys = local(dest)
    local_seconds = time.perf_counter() - started
    for path in files:
        os.unlink(dest / path)
    same = {key: priced.shape_keys[key] for key in local_keys} == local_keys and mirrored.shape_keys == priced.shape_keys
    return {
        "model": label,
        "files": len(files),
        "file_bytes": total,
        "hub_bytes_read": bytes_sent,
        "hub_requests": requests,
        "hub_seconds": round(seconds, 4),
        "mirror_bytes_read": mirror_bytes,
        "mirror_requests": mirror_requests,
        "mirror_seconds": round(mirror_seconds, 4),
        "download_bytes": download_bytes,
        "download_requests": download_requests,
        "download_seconds": round(download_seconds, 3),
        "local_pricing_seconds": round(local_seconds, 4),
        "bytes_ratio": round(download_bytes / max(bytes_sent, 1), 1),
        "same_shape_keys_as_on_disk": same,
        **other,
    }


# Loaded into hf-mem's interpreter (PYTHONPATH): hf-mem names https://huggingface.co in its code, so
# its requests are sent to the emulator instead; nothing else of it changes.
HF_MEM_SHIM = """
import os
import httpx2

_target = os.environ["BENCH_HUB_URL"]
_send = httpx2.AsyncClient.send


async def send(self, request, **kwargs):
    url = str(request.url)
    if url.startswith("https://huggingface.co"):
        request.url = httpx2.URL(_target + url[len("https://huggingface.co"):])
    return await _send(self, request, **kwargs)


httpx2.AsyncClient.send = send
"""


def run_hf_mem(emulator: hub_emulator.HubEmulator, executable: str, repo: str, model_file: str) -> dict:
    """hf-mem's remote estimate of the same model, against the same emulator: bytes, requests, time."""
    with tempfile.TemporaryDirectory(prefix="bench-hf-mem-") as shim:
        (Path(shim) / "sitecustomize.py").write_text(HF_MEM_SHIM)
        return _hf_mem_figures(emulator, executable, repo, model_file, shim)


def _hf_mem_figures(emulator: hub_emulator.HubEmulator, executable: str, repo: str, model_file: str, shim: str) -> dict:
    argv = [executable, "--model-id", repo, "--json-output"]
    if model_file.endswith(".gguf"):
        argv += ["--gguf-file", model_file]
    env = {**os.environ, "PYTHONPATH": shim, "BENCH_HUB_URL": emulator.hub_url}
    env.pop("HF_TOKEN", None)
    emulator.bytes_served.clear()
    before = len(emulator.requests)
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=600)
    seconds = time.perf_counter() - started
    bytes_sent, requests = served(emulator, before)
    query = "import importlib.metadata as m; print(m.version('hf-mem'))"
    version = subprocess.run([str(Path(executable).parent / "python"), "-c", query], capture_output=True, text=True, check=False)
    if proc.returncode:
        print(f"# hf-mem on {repo} exited {proc.returncode}: {proc.stderr.strip()[-400:]}", file=sys.stderr)
    return {
        "hf_mem_version": version.stdout.strip(),
        "hf_mem_bytes_read": bytes_sent,
        "hf_mem_requests": requests,
        "hf_mem_seconds": round(seconds, 3),
        "hf_mem_exit": proc.returncode,
    }


def gguf_local(dest: Path) -> dict:
    header = read_model(dest / "gguf" / f"model-00001-of-{PARTS:05d}.gguf")
    return {"model_geometry": geometry_mapping(kv_law.geometry_from_header(header))}


def hf_local(dest: Path) -> dict:
    config = read_hf_config(str(dest / "config.json"), "model_file")
    weights = 0
    for shard in sorted(dest.glob("*.safetensors")):
        with open(shard, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
        weights += shard.stat().st_size - 8 - length  # the data section: every tensor's bytes
    return {"model_geometry": geometry_mapping(kv_law.geometry_from_hf_config(config)), "weights": weights}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part-mib", type=int, default=256, help="each GGUF part's size (sparse)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--hf-mem", help="an hf-mem executable (pip install hf-mem, in its own venv) to run against the same emulator")
    args = parser.parse_args()
    hub_emulator._HubHandler.setup = nodelay_setup
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-hub-pricing-", dir=args.workdir) as tmp:
        content = Path(tmp) / "content"
        started = time.perf_counter()
        gguf_files = write_split_gguf(content / "gguf-repo", args.part_mib)
        hf_files = write_safetensors_model(content / "hf-repo")
        emulator = hub_emulator.HubEmulator().start()
        try:
            for repo, directory, paths in ((GGUF_REPO, "gguf-repo", gguf_files), (HF_REPO, "hf-repo", hf_files)):
                for path in paths:
                    emulator.add_file(repo, path, content / directory / path, "git" if path.endswith(".json") else "lfs")
            print(f"# content written and served in {time.perf_counter() - started:.1f} s", file=sys.stderr)
            label = f"split GGUF, {PARTS} parts, {PARTS * TENSORS_PER_PART:,} tensors"
            rows.append(measure(emulator, label, GGUF_REPO, gguf_files[0], gguf_files, Path(tmp), args.repeat, gguf_local, args.hf_mem))
            label = f"safetensors, {len(hf_files) - 2} shards"
            rows.append(measure(emulator, label, HF_REPO, ".", hf_files, Path(tmp), args.repeat, hf_local, args.hf_mem))
        finally:
            emulator.stop()
    for row in rows:
        print(
            f"{row['model']}: {row['files']} files, {row['file_bytes']:,} bytes | Hub pricing {row['hub_bytes_read']:,} bytes in "
            f"{row['hub_requests']} requests, {row['hub_seconds'] * 1000:.1f} ms | download {row['download_bytes']:,} bytes in "
            f"{row['download_requests']} requests, {row['download_seconds']:.2f} s, then local pricing {row['local_pricing_seconds'] * 1000:.1f} ms | "
            f"{row['bytes_ratio']:,}x fewer bytes | shape keys as on disk: {row['same_shape_keys_as_on_disk']}"
        )
        print(f"  a mirror (no CDN redirect): {row['mirror_bytes_read']:,} bytes in {row['mirror_requests']} requests, {row['mirror_seconds'] * 1000:.1f} ms")
        if "hf_mem_bytes_read" in row:
            print(
                f"  hf-mem {row['hf_mem_version']}: {row['hf_mem_bytes_read']:,} bytes in {row['hf_mem_requests']} requests, "
                f"{row['hf_mem_seconds']:.2f} s (exit {row['hf_mem_exit']})"
            )
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0 if all(row["same_shape_keys_as_on_disk"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
