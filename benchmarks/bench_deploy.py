#!/usr/bin/env python3
"""No-op redeploys on the lab against plain playbooks, then (unless --noop-only) a cold deploy and
a failed deploy with its automatic rollback.

- One endpoint: deploy_secondary.yml (the role: its no-op fast path, or every gate) against
  benchmarks/playbooks/plain-endpoint.yml for frank-secondary, a generic playbook with builtin and
  containers.podman modules only (image present, unit file, service started, port, /health,
  /v1/models).
- --fleet: deploy_fleet.yml --limit llm_endpoints (every lab endpoint, and the clients' fragments
  the fleet writes on the controller) against the plain playbook of each endpoint run in sequence.

The playbooks run interleaved (ours, plain, ours, plain, ...) so a load change on a shared machine
hits both alike; best and median of --runs are printed. Every no-op run must report changed=0
(both write the same unit bytes), and each endpoint's MainPID must be the same after every run as
before the first, else the benchmark stops. Needs the lab (`make lab-up`); take the lab lock:

  flock /tmp/lab.lock .venv/bin/python benchmarks/bench_deploy.py --runs 3 --fleet [--noop-only]

Goal: the no-op redeploy at <= 0.5x the plain playbook, best and median (one endpoint and fleet).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
from lab_host import inventory_with_shape

ROOT = Path(__file__).resolve().parents[1]
HOST = "llm-fleet-lab-host1"
UNIT = "frank-secondary.service"
OURS = "playbooks/deploy_secondary.yml"
FLEET = ("playbooks/deploy_fleet.yml", "--limit", "llm_endpoints")
PLAIN = "benchmarks/playbooks/plain-endpoint.yml"
LAB_ENDPOINTS = ("frank-primary", "frank-secondary")
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
ENV.setdefault("CONTAINERS_CONF", str(ROOT / "lab" / "containers.conf"))
CHANGED = re.compile(r"^\S+\s+:\s+ok=\d+\s+changed=(\d+)", re.MULTILINE)


def playbook(*args: str, check: bool = True, env: dict | None = None, noop: bool = False, expect: str = "") -> float:
    start = time.perf_counter()
    proc = subprocess.run([str(BIN / "ansible-playbook"), *args], cwd=ROOT, env={**ENV, **(env or {})}, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if expect and expect not in " ".join(proc.stdout.split()):
        raise SystemExit(f"{' '.join(args)} did not say {expect!r}:\n{proc.stdout[-3000:]}")
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    if noop and any(int(changed) for changed in CHANGED.findall(proc.stdout)):
        raise SystemExit(f"{' '.join(args)} changed something, so it was not a no-op:\n{proc.stdout[-3000:]}")
    return elapsed


def on_host(*argv: str) -> str:
    return subprocess.run(["podman", "exec", HOST, *argv], env=ENV, capture_output=True, text=True, check=True).stdout


def main_pids(endpoints: tuple[str, ...]) -> dict[str, int]:
    return {name: int(on_host("systemctl", "show", "-p", "MainPID", "--value", f"{name}.service").strip() or 0) for name in endpoints}


def compare(label: str, ours: list[float], plain: list[float], runs: int) -> None:
    best, median = min(ours) / min(plain), statistics.median(ours) / statistics.median(plain)
    print(
        f"{label}: ours {min(ours):.1f} s vs plain {min(plain):.1f} s: {best:.2f}x best of {runs}; "
        f"medians {statistics.median(ours):.1f} s vs {statistics.median(plain):.1f} s: {median:.2f}x (goal <= 0.5x: {best <= 0.5 and median <= 0.5})"
    )
    print(f"  ours  {', '.join(f'{t:.2f}' for t in ours)}\n  plain {', '.join(f'{t:.2f}' for t in plain)}")


def noop_pair(ours_args: tuple[str, ...], endpoints: tuple[str, ...], unit_files: dict[str, str], runs: int, pids: dict[str, int]) -> tuple[list, list]:
    """ours and the plain playbooks (one per endpoint, in sequence), interleaved, each a no-op;
    ours must have taken the fast path (the role says so)."""
    ours, plain = [], []
    for _run in range(runs):
        ours.append(playbook(*ours_args, noop=True, expect="is a no-op: serving"))
        check_pids(pids, endpoints)
        plain.append(sum(playbook(PLAIN, "-e", f"plain_endpoint={name}", env={"PLAIN_UNIT_FILE": unit_files[name]}, noop=True) for name in endpoints))
        check_pids(pids, endpoints)
    return ours, plain


def check_pids(before: dict[str, int], endpoints: tuple[str, ...]) -> None:
    now = main_pids(endpoints)
    if any(now[name] != before[name] for name in endpoints):
        raise SystemExit(f"a no-op restarted an engine: MainPIDs {before} -> {now}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="no-op runs of each playbook, interleaved (default 3)")
    parser.add_argument("--fleet", action="store_true", help="also the fleet: deploy_fleet.yml against the plain playbooks in sequence")
    parser.add_argument("--noop-only", action="store_true", help="skip the cold deploy and the rollback")
    args = parser.parse_args()

    endpoints = LAB_ENDPOINTS if args.fleet else ("frank-secondary",)
    playbook(*(FLEET if args.fleet else (OURS,)))  # converge first (and record the gates' inputs)
    with tempfile.TemporaryDirectory() as tmp:
        unit_files = {}
        for name in endpoints:
            unit_files[name] = f"{tmp}/{name}.service"
            Path(unit_files[name]).write_text(on_host("cat", f"/etc/systemd/system/{name}.service"))
        for name in endpoints:
            playbook(PLAIN, "-e", f"plain_endpoint={name}", env={"PLAIN_UNIT_FILE": unit_files[name]}, noop=True)
        playbook(OURS, noop=True)  # the fast path's record is written by the converge; this must be a no-op already
        pids = main_pids(endpoints)
        print(f"MainPIDs before: {pids}")
        ours, plain = noop_pair((OURS,), ("frank-secondary",), unit_files, args.runs, pids)
        compare(f"no-op redeploy of frank-secondary ({OURS})", ours, plain, args.runs)
        if args.fleet:
            ours, plain = noop_pair(FLEET, endpoints, unit_files, args.runs, pids)
            compare(f"no-op fleet ({' '.join(FLEET)}; plain: {' + '.join(endpoints)} in sequence)", ours, plain, args.runs)
        print(f"MainPIDs after: {main_pids(endpoints)} (the same: every no-op run reported changed=0)")
    if args.noop_only:
        return 0

    on_host("systemctl", "disable", "--now", UNIT)
    on_host("rm", "-f", f"/etc/systemd/system/{UNIT}", "/var/lib/llm-fleet/frank-secondary/last-good.json")
    cold = playbook(OURS)
    print(f"cold deploy (unit absent): {cold:.1f} s")

    shape = yaml.safe_load((ROOT / "inventories" / "lab" / "host_vars" / "frank-secondary.yml").read_text())["endpoint_shape"]
    with tempfile.TemporaryDirectory() as tmp:
        # The crashing shape goes to frank-secondary's host_vars in a copy of the lab inventory (an
        # extra var would reach every endpoint and trip the port-clash preflight instead).
        bad = inventory_with_shape(Path(tmp), "frank-secondary", {**shape, "extra_args": ["--no-such-flag"]})
        rollback = playbook(OURS, "-i", str(bad), "--limit", "frank-secondary", check=False, expect="The last-known-good shape is serving again")
    print(f"failed deploy with automatic rollback (crash loop detected, last-known-good restored): {rollback:.1f} s")
    playbook(OURS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
