#!/usr/bin/env python3
"""No-op redeploy of frank-secondary on the lab: deploy_secondary.yml (every gate) vs a plain
playbook doing only the generic part with builtin and containers.podman modules.

Also times a cold deploy (unit removed first) and a rollback (a shape that crashes at boot).
Needs the lab (`make lab-up`). Goal: the no-op redeploy at <= 1.0x the plain playbook.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HOST = "llm-fleet-lab-host1"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
ENV.setdefault("CONTAINERS_CONF", str(ROOT / "lab" / "containers.conf"))


def playbook(*args: str, check: bool = True, env: dict | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run([str(BIN / "ansible-playbook"), *args], cwd=ROOT, env={**ENV, **(env or {})}, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}")
    return elapsed


def on_host(*argv: str) -> str:
    return subprocess.run(["podman", "exec", HOST, *argv], env=ENV, capture_output=True, text=True, check=True).stdout


def best(fn, runs: int = 3) -> float:
    return min(fn() for _run in range(runs))


def main() -> int:
    playbook("playbooks/deploy_secondary.yml")  # converge first
    unit_text = on_host("cat", "/etc/systemd/system/frank-secondary.service")
    plain_env = {"PLAIN_UNIT_TEXT": unit_text.rstrip("\n")}
    playbook("benchmarks/playbooks/plain-secondary.yml", env=plain_env)
    ours = best(lambda: playbook("playbooks/deploy_secondary.yml"))
    plain = best(lambda: playbook("benchmarks/playbooks/plain-secondary.yml", env=plain_env))
    print(f"no-op redeploy: deploy_secondary.yml {ours:.1f} s (all gates) vs plain playbook {plain:.1f} s: {ours / plain:.2f}x (goal <= 1.0x)")

    on_host("systemctl", "disable", "--now", "frank-secondary.service")
    on_host("rm", "-f", "/etc/systemd/system/frank-secondary.service", "/var/lib/llm-fleet/frank-secondary/last-good.json")
    cold = playbook("playbooks/deploy_secondary.yml")
    print(f"cold deploy (unit absent): {cold:.1f} s")

    shape = yaml.safe_load((ROOT / "inventories" / "lab" / "host_vars" / "frank-secondary.yml").read_text())["endpoint_shape"]
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as bad:
        yaml.safe_dump({"endpoint_shape": {**shape, "extra_args": ["--no-such-flag"]}}, bad)
        bad.flush()
        rollback = playbook("playbooks/deploy_secondary.yml", "--limit", "frank-secondary", "-e", f"@{bad.name}", check=False)
    print(f"failed deploy with automatic rollback (crash loop detected, last-known-good restored): {rollback:.1f} s")
    playbook("playbooks/deploy_secondary.yml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
