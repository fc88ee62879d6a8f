#!/usr/bin/env python3
"""A/B of the single-stream fetch+verify between checkouts, interleaved, on a loaded host.

Absolute rates move with the host's load from one run to the next, so a regression check compares
each checkout's ratio to `curl` measured in the same child process, and alternates the checkouts:
    python benchmarks/bench_payload_single_ab.py /path/to/main /path/to/branch --rounds 4
Each child imports the payload code and the Hub emulator from its own checkout, serves a file from
a tmpfs (uncapped loopback, sendfile) and prints the best of three of ours (one connection) and of
`curl -L` alone.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import inspect, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path
root, size_mib = sys.argv[1], int(sys.argv[2])
sys.path[:0] = [f"{root}/.collections", f"{root}/lab"]
from hub_emulator import HubEmulator
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import build_manifest, fetch_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient
one_stream = {"connections": 1} if "connections" in inspect.signature(fetch_payload).parameters else {}
work = Path(tempfile.mkdtemp(dir="/dev/shm"))
try:
    source = work / "source.bin"
    with open(source, "wb") as handle:
        for _chunk in range(size_mib // 16):
            handle.write(os.urandom(16 << 20))
    emulator = HubEmulator()
    emulator.add_file("bench/ab", "model.gguf", source, "lfs")
    with emulator:
        client = HubClient(emulator.hub_url)
        manifest = build_manifest(client, "bench/ab", "main")

        def ours():
            shutil.rmtree(work / "out", ignore_errors=True)
            start = time.perf_counter()
            [result] = fetch_payload(client, manifest, str(work / "out"), **one_stream)
            assert result.action == "fetched", result.detail
            return time.perf_counter() - start

        def curl():
            start = time.perf_counter()
            url = client.resolve_url("bench/ab", manifest.revision, "model.gguf")
            subprocess.run(["curl", "-sS", "-L", "-o", str(work / "curl.bin"), url], check=True)
            return time.perf_counter() - start

        t_ours, t_curl = min(ours() for _ in range(3)), min(curl() for _ in range(3))
    print(f"{size_mib / 1024 / t_ours:.2f} {size_mib / 1024 / t_curl:.2f} {t_curl / t_ours:.2f}")
finally:
    shutil.rmtree(work)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkouts", nargs=2, type=Path, help="A and B: checkouts with .collections set up")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--size-mib", type=int, default=512)
    args = parser.parse_args()
    ratios: dict[Path, list[float]] = {path: [] for path in args.checkouts}
    print("| round | checkout | ours one stream GiB/s | curl alone GiB/s | ours / curl |")
    print("|---:|---|---:|---:|---:|")
    for round_no in range(1, args.rounds + 1):
        for path in args.checkouts:
            out = subprocess.run([sys.executable, "-c", CHILD, str(path.resolve()), str(args.size_mib)], check=True, capture_output=True, text=True)
            ours, curl, ratio = out.stdout.split()
            ratios[path].append(float(ratio))
            print(f"| {round_no} | {path} | {ours} | {curl} | {ratio} |", flush=True)
    for path, values in ratios.items():
        print(f"{path}: ours / curl, mean of {len(values)}: {sum(values) / len(values):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
