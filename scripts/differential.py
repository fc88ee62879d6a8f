#!/usr/bin/env python3
"""Differential harness for llama.cpp: random shapes on random tiny models, booted on the lab's
real llama-server, the engine's own memory lines stored as a corpus the replay test prices.

    scripts/differential.py -n 50 --seed 7        # 50 new cases, appended to the corpus
    scripts/differential.py --report              # the corpus replayed: per-term match rates

Each case: a model geometry drawn at random (lab/make_random_gguf.py; the model file itself stays
in .cache/differential/models and is never committed), a shape drawn over every key that changes
llama.cpp's accounting, the argv the collection builds for it (runtimes.registry.engine_argv),
a boot with `-lv 4` until the server listens (or exits: a refusal), SIGINT for the exit memory
breakdown, and the engine's memory lines verbatim. The corpus stores per model its GGUF header
(metadata without the vocabulary, tensor infos) and per case the shape and the lines:
tests/differential/corpus/llamacpp/models.jsonl and cases.jsonl, and the compute buffer's exact
bytes (a wrapper preloaded into the engine reads the scheduler's count, lab/shim/compute_bytes.c)
in compute_bytes.jsonl. Case ids are `seed:index`, so a rerun with the same seed skips what is
stored.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))
sys.path.insert(0, str(ROOT / ".collections"))

from make_random_gguf import RandomGeometry, draw_geometry, ensure_model  # noqa: E402

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_header  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import engine_argv  # noqa: E402

CORPUS = ROOT / "tests" / "differential" / "corpus" / "llamacpp"
MODELS = ROOT / ".cache" / "differential" / "models"
CONTAINERS_CONF = ROOT / "lab" / "containers.conf"
SHIM_SOURCE = ROOT / "lab" / "shim" / "compute_bytes.c"
SHIM = ROOT / ".cache" / "differential" / "compute_bytes_shim.so"
_SHIM_LINE = re.compile(r"frank-shim: compute buffer bytes = (\d+)")

CACHE_TYPES = ["f16", "f16", "f16", "q8_0", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "bf16", "f32"]
UBATCHES = [1, 7, 32, 64, 100, 128, 256, 384, 512, 512, 777, 1024]
BATCHES = [None, None, None, 64, 333, 512, 1024, 2048, 4096]

# The engine lines a ledger term comes from (the rest of a -lv 4 boot is dropped).
KEEP = re.compile(
    r"(^\d+\.\d+\.\d+\.\d+ E |padding|rounding|capping|Flash Attention|llama_context: |llama_kv_cache|llama_memory_recurrent|"
    r"load_tensors: .*buffer size|sched_reserve: .*(buffer|graph)|"
    r"common_memory_breakdown_print|common_params_print_info: build|error|failed|requires|not supported|exceeds|abort)",
    re.IGNORECASE,
)
# Kept lines that carry no term (metadata echoes, rope constants): dropped to keep the corpus small.
DROP = re.compile(r"(llama_model_loader: - kv|n_rot_[kv] =|freq_(base|scale)|causal_attn|constructing llama_context|srv +init: )")
_STAMP = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def engine_image() -> str:
    ref = subprocess.run([str(ROOT / "lab" / "lab.sh"), "image-ref", "engine-llamacpp"], capture_output=True, text=True, check=True).stdout.strip()
    if subprocess.run(["podman", "image", "exists", ref], env=_env(), check=False).returncode:
        raise SystemExit(f"the lab engine image {ref} is not built: run `make lab-up`")
    return ref


def draw_shape(rng: random.Random, geometry: RandomGeometry) -> dict[str, Any]:
    """A llama.cpp shape over every key that changes the engine's accounting."""
    end = rng.random()
    if end < 0.2:
        ctx = rng.randint(1, 400)
    elif end < 0.4:
        ctx = rng.randint(20_000, 40_000)
    else:
        ctx = rng.randint(257, 20_000)
    if rng.random() < 0.15:
        ctx = ctx // 256 * 256 or 256
    shape: dict[str, Any] = {
        "runtime": "llamacpp",
        "model_file": f"{geometry.name}.gguf",
        "served_id": "diff",
        "port": 18999,
        "ctx_size": ctx,
        "parallel": rng.choice([1, 1, 2, 3, 4, 5, 8]),
        "kv_unified": rng.random() < 0.3,
        "type_k": rng.choice(CACHE_TYPES),
        "ubatch": rng.choice(UBATCHES),
        "swa_full": geometry.sliding_window > 0 and rng.random() < 0.3,
        "n_gpu_layers": rng.choice([999, 999, 0, 1, geometry.n_layer]),
        "jinja": False,
    }
    shape["type_v"] = shape["type_k"] if rng.random() < 0.5 else rng.choice(CACHE_TYPES)
    batch = rng.choice(BATCHES)
    if batch is not None:
        shape["batch"] = batch
    fa = rng.choice([None, True, False])
    if fa is not None:
        shape["flash_attn"] = fa
    if fa is False and rng.random() < 0.7:
        shape["type_v"] = rng.choice(["f16", "bf16", "f32"])  # a quantised V without flash attention is refused: keep most boots
    if fa is False and geometry.n_head:
        # Without flash attention the KQ matrix is n_kv x ubatch x n_head x 4 B: keep a boot in the lab's RAM.
        n_kv = ((ctx + 255) // 256 * 256) if shape["kv_unified"] or shape["parallel"] == 1 else ctx
        while n_kv * shape["ubatch"] * geometry.n_head * 4 > (768 << 20):
            shape["ubatch"] = max(1, shape["ubatch"] // 2)
    return shape


def shim() -> Path:
    """The byte-count wrapper preloaded into the engine (lab/shim/compute_bytes.c), built once with
    the host's C compiler (the lab's engine image has none)."""
    if not SHIM.exists() or SHIM.stat().st_mtime < SHIM_SOURCE.stat().st_mtime:
        SHIM.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(SHIM), str(SHIM_SOURCE), "-ldl"], check=True)
    return SHIM


