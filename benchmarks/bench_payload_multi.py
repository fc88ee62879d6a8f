#!/usr/bin/env python3
"""Multi-connection fetch+verify against a CDN that caps each connection, side by side, one run.

The Hub emulator serves one file from a tmpfs with a per-connection cap (like a CDN) and an
aggregate cap above it; every client writes into the tmpfs too, so the figures compare network
clients, not disks. Each row is fetch + sha256 of the same file:
- ours: hf_payload_gate's fetch over C ranged connections, hashed in the same pass (C swept);
- curl, one stream, then `sha256sum`;
- `aria2c -xC -sC`, then `sha256sum` (when aria2c is installed);
- hf_transfer with C files in flight, then `sha256sum` (when `import hf_transfer` works; give
  --hf-transfer-path for a `pip install --target` copy).
Goals: ours >= aria2c at the same C, ours >= 0.9x the aggregate cap, ours (fetch+verify) faster
than aria2c + sha256sum.
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

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import build_manifest, fetch_payload  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient  # noqa: E402
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.ranged import PIECE_SIZE  # noqa: E402

MIB = 1 << 20


def sha256sum(path: Path) -> str:
    return subprocess.run(["sha256sum", str(path)], check=True, capture_output=True, text=True).stdout.split()[0]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def two_step(fetch, path: Path, truth: str) -> tuple[float, float]:
    """(fetch seconds, sha256sum seconds) of a client that does not hash."""
    fetch_s = timed(fetch)
    start = time.perf_counter()
    assert sha256sum(path) == truth, f"{path}: wrong bytes"
    return fetch_s, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--per-connection-mib-s", type=float, default=32)
    parser.add_argument("--aggregate-mib-s", type=float, default=192)
    parser.add_argument("--connections", default="1,2,4,8,16", help="C values for ours (comma-separated)")
    parser.add_argument("--piece-mib", type=int, default=PIECE_SIZE // MIB, help="piece size of ours")
    parser.add_argument("--others", action=argparse.BooleanOptionalAction, default=True, help="also time curl, aria2c and hf_transfer")
    parser.add_argument("--compare-at", type=int, default=8, help="C for aria2c and hf_transfer")
    parser.add_argument("--workdir", type=Path, default=Path("/dev/shm"), help="a tmpfs (default /dev/shm)")
    parser.add_argument("--hf-transfer-path", help="a directory holding the hf_transfer package")
    args = parser.parse_args()
    cap = args.aggregate_mib_s
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        source = work / "source.bin"
        with open(source, "wb") as handle:
            for _chunk in range(args.size_mib // 16):
                handle.write(os.urandom(16 * MIB))
        size = source.stat().st_size
        truth = sha256sum(source)
        emulator = HubEmulator(per_connection_rate=args.per_connection_mib_s * MIB, aggregate_rate=cap * MIB)
        emulator.add_file("bench/multi", "model.gguf", source, "lfs")
        rows: list[tuple[str, float, float]] = []
        load = os.getloadavg()
        with emulator:
            client = HubClient(emulator.hub_url)
            manifest = build_manifest(client, "bench/multi", "main")
            cdn_url = f"{emulator.lfs_url}/lfs/{manifest.files[0].sha256}"
            out = work / "out"

            def fresh() -> None:
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()

            print(
                f"file {size / MIB:.0f} MiB in {args.workdir} (tmpfs); emulator caps: {args.per_connection_mib_s:.0f} MiB/s per connection, "
                f"{cap:.0f} MiB/s aggregate; every row ends with the file's sha256 checked"
            )
            for connections in (int(c) for c in args.connections.split(",")):
                fresh()

                def ours(c: int = connections) -> None:
                    [result] = fetch_payload(client, manifest, str(out), connections=c, piece_size=args.piece_mib * MIB)
                    assert result.action == "fetched" and result.sha256 == truth, result.detail

                rows.append((f"ours, {connections} connection{'s' if connections > 1 else ''} (hash in the same pass)", timed(ours), 0.0))

            c = args.compare_at
            if args.others:
                fresh()

                def curl() -> None:
                    subprocess.run(["curl", "-sS", "-o", str(out / "curl.bin"), cdn_url], check=True)

                rows.append(("curl, 1 stream, then sha256sum", *two_step(curl, out / "curl.bin", truth)))

                if shutil.which("aria2c"):
                    fresh()

                    def aria2() -> None:
                        subprocess.run(
                            ["aria2c", f"-x{c}", f"-s{c}", "-q", "--file-allocation=none", "--allow-overwrite=true", "-d", str(out), "-o", "aria.bin", cdn_url],
                            check=True,
                        )

                    rows.append((f"aria2c -x{c} -s{c}, then sha256sum", *two_step(aria2, out / "aria.bin", truth)))
                else:
                    print("aria2c: not installed (apt-get install aria2)")
                # In a child process: hf_transfer.download holds the GIL, which would stall the emulator's
                # threads in this one.
                hf_path = os.pathsep.join(p for p in (args.hf_transfer_path, os.environ.get("PYTHONPATH")) if p)
                probe_env = {**os.environ, "PYTHONPATH": hf_path}
                probe = subprocess.run([sys.executable, "-c", "import hf_transfer"], env=probe_env, capture_output=True, check=False)
                if probe.returncode == 0:
                    fresh()
                    code = f"import hf_transfer; hf_transfer.download({cdn_url!r}, {str(out / 'hft.bin')!r}, max_files={c}, chunk_size={10 * MIB})"

                    def transfer() -> None:
                        subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": hf_path}, check=True, timeout=600)

                    rows.append((f"hf_transfer, {c} in flight, then sha256sum", *two_step(transfer, out / "hft.bin", truth)))
                else:
                    print("hf_transfer: not importable (pip install hf_transfer, or --hf-transfer-path)")

        print(f"load average before: {load[0]:.2f} (2 shared cores: the verify column is CPU-bound and moves with it)")
        print("| client | fetch s | verify s | fetch MiB/s | fetch+verify s | fetch+verify MiB/s | x cap |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, fetch_s, verify_s in rows:
            total = fetch_s + verify_s
            rate = size / MIB / total
            print(f"| {name} | {fetch_s:.2f} | {verify_s:.2f} | {size / MIB / fetch_s:.1f} | {total:.2f} | {rate:.1f} | {rate / cap:.2f} |")
        figures = {name: (fetch_s, verify_s) for name, fetch_s, verify_s in rows}
        ours_at = figures.get(f"ours, {c} connections (hash in the same pass)")
        aria_at = figures.get(f"aria2c -x{c} -s{c}, then sha256sum")
        if ours_at and aria_at:
            ours_rate, aria_rate = size / MIB / ours_at[0], size / MIB / aria_at[0]
            print(
                f"goals at C={c}: ours fetch+verify {ours_rate:.1f} MiB/s >= aria2c fetch alone {aria_rate:.1f} MiB/s: {ours_rate >= aria_rate}; "
                f"ours {ours_rate / cap:.2f}x the aggregate cap (>= 0.9: {ours_rate / cap >= 0.9}); "
                f"ours {sum(aria_at) / ours_at[0]:.2f}x faster than aria2c + sha256sum (> 1: {sum(aria_at) > ours_at[0]})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
