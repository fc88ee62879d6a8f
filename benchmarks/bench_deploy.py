#!/usr/bin/env python3
"""No-op redeploy of frank-secondary on the lab: deploy_secondary.yml (every gate) vs a plain
playbook doing only the generic part with builtin and containers.podman modules
(benchmarks/playbooks/plain-secondary.yml). Also times a cold deploy (unit removed first) and a
failed deploy with its automatic rollback (a shape that crashes at boot).

The two no-op playbooks run interleaved (ours, plain, ours, plain, ...) so a load change on a
shared machine hits both alike; each figure is the best of --runs, the median is printed too.
Every no-op run must report changed=0 (both playbooks write the same unit bytes), else the run
is not a no-op and the benchmark stops. Needs the lab (`make lab-up`); take the lab lock:

  flock /tmp/lab.lock .venv/bin/python benchmarks/bench_deploy.py [--runs 5]

Goal: the no-op redeploy at <= 1.0x the plain playbook (aim: <= 0.7x).
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
PLAIN = "benchmarks/playbooks/plain-secondary.yml"
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="no-op runs of each playbook, interleaved (default 5)")
    args = parser.parse_args()

    playbook(OURS)  # converge first
    with tempfile.NamedTemporaryFile("w", suffix=".service") as unit_file:
        unit_file.write(on_host("cat", f"/etc/systemd/system/{UNIT}"))
        unit_file.flush()
        plain_env = {"PLAIN_UNIT_FILE": unit_file.name}
        playbook(PLAIN, env=plain_env, noop=True)
        ours, plain = [], []
        for _run in range(args.runs):
            ours.append(playbook(OURS, noop=True))
            plain.append(playbook(PLAIN, env=plain_env, noop=True))
    print(
        f"no-op redeploy: {OURS} {min(ours):.1f} s (all gates) vs plain playbook {min(plain):.1f} s: "
        f"{min(ours) / min(plain):.2f}x best of {args.runs} (goal <= 1.0x); "
        f"medians {statistics.median(ours):.1f} s vs {statistics.median(plain):.1f} s: {statistics.median(ours) / statistics.median(plain):.2f}x"
    )

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