def compute_bytes(lines: list[str]) -> int | None:
    """The exact compute buffer the wrapper printed (the engine itself prints MiB to two decimals)."""
    found = [int(match.group(1)) for line in lines if (match := _SHIM_LINE.search(line))]
    return found[-1] if found else None


def boot(image: str, argv: list[str], timeout: float) -> tuple[list[str], bool, float, int | None]:
    """(the engine's kept lines, whether it served, seconds, the exact compute bytes) of one boot:
    until it listens or exits, then SIGINT for the exit memory breakdown; the container is removed
    in every case."""
    name = f"llm-fleet-diff-{uuid.uuid4().hex[:8]}"
    preload = ["-e", "LD_PRELOAD=/shim/compute_bytes.so", "-v", f"{shim()}:/shim/compute_bytes.so:ro"]
    cmd = ["podman", "run", "--rm", "--name", name, "--network", "none", *preload, "-v", f"{MODELS}:/models:ro", image, *argv]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    lines: list[str] = []
    served = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "listening on" in line:
                served.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    deadline = start + timeout
    while time.monotonic() < deadline and not served.is_set() and proc.poll() is None:
        time.sleep(0.05)
    if served.is_set():
        subprocess.run(["podman", "kill", "--signal", "INT", name], capture_output=True, env=_env(), check=False)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, env=_env(), check=False)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    thread.join(timeout=5)
    kept = [_STAMP.sub("", line) for line in lines if KEEP.search(line) and not DROP.search(line) and not _SHIM_LINE.search(line)]
    return kept, served.is_set(), time.monotonic() - start, compute_bytes(lines)


def header_record(path: Path, geometry: RandomGeometry) -> dict[str, Any]:
    """What the ledger needs of a model: its metadata (without the vocabulary's arrays) and its
    tensor infos (name, dims, ggml type, offset), plus the generator's own parameters."""
    header = read_header(path)
    metadata = {k: v for k, v in header.metadata.items() if not k.startswith("tokenizer.") or k == "tokenizer.ggml.model"}
    metadata["tokenizer.ggml.tokens.count"] = geometry.n_vocab
    return {
        "model": geometry.name,
        "generator": dict(vars(geometry)),
        "file_size": header.file_size,
        "data_offset": header.data_offset,
        "metadata": metadata,
        "tensors": [[t.name, list(t.shape), t.ggml_type, t.offset] for t in header.tensors],
    }


def _stored(path: Path, key: str) -> set[str]:
    if not path.exists():
        return set()
    return {json.loads(line)[key] for line in path.read_text().splitlines() if line.strip()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20, help="cases to draw (default 20)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shapes-per-model", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=45, help="seconds one boot may take (default 45)")
    parser.add_argument("--report", action="store_true", help="replay the stored corpus (no lab): per-term match rates and worst cases")
    args = parser.parse_args(argv)
    if args.report:
        sys.path.insert(0, str(ROOT / "tests" / "differential"))
        from corpus_replay import report

        print(report())
        return 0
    image = engine_image()
    CORPUS.mkdir(parents=True, exist_ok=True)
    cases_path, models_path = CORPUS / "cases.jsonl", CORPUS / "models.jsonl"
    have_cases, have_models = _stored(cases_path, "id"), _stored(models_path, "model")
    rng = random.Random(args.seed)
    geometry = draw_geometry(rng)
    for index in range(args.n):
        if index and index % args.shapes_per_model == 0:
            (MODELS / f"{geometry.name}.gguf").unlink(missing_ok=True)  # regenerated from the seed when needed
            geometry = draw_geometry(rng)
        shape = draw_shape(rng, geometry)
        case_id = f"{args.seed}:{index}"
        if case_id in have_cases:
            continue
        path = ensure_model(geometry, MODELS)
        if geometry.name not in have_models:
            with models_path.open("a") as out:
                out.write(json.dumps(header_record(path, geometry), sort_keys=True, separators=(",", ":")) + "\n")
            have_models.add(geometry.name)
        command = [*engine_argv(shape, "/models")[1:], "--log-verbosity", "4", "--no-webui"]
        lines, served, seconds, exact = boot(image, command, args.timeout)
        if not any("print_info: build" in line for line in lines):
            print(f"[differential] {case_id}: the container did not start (not the engine's answer); nothing stored", file=sys.stderr, flush=True)
            continue
        version = next((line.split("print_info: ", 1)[1] for line in lines if "print_info: build" in line), "")
        if any("no space left" in line.lower() for line in lines):
            raise SystemExit(f"{case_id}: the boot ran out of disk space; nothing stored")
        case = {"id": case_id, "model": geometry.name, "shape": shape, "argv": command, "served": served, "engine": version, "lines": lines}
        with cases_path.open("a") as out:
            out.write(json.dumps(case, sort_keys=True, separators=(",", ":")) + "\n")
        if served and exact is not None:
            with (CORPUS / "compute_bytes.jsonl").open("a") as out:
                out.write(json.dumps({"id": case_id, "compute_bytes": exact}, sort_keys=True) + "\n")
        print(f"[differential] {case_id} {geometry.name} {'served' if served else 'REFUSED'} in {seconds:.1f}s", file=sys.stderr, flush=True)
    (MODELS / f"{geometry.name}.gguf").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
