#!/usr/bin/env python3
"""Write a fleet inventory for an N-host lab: one llama-server endpoint per lab host.

  python scripts/lab_fleet_inventory.py N OUTDIR

Endpoint lab-nodeI runs on llm-fleet-lab-hostI (host1 from `lab/lab.sh up`, host2..N from
`lab/lab.sh up-extra N`) with frank-secondary's settings (inventories/lab/host_vars), on its own
port so it never meets frank-secondary on host1. The engine image and digest are the lab's facts
(.lab/facts) written in as values, so OUTDIR can be anywhere; boot ledgers and bench results go to
OUTDIR/calibration and OUTDIR/bench, out of the lab's store. The machine-level unit metrics are
off (host1 is shared with the lab inventory). The inventory is OUTDIR/inventory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LAB_INVENTORY = ROOT / "inventories" / "lab"
FACTS = ROOT / ".lab" / "facts"
# Above the lab inventory's own ports (7770, 7771) and the integration tests' extra endpoints (7790).
NODE_PORT = 7800


def host_name(index: int) -> str:
    return f"llm-fleet-lab-host{index}"


def node_name(index: int) -> str:
    return f"lab-node{index}"


def fleet_inventory(count: int, outdir: Path, facts: Path = FACTS) -> Path:
    """Write OUTDIR/inventory for `count` lab hosts and return its path."""
    if count < 1:
        raise ValueError(f"N must be at least 1 (one endpoint per lab host), got {count}")
    image_file, digest_file = facts / "engine-llamacpp.image", facts / "engine-llamacpp.digest"
    if not image_file.is_file() or not digest_file.is_file():
        raise FileNotFoundError(f"{image_file} or {digest_file} is missing: run `lab/lab.sh up` first")
    inventory = outdir / "inventory"
    (inventory / "host_vars").mkdir(parents=True, exist_ok=True)
    (inventory / "group_vars").mkdir(exist_ok=True)
    group_vars = yaml.safe_load((LAB_INVENTORY / "group_vars" / "all.yml").read_text())
    group_vars["llm_fleet_calibration_dir"] = str(outdir / "calibration")
    group_vars["llm_fleet_bench_dir"] = str(outdir / "bench")
    # Host1 is shared with the lab inventory: its unit-metrics writer names frank-primary and
    # frank-secondary, and a fleet deploy would rewrite it for lab-node1 alone.
    group_vars["host_metrics_enabled"] = False
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars, sort_keys=False))
    hosts = {
        "all": {
            "children": {
                "lab_hosts": {"hosts": {host_name(i): None for i in range(1, count + 1)}},
                "llm_endpoints": {"hosts": {node_name(i): {"ansible_host": host_name(i)} for i in range(1, count + 1)}},
            }
        }
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    secondary = yaml.safe_load((LAB_INVENTORY / "host_vars" / "frank-secondary.yml").read_text())
    for index in range(1, count + 1):
        name = node_name(index)
        node = {
            **secondary,
            "endpoint_shape": {**secondary["endpoint_shape"], "port": NODE_PORT},
            "endpoint_container": {**secondary["endpoint_container"], "cache_dir": f"/var/cache/{name}"},
            "endpoint_image": image_file.read_text().strip(),
            "endpoint_image_digest": digest_file.read_text().strip(),
        }
        (inventory / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump(node, sort_keys=False))
    return inventory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int, metavar="N", help="lab hosts, one endpoint on each")
    parser.add_argument("outdir", type=Path, metavar="OUTDIR")
    args = parser.parse_args(argv)
    try:
        print(fleet_inventory(args.count, args.outdir.resolve()))
    except (ValueError, FileNotFoundError) as error:
        print(f"lab_fleet_inventory: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
