#!/usr/bin/env python3
"""Multi-connection fetch+verify against a CDN that caps each connection, side by side.

The Hub emulator serves one file with a per-connection cap (like a CDN) and an aggregate cap above
it, from the work directory, where every client writes too: a tmpfs by default (/dev/shm: the
figures compare network clients), or a real disk with --workdir (`findmnt -T DIR` says which).
Each row is fetch + sha256 of the same file:
- ours: hf_payload_gate's fetch over C ranged connections, hashed in the same pass (C swept);
- curl, one stream, then `sha256sum`;
- `aria2c -xC -sC`, then `sha256sum` (when aria2c is installed);
- hf_transfer with C files in flight, then `sha256sum` (when `import hf_transfer` works; give
  --hf-transfer-path for a `pip install --target` copy).
Goals: ours >= aria2c at the same C, ours >= 0.9x the aggregate cap, ours (fetch+verify) faster
than aria2c + sha256sum. --runs N repeats everything N times (the clients interleaved within each
run) and ends with each client's min/median/max fetch+verify rate and the goals per run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
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
    parser.add_argument("--workdir", type=Path, default=Path("/dev/shm"), help="where the file is served from and written (default /dev/shm, a tmpfs)")
    parser.add_argument("--runs", type=int, default=1, help="repeat every client this many times (default 1)")
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
        rows: list[tuple[int, str, float, float]] = []  # (run, client, fetch s, verify s)
        load = os.getloadavg()
        c = args.compare_at
        with emulator:
            client = HubClient(emulator.hub_url)
            manifest = build_manifest(client, "bench/multi", "main")
            cdn_url = f"{emulator.lfs_url}/lfs/{manifest.files[0].sha256}"
            out = work / "out"

            def fresh() -> None:
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()

            fstype = (
                subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", str(args.workdir)], capture_output=True, text=True, check=False)
                .stdout.split("\n")[0]
                .strip()
            )
            print(
                f"file {size / MIB:.0f} MiB in {args.workdir} ({fstype or 'filesystem unknown'}); emulator caps: {args.per_connection_mib_s:.0f} MiB/s "
                f"per connection, {cap:.0f} MiB/s aggregate; every row ends with the file's sha256 checked; {args.runs} run(s)"
            )
            for run in range(1, args.runs + 1):
                for connections in (int(n) for n in args.connections.split(",")):
                    fresh()

                    def ours(n: int = connections) -> None:
                        [result] = fetch_payload(client, manifest, str(out), connections=n, piece_size=args.piece_mib * MIB)
                        assert result.action == "fetched" and result.sha256 == truth, result.detail

                    rows.append((run, f"ours, {connections} connection{'s' if connections > 1 else ''} (hash in the same pass)", timed(ours), 0.0))
                if args.others:
                    rows.extend((run, name, *figures) for name, figures in _others(args, c, cdn_url, out, fresh, truth))
                fresh()  # the last client's copy leaves the page cache to the next run

        print(f"load average before: {load[0]:.2f} (2 shared cores: the verify column is CPU-bound and moves with it)")
        print("| run | client | fetch s | verify s | fetch MiB/s | fetch+verify s | fetch+verify MiB/s | x cap |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        for run, name, fetch_s, verify_s in rows:
            total = fetch_s + verify_s
            rate = size / MIB / total
            print(f"| {run} | {name} | {fetch_s:.2f} | {verify_s:.2f} | {size / MIB / fetch_s:.1f} | {total:.2f} | {rate:.1f} | {rate / cap:.2f} |")
        names = list(dict.fromkeys(name for _run, name, _f, _v in rows))
        print(f"\nfetch+verify MiB/s over {args.runs} run(s), {args.workdir} ({fstype}):")
        print("| client | min | median | max |")
        print("|---|---:|---:|---:|")
        for name in names:
            rates = [size / MIB / (f + v) for _run, n, f, v in rows if n == name]
            print(f"| {name} | {min(rates):.1f} | {statistics.median(rates):.1f} | {max(rates):.1f} |")
        ours_name, aria_name = f"ours, {c} connections (hash in the same pass)", f"aria2c -x{c} -s{c}, then sha256sum"
        wins = 0
        for run in range(1, args.runs + 1):
            figures = {name: (f, v) for r, name, f, v in rows if r == run}
            ours_at, aria_at = figures.get(ours_name), figures.get(aria_name)
            if not (ours_at and aria_at):
                continue
            ours_rate, aria_rate = size / MIB / ours_at[0], size / MIB / aria_at[0]
            wins += sum(aria_at) > ours_at[0]
            print(
                f"run {run} goals at C={c}: ours fetch+verify {ours_rate:.1f} MiB/s >= aria2c fetch alone {aria_rate:.1f} MiB/s: {ours_rate >= aria_rate}; "
                f"ours {ours_rate / cap:.2f}x the aggregate cap (>= 0.9: {ours_rate / cap >= 0.9}); "
                f"ours {sum(aria_at) / ours_at[0]:.2f}x faster than aria2c + sha256sum (> 1: {sum(aria_at) > ours_at[0]})"
            )
        if any(name == aria_name for name in names):
            print(f"ours fetch+verify faster than aria2c + sha256sum at C={c} in {wins} of {args.runs} runs")
    return 0


def _others(args: argparse.Namespace, c: int, cdn_url: str, out: Path, fresh, truth: str) -> list[tuple[str, tuple[float, float]]]:
    """curl, aria2c and hf_transfer, each followed by sha256sum: (client, (fetch s, verify s))."""
    rows: list[tuple[str, tuple[float, float]]] = []
    fresh()

    def curl() -> None:
        subprocess.run(["curl", "-sS", "-o", str(out / "curl.bin"), cdn_url], check=True)

    rows.append(("curl, 1 stream, then sha256sum", two_step(curl, out / "curl.bin", truth)))
    if shutil.which("aria2c"):
        fresh()

        def aria2() -> None:
            subprocess.run(
                ["aria2c", f"-x{c}", f"-s{c}", "-q", "--file-allocation=none", "--allow-overwrite=true", "-d", str(out), "-o", "aria.bin", cdn_url],
                check=True,
            )

        rows.append((f"aria2c -x{c} -s{c}, then sha256sum", two_step(aria2, out / "aria.bin", truth)))
    else:
        print("aria2c: not installed (apt-get install aria2)")
    # In a child process: hf_transfer.download holds the GIL, which would stall the emulator's
    # threads in this one.
    hf_path = os.pathsep.join(p for p in (args.hf_transfer_path, os.environ.get("PYTHONPATH")) if p)
    probe = subprocess.run([sys.executable, "-c", "import hf_transfer"], env={**os.environ, "PYTHONPATH": hf_path}, capture_output=True, check=False)
    if probe.returncode == 0:
        fresh()
        code = f"import hf_transfer; hf_transfer.download({cdn_url!r}, {str(out / 'hft.bin')!r}, max_files={c}, chunk_size={10 * MIB})"

        def transfer() -> None:
            subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": hf_path}, check=True, timeout=600)

        rows.append((f"hf_transfer, {c} in flight, then sha256sum", two_step(transfer, out / "hft.bin", truth)))
    elif args.runs == 1:
        print("hf_transfer: not importable (pip install hf_transfer, or --hf-transfer-path)")
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
