#!/usr/bin/env python3
"""hf_payload_gate benchmarks, all from one run.

(a) size gate over 144 sparse files totalling 191,919,144,448 bytes: wall time and the file data
    bytes read (from /proc/self/io; must be 0). Goal: under 50 ms.
(b) sha256 of one 2 GiB file: ours vs `sha256sum` vs `openssl dgst -sha256` (the CPU's hashing
    limit), and ours over two 2 GiB files in parallel. Goals: >= 0.95x openssl for one file,
    >= 1.8x openssl's single-stream rate with two files on two cores.
(c) loopback fetch-and-verify of the 2 GiB file from the Hub emulator (sendfile) vs `curl` alone
    vs `curl` then `openssl dgst`, over one stream (connections 1, the figure that must not
    regress) and over the default connections (no cap: CPU-bound here). Goals: >= 0.9x curl alone,
    and faster than the two-step. Multi-connection figures against a capped CDN:
    bench_payload_multi.py.
Page caches are warmed first so that the figures compare CPU work, not the disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT / "lab"))

from hub_emulator import HubEmulator  # noqa: E402

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import DEFAULT_CONNECTIONS, build_manifest, fetch_payload  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import Manifest, ManifestFile  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import sha256_path, verify_payload  # noqa: E402

GIB = 1 << 30
TOTAL = 191_919_144_448
PARTS = 144


def io_counters() -> dict[str, int]:
    with open("/proc/self/io") as handle:
        return {k: int(v) for k, v in (line.split(":") for line in handle)}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best(fn, runs: int = 3) -> float:
    return min(timed(fn) for _run in range(runs))


def run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def bench_size_gate(work: Path) -> None:
    dest = work / "sparse"
    dest.mkdir()
    base = TOTAL // PARTS
    files = []
    for index in range(PARTS):
        size = base + (TOTAL - base * PARTS if index == PARTS - 1 else 0)
        name = f"model-{index + 1:05d}-of-{PARTS:05d}.gguf"
        with open(dest / name, "wb") as handle:
            handle.truncate(size)
        files.append(ManifestFile(name, size, "0" * 64, True))
    manifest = Manifest("bench/sparse", "0" * 40, files)
    assert manifest.total_bytes == TOTAL
    verify_payload(manifest, str(dest))  # warm the dentry cache once
    probe = io_counters()
    before = io_counters()
    counter_cost = before["rchar"] - probe["rchar"]  # reading /proc/self/io itself counts
    elapsed = best(lambda: verify_payload(manifest, str(dest)), 5)
    after = io_counters()
    ok = all(v.ok for v in verify_payload(manifest, str(dest)))
    read = after["read_bytes"] - before["read_bytes"]
    syscall_read = after["rchar"] - before["rchar"] - counter_cost
    print(
        f"(a) size gate, {PARTS} files, {TOTAL:,} bytes: {elapsed * 1000:.2f} ms (goal < 50 ms); all ok: {ok}; "
        f"file data read: {read} bytes from disk, {syscall_read} bytes via read() (goal 0)"
    )


def bench_hash(big: Path, big2: Path) -> float:
    ours = best(lambda: sha256_path(str(big)))
    coreutils = best(lambda: run(["sha256sum", str(big)]), 1)
    openssl = best(lambda: run(["openssl", "dgst", "-sha256", str(big)]))
    size = big.stat().st_size
    manifest = Manifest("bench/two", "0" * 40, [ManifestFile(big.name, size), ManifestFile(big2.name, size)])

    def two() -> None:
        verify_payload(manifest, str(big.parent), check_hash=True, workers=2)

    # check_hash needs sha256 in the manifest to hash; give the real ones.
    sha = sha256_path(str(big))
    sha2 = sha256_path(str(big2))
    manifest.files = [ManifestFile(big.name, size, sha), ManifestFile(big2.name, size, sha2)]
    (big.parent / ".llm-fleet-verified.json").unlink(missing_ok=True)
    parallel = best(two)

    def rate(seconds: float, n: int = 1) -> float:
        return n * size / GIB / seconds

    r_openssl = rate(openssl)
    print(
        f"(b) sha256 of {size / GIB:.0f} GiB: ours {rate(ours):.2f} GiB/s ({rate(ours) / r_openssl:.2f}x openssl, goal >= 0.95x), "
        f"sha256sum {rate(coreutils):.2f} GiB/s, openssl {r_openssl:.2f} GiB/s; "
        f"two files in parallel: ours {rate(parallel, 2):.2f} GiB/s ({rate(parallel, 2) / r_openssl:.2f}x openssl single-stream, goal >= 1.8x)"
    )
    return r_openssl


def bench_fetch(work: Path, big: Path) -> None:
    emulator = HubEmulator()
    emulator.add_file("bench/big", big.name, big, "lfs")
    emulator.start()
    try:
        client = HubClient(emulator.hub_url)
        manifest = build_manifest(client, "bench/big", "main")
        size = manifest.total_bytes
        dest = work / "fetched"
        out = work / "curl.bin"
        cdn_url = f"{emulator.lfs_url}/lfs/{manifest.files[0].sha256}"

        def ours(connections: int = 1) -> None:
            shutil.rmtree(dest, ignore_errors=True)
            [result] = fetch_payload(client, manifest, str(dest), connections=connections)
            assert result.action == "fetched", result.detail

        def curl() -> None:
            out.unlink(missing_ok=True)
            run(["curl", "-sS", "-L", "-o", str(out), client.resolve_url("bench/big", manifest.revision, big.name)])

        def curl_then_openssl() -> None:
            curl()
            run(["openssl", "dgst", "-sha256", str(out)])

        t_ours, t_curl, t_two = best(ours), best(curl), best(curl_then_openssl)
        t_multi = best(lambda: ours(DEFAULT_CONNECTIONS))

        def rate(seconds: float) -> float:
            return size / GIB / seconds

        print(
            f"(c) loopback fetch of {size / GIB:.0f} GiB ({cdn_url.split('/lfs/')[0]}): ours fetch+verify {rate(t_ours):.2f} GiB/s "
            f"({t_curl / t_ours:.2f}x curl alone, goal >= 0.9x), curl alone {rate(t_curl):.2f} GiB/s, "
            f"curl + openssl {rate(t_two):.2f} GiB/s (ours {t_two / t_ours:.2f}x faster, goal > 1x); "
            f"ours over {DEFAULT_CONNECTIONS} connections (uncapped loopback) {rate(t_multi):.2f} GiB/s"
        )
    finally:
        emulator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=int, default=2)
    parser.add_argument("--workdir", type=Path, help="where the test files go (default: a temp dir under /var/tmp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir or "/var/tmp") as tmp:
        work = Path(tmp)
        bench_size_gate(work)
        hashed = work / "hash"
        hashed.mkdir()
        big, big2 = hashed / "a.bin", hashed / "b.bin"
        for path in (big, big2):
            with open(path, "wb") as handle:
                for _chunk in range(args.size_gib * 16):
                    handle.write(os.urandom(64 << 20))
            run(["cat", str(path)])  # warm the page cache
        bench_hash(big, big2)
        bench_fetch(work, big)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
