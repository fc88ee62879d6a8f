"""An N-host lab fleet: extra lab hosts (lab/lab.sh up-extra), its inventory
(scripts/lab_fleet_inventory.py: lab-nodeI on llm-fleet-lab-hostI) and a parallel fleet rollout
(playbooks/deploy_fleet.yml with fleet_batch_size and forks set to N). Shared by
tests/integration/test_fleet_scale.py and benchmarks/bench_fleet_scale.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from lab_host import ROOT, env, playbook, remove_endpoint

sys.path.insert(0, str(ROOT / "scripts"))
from lab_fleet_inventory import NODE_PORT, fleet_inventory, host_name, node_name

__all__ = ["NODE_PORT", "deploy", "fleet_inventory", "host_name", "node_name", "remove_nodes", "start_hosts", "stop_hosts"]


def running_hosts() -> set[str]:
    out = subprocess.run(["podman", "ps", "--format", "{{.Names}}"], capture_output=True, text=True, env=env(), check=True).stdout
    return set(out.split())


def lab_script(*argv: str) -> None:
    proc = subprocess.run([str(ROOT / "lab" / "lab.sh"), *argv], capture_output=True, text=True, env=env(), check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"lab/lab.sh {' '.join(argv)} failed:\n{proc.stderr[-3000:]}")


def start_hosts(count: int) -> list[str]:
    """Hosts 2..count running with the llama.cpp engine loaded; the names this call started."""
    before = running_hosts()
    lab_script("up-extra", str(count))
    return [host_name(i) for i in range(2, count + 1) if host_name(i) not in before]


def deploy(tmp_path: Path, inventory: Path, count: int, batch: int | None = None) -> tuple[float, int, dict, str]:
    """deploy_fleet.yml over `count` endpoints with `count` forks, `batch` at a time (default: all
    at once): (wall seconds, exit status, summed stats, JSON output)."""
    started = time.perf_counter()
    rc, stats, out = playbook(tmp_path, "deploy_fleet.yml", "--forks", str(count), extra_vars={"fleet_batch_size": batch or count}, inventory=inventory)
    return time.perf_counter() - started, rc, stats, out


def stop_hosts(names: list[str]) -> None:
    """Remove these extra hosts (never host1)."""
    if names:
        lab_script("down-extra", *names)


def remove_nodes(count: int) -> None:
    """Everything the fleet deploy created for lab-node1..count (their hosts stay)."""
    for index in range(1, count + 1):
        remove_endpoint(node_name(index), host=host_name(index))
