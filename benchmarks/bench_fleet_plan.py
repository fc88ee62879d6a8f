#!/usr/bin/env python3
"""The fleet plan's time: playbooks/plan.yml on inventories/production (every endpoint priced on
the controller, no SSH, no vault password), --repeat N runs, on this machine alone (no lab).

How "after Ansible's own start" is measured: a timing callback (benchmarks/callbacks/plan_clock.py)
records the wall-clock time at which Ansible started the playbook - its interpreter, plugins,
inventory and playbook already loaded - and this script takes the time from there to the exit of
the ansible-playbook process (so the final table and the exit are counted). The whole process's
wall time and `ansible-playbook --version`'s (the interpreter and Ansible's imports alone) are
printed beside it, and the CPU time of every process the run started (on a busy machine the wall
times stretch, the CPU time much less); each figure is the median of the runs, with the best and
the worst, and the load average is printed with them.

  .venv/bin/python benchmarks/bench_fleet_plan.py [--repeat 5] [--inventory inventories/production]

Goal: the production fleet plan in <= 2 s after Ansible's own start (median). Every run must
exit 0 and name every endpoint "fits", else the benchmark stops.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GOAL_S = 2.0
ENV = {
    **os.environ,
    "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "benchmarks" / "callbacks"),
    "ANSIBLE_CALLBACKS_ENABLED": "frank.llm_fleet.deploy_plan,plan_clock",
    "PATH": f"{BIN}:{os.environ['PATH']}",
}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_plan(inventory: str, clock: Path) -> tuple[float, float, float, float]:
    """(wall, after the playbook's start, after the first task's start, CPU of every process it
    ran) of one plan run, in seconds. The CPU figure is what a busy machine does not change much."""
    cpu = children_cpu()
    start = time.time()
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/plan.yml", "-i", inventory],
        cwd=ROOT,
        env={**ENV, "PLAN_CLOCK_FILE": str(clock)},
        capture_output=True,
        text=True,
        check=False,
    )
    end = time.time()
    if proc.returncode != 0 or "Fleet plan (priced only" not in proc.stdout:
        raise SystemExit(f"plan.yml exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    marks = json.loads(clock.read_text())
    return end - start, end - marks["playbook_start"], end - marks["first_task_start"], children_cpu() - cpu


def startup() -> float:
    start = time.time()
    subprocess.run([str(BIN / "ansible-playbook"), "--version"], cwd=ROOT, env=ENV, capture_output=True, check=True)
    return time.time() - start


def line(label: str, values: list[float]) -> str:
    return f"{label:<44} median {statistics.median(values):5.2f} s  (best {min(values):.2f}, worst {max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--repeat", type=int, default=5, help="plan runs (default 5)")
    parser.add_argument("--inventory", default="inventories/production")
    args = parser.parse_args()
    walls, after_start, after_task, cpus, versions = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        clock = Path(tmp) / "clock.json"
        run_plan(args.inventory, clock)  # warm the page cache and the plugin caches; not counted
        for _run in range(args.repeat):
            versions.append(startup())
            wall, started, tasked, cpu = run_plan(args.inventory, clock)
            walls.append(wall)
            after_start.append(started)
            after_task.append(tasked)
            cpus.append(cpu)
    print(f"fleet plan: playbooks/plan.yml -i {args.inventory}, {args.repeat} runs (load {os.getloadavg()[0]:.1f})")
    print(line("ansible-playbook --version (startup alone)", versions))
    print(line("plan.yml, whole process", walls))
    print(line("plan.yml, after Ansible's own start", after_start))
    print(line("plan.yml, after the first task's start", after_task))
    print(line("plan.yml, CPU (user + system, every process)", cpus))
    verdict = "met" if statistics.median(after_start) <= GOAL_S else "MISSED"
    print(f"goal <= {GOAL_S:.1f} s after Ansible's own start: {verdict}")


if __name__ == "__main__":
    main()
