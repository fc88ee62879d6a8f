#!/usr/bin/env python3
"""Grow the vLLM differential corpus: random shapes on tiny random models, booted for real.

Each case draws a tiny Hugging Face llama of random geometry (layers, heads, KV heads, head dim,
a sliding-window layer mix, vocabulary; lab/make_tiny_hf.py writes it) and a random shape over
the keys that move vLLM's KV accounting (max_model_len, odd ones and ones at the pool's edge;
max_num_seqs; kv_cache_dtype; --kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE;
max_num_batched_tokens; --block-size), boots the lab's vLLM engine image on it with the argv the
collection builds (runtimes/vllm.py `vllm_argv`), reads the engine's own lines until it prints
its KV capacity or refuses, removes the container, and stores the case as one JSON file under
tests/differential/corpus/vllm/. tests/differential/test_vllm_corpus.py replays every stored
case through the budget gate.

    scripts/differential_vllm.py -n 10 [--jobs 2] [--seed S]     # `make differential-vllm N=10`
    scripts/differential_vllm.py --report                         # match rate and worst case, no boot

Nothing here predicts the engine: the pool sizes near the edge are drawn from a rough estimate,
and what is stored is what the engine printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT / "lab"))
sys.path.insert(0, str(ROOT / "tests" / "differential"))

import make_tiny_hf  # noqa: E402
from vllm_support import CORPUS, LINE_PATTERNS, load_cases, report  # noqa: E402

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.vllm import vllm_argv  # noqa: E402

MODELS = ROOT / ".cache" / "differential" / "vllm-models"  # the drawn models (a case seed redraws its own)
IMAGE_FACT = ROOT / ".lab" / "facts" / "engine-vllm.image"
BOOT_TIMEOUT = 420
# The lines that end a boot for the harness: the capacity line, or a refusal / failure.
DONE = re.compile(r"KV cache size:|EngineCore failed to start|Engine core initialization failed|Traceback \(most recent")
# Head dims the CPU attention backend accepts (cpu_attn.py: get_supported_head_sizes), the
# ones whose block of 32 also takes an fp8 cache.
HEAD_DIMS = (32, 64, 128)
CONTAINER_PREFIX = "llmfleet-diff-vllm-"


def draw_geometry(rng: random.Random) -> make_tiny_hf.TinyGeometry:
    layers = rng.choice((1, 2, 2, 3, 4, 5, 6))
    kv_heads = rng.choice((1, 1, 2, 2, 4, 8))
    heads = kv_heads * rng.choice((1, 2, 4))
    head_dim = rng.choice(HEAD_DIMS)
    layer_types = None
    window = None
    if layers > 1 and rng.random() < 0.35:
        kinds = [rng.choice(("full_attention", "sliding_attention")) for _index in range(layers)]
        kinds[-1] = "full_attention"  # at least one full layer
        layer_types = tuple(kinds)
        window = rng.choice((32, 100, 127, 128, 256, 511, 1024, 4096))
    return make_tiny_hf.TinyGeometry(
        hidden=rng.choice((64, 128)),
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=128,
        layer_types=layer_types,
        sliding_window=window,
        vocab_pad=rng.choice((0, 0, 1, 37, 512)),
        max_positions=65536,
        seed=rng.randrange(1 << 31),
    )


def model_geometry(geo: make_tiny_hf.TinyGeometry) -> dict:
    """The geometry as the budget's `model_geometry` (budget/geometry.py)."""
    spec: dict = {"n_layer": geo.layers, "n_head_kv": geo.kv_heads, "head_dim": geo.head_dim}
    if geo.layer_types is not None:
        spec["layer_kinds"] = ["swa" if kind == "sliding_attention" else "full" for kind in geo.layer_types]
        spec["sliding_window"] = geo.sliding_window
    return spec


def model_name(geo: make_tiny_hf.TinyGeometry) -> str:
    digest = hashlib.sha1(json.dumps(asdict(geo), sort_keys=True).encode()).hexdigest()[:10]
    return f"tiny-llama-hf-l{geo.layers}h{geo.heads}kv{geo.kv_heads}d{geo.head_dim}-{digest}"


