#!/usr/bin/env python3
"""Fleet deploy wall time against the fleet's size, measured on a lab of N container hosts.

For each N (default 1, 2, 4, 6): the fleet inventory of scripts/lab_fleet_inventory.py (lab-node1..N,
one llama-server endpoint on each of llm-fleet-lab-host1..N), then playbooks/deploy_fleet.yml with
fleet_batch_size=N and --forks N (every endpoint at once):
  cold   the endpoints removed first (unit, container, state; the hosts and their engine image stay)
  no-op  the same deploy again, which must report changed=0 (else the benchmark stops)
Hosts 2..max(N) are started first (lab/lab.sh up-extra, timed: the engine image load per host) and
prepared by one unmeasured deploy, so every cold figure starts from the same state. The extra hosts
stay up afterwards unless --down; host1 keeps frank-primary and frank-secondary untouched.
Needs the lab (`make lab-up`); take the lab lock:

  flock /tmp/lab.lock .venv/bin/python benchmarks/bench_fleet_scale.py [--sizes 1,2,4,6] [--serial] [--down]

--serial also times each N with the default rollout (fleet_batch_size=1), cold and no-op.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from lab_fleet import deploy, fleet_inventory, remove_nodes, start_hosts, stop_hosts  # noqa: E402
from lab_host import failures  # noqa: E402


def timed_deploy(work: Path, inventory: Path, count: int, *, noop: bool, batch: int | None = None) -> float:
    seconds, rc, stats, out = deploy(work, inventory, count, batch)
    if rc != 0:
        raise SystemExit(f"fleet deploy of {count} failed: {failures(out) or out[-3000:]}")
    if noop and stats["changed"]:
        raise SystemExit(f"the redeploy of {count} changed {stats['changed']} things, so it was not a no-op:\n{out[-3000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,2,4,6", help="fleet sizes N, comma-separated (default 1,2,4,6)")
    parser.add_argument("--serial", action="store_true", help="also time each N one endpoint at a time (fleet_batch_size=1, the default rollout)")
    parser.add_argument("--down", action="store_true", help="remove the extra hosts this run started at the end")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    largest = max(sizes)

    started_at = time.perf_counter()
    started = start_hosts(largest)
    print(f"extra hosts started with the llama.cpp engine loaded: {len(started)} in {time.perf_counter() - started_at:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        work = Path(tmp)
        try:
            inventory = fleet_inventory(largest, work / f"fleet{largest}")
            timed_deploy(work, inventory, largest, noop=False)  # prepares every host alike
            rows = []
            for count in sizes:
                inventory = fleet_inventory(count, work / f"fleet{count}")
                remove_nodes(count)
                cold = timed_deploy(work, inventory, count, noop=False)
                noop = timed_deploy(work, inventory, count, noop=True)
                serial = ()
                if args.serial:
                    remove_nodes(count)
                    serial = (timed_deploy(work, inventory, count, noop=False, batch=1), timed_deploy(work, inventory, count, noop=True, batch=1))
                rows.append((count, cold, noop, serial))
                print(f"N={count}: cold {cold:.1f} s, no-op {noop:.1f} s; one at a time: {serial}", flush=True)
        finally:
            remove_nodes(largest)
            if args.down:
                stop_hosts(started)
    print(f"\nfleet deploy, fleet_batch_size=N, --forks N ({subprocess.check_output(['nproc'], text=True).strip()} CPUs)")
    serial_head = " one at a time: cold (s) | no-op (s) |" if args.serial else ""
    print(f"| N | cold (s) | cold per endpoint (s) | no-op (s) | no-op per endpoint (s) |{serial_head}")
    print("|---|---|---|---|---|" + ("---|---|" if args.serial else ""))
    for count, cold, noop, serial in rows:
        serial_cells = "".join(f" {seconds:.1f} |" for seconds in serial)
        print(f"| {count} | {cold:.1f} | {cold / count:.1f} | {noop:.1f} | {noop / count:.1f} |{serial_cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