def draw_shape(rng: random.Random, geo: make_tiny_hf.TinyGeometry, name: str) -> tuple[dict, dict]:
    """The shape (gate keys) and the engine environment for one case."""
    block = rng.choice((None, None, None, 32, 64, 256))
    dtype = rng.choices(("auto", "fp8", "fp8_e5m2", "bfloat16", "bf16"), (6, 3, 1, 1, 1))[0]
    max_len = rng.choice(
        (
            rng.randrange(1, 300),
            rng.randrange(300, 9000),
            rng.choice((127, 128, 129, 255, 256, 257, 1000, 2048, 4095, 4096, 4097, 8191)),
            rng.randrange(9000, 40000),
        )
    )
    seqs = rng.choice((1, 1, 2, 3, 4, 7, 8))
    shape: dict = {
        "runtime": "vllm",
        "model_file": name,
        "served_id": "diff",
        "port": 8000,
        "max_model_len": max_len,
        "max_num_seqs": seqs,
        "kv_cache_dtype": dtype,
        "extra_args": ["--enforce-eager"],
    }
    if rng.random() < 0.4:
        shape["max_num_batched_tokens"] = max(seqs, rng.choice((64, 100, 256, 512, 2048, 4096, max_len)))
    if block is not None:
        shape["extra_args"] += ["--block-size", str(block)]
    env: dict = {}
    # A rough per-block price for drawing pools near the edge (never the expectation).
    elem = 1 if dtype.startswith("fp8") else 2
    bs = block or 128
    per_block = geo.layers * bs * geo.kv_heads * 2 * geo.head_dim * elem
    need = -(-max_len // bs) + 1
    mode = rng.random()
    if mode < 0.12:
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    elif mode < 0.6:
        shape["kv_cache_memory_bytes"] = max(per_block // 3, (need + rng.randint(-2, 2)) * per_block + rng.randint(-per_block // 2, per_block // 2))
    else:
        shape["kv_cache_memory_bytes"] = rng.randrange(per_block, 64 * need * per_block + 2)
    return shape, env


def read_version(image: str) -> str:
    out = subprocess.run(
        ["podman", "run", "--rm", "--entrypoint", "/opt/vllm/bin/python", image, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def boot(image: str, model_dir: Path, argv: list[str], env: dict, tag: str) -> tuple[list[str], float]:
    """Run the engine until it prints its capacity or fails; the log's lines and the seconds."""
    name = CONTAINER_PREFIX + tag
    cmd = ["podman", "run", "-d", "--name", name, "--network", "none", "--shm-size", "1g", "-v", f"{model_dir}:/models/{model_dir.name}:ro"]
    for key, value in env.items():
        cmd += ["-e", f"{key}={value}"]
    subprocess.run(["podman", "rm", "-f", name], capture_output=True, check=False)
    subprocess.run([*cmd, image, *argv], capture_output=True, text=True, check=True)
    start = time.monotonic()
    log = ""
    try:
        while time.monotonic() - start < BOOT_TIMEOUT:
            time.sleep(3)
            log = subprocess.run(["podman", "logs", name], capture_output=True, text=True, check=False).stdout
            log += subprocess.run(["podman", "logs", name], capture_output=True, text=True, check=False).stderr
            running = subprocess.run(["podman", "inspect", "-f", "{{.State.Running}}", name], capture_output=True, text=True, check=False).stdout.strip()
            if DONE.search(log) or running != "true":
                time.sleep(2)  # the rest of a traceback
                log = subprocess.run(["podman", "logs", name], capture_output=True, text=True, check=False)
                log = log.stdout + log.stderr
                break
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, check=False)
    return log.splitlines(), time.monotonic() - start


def keep_lines(lines: list[str]) -> list[str]:
    """The engine's own lines the replay reads (deduplicated, in order, prefixes stripped)."""
    kept: list[str] = []
    for line in lines:
        if any(p.search(line) for p in LINE_PATTERNS):
            text = re.sub(r"^\((?:APIServer|EngineCore|Worker|VllmWorker)[^)]*\)\s*", "", line.strip())
            text = re.sub(r"^(INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d ", r"\1 ", text)
            if text not in kept:
                kept.append(text)
    return kept


def run_case(case_seed: int, image: str, version: str) -> dict:
    rng = random.Random(case_seed)
    geo = draw_geometry(rng)
    name = model_name(geo)
    model_dir = MODELS / name
    if not model_dir.exists():
        MODELS.mkdir(parents=True, exist_ok=True)
        make_tiny_hf.write_model(model_dir, geo)
    shape, env = draw_shape(rng, geo, name)
    argv = vllm_argv(parse_shape(shape), "/models")
    tag = f"{case_seed:08x}"
    lines, seconds = boot(image, model_dir, argv, env, tag)
    case = {
        "id": tag,
        "engine": {"name": "vllm-cpu", "version": version, "image": image},
        "model_config": json.loads((model_dir / "config.json").read_text()),
        "model_geometry": model_geometry(geo),
        "shape": shape,
        "environment": env,
        "argv": argv,
        "boot_seconds": round(seconds),
        "lines": keep_lines(lines),
    }
    return case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=1, help="cases to draw and boot")
    parser.add_argument("--jobs", type=int, default=2, help="boots at once")
    parser.add_argument("--seed", type=int, default=None, help="the first case's seed (default: random)")
    parser.add_argument("--report", action="store_true", help="boot nothing: replay the corpus, print the match rate and the worst case")
    args = parser.parse_args(argv)
    if args.report:
        print(report(load_cases()))
        return 0
    os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "lab" / "containers.conf"))
    if not IMAGE_FACT.exists():
        print(f"no engine image: {IMAGE_FACT} is missing (make lab-up builds it)", file=sys.stderr)
        return 2
    image = IMAGE_FACT.read_text().strip()
    version = read_version(image)
    base = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    seeds = [(base + 7919 * i) % (1 << 32) for i in range(args.n)]
    CORPUS.mkdir(parents=True, exist_ok=True)

    def one(seed: int) -> str:
        try:
            case = run_case(seed, image, version)
        except Exception as exc:  # one failed draw must not lose the others
            return f"{seed:08x}: harness error {exc!r}"
        path = CORPUS / f"{case['id']}.json"
        text = json.dumps(case, indent=1, sort_keys=True) + "\n"
        with tempfile.NamedTemporaryFile("w", dir=CORPUS, delete=False, suffix=".tmp") as handle:
            handle.write(text)
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, path)
        last = next((line for line in reversed(case["lines"]) if "KV cache size" in line or "Error" in line), "(no capacity line)")
        return f"{case['id']}: {case['boot_seconds']}s {last[:160]}"

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for result in pool.map(one, seeds):
            print(result, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
