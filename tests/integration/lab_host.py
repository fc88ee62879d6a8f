"""Driving the lab host: deploy playbooks with a shape override, run commands on the host.

The lab host is the machine (the container llm-fleet-lab-host1); each endpoint is an inventory host
of its own (frank-primary, frank-secondary) whose ansible_host is that machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HOST = "llm-fleet-lab-host1"
BIN = Path(sys.executable).parent
LAB_INVENTORY = ROOT / "inventories" / "lab"


def env() -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "lab" / "containers.conf")),
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }


def lab_host_running() -> bool:
    if shutil.which("podman") is None:
        return False
    proc = subprocess.run(["podman", "ps", "--filter", f"name=^{HOST}$", "--format", "{{.Names}}"], capture_output=True, text=True, env=env(), check=False)
    return proc.stdout.strip() == HOST


def require_lab_host() -> None:
    """Skip the calling test module when the lab host is not up (CI starts it with `make lab-up`)."""
    if not lab_host_running():
        pytest.skip("the lab host is not running (run `make lab-up`); CI starts it", allow_module_level=True)


def lab_shape(endpoint: str, inventory: Path = LAB_INVENTORY) -> dict:
    """An endpoint's shape as its inventory writes it (host_vars/ENDPOINT.yml)."""
    return yaml.safe_load((inventory / "host_vars" / f"{endpoint}.yml").read_text())["endpoint_shape"]


def playbook(
    tmp_path: Path, name: str, *extra: str, extra_vars: dict | None = None, limit: str | None = None, inventory: Path | None = None
) -> tuple[int, dict, str]:
    """Run a playbook against the lab (or another inventory); (exit status, the stats summed over the
    play's hosts, the JSON output). A shape override is an extra var (endpoint_shape): give `limit`
    (the endpoint) so it reaches that endpoint only."""
    argv = [str(BIN / "ansible-playbook"), f"playbooks/{name}", *extra]
    extra_vars = dict(extra_vars or {})
    if "endpoint_shape" in extra_vars and limit and inventory is None:
        # An extra var applies to every host: the other endpoints would share this shape (and port)
        # and the preflight's port-clash check would rightly refuse. The shape goes to the limited
        # endpoint's host_vars in a copy of the lab inventory instead.
        inventory = inventory_with_shape(tmp_path, limit, extra_vars.pop("endpoint_shape"))
    if inventory is not None:
        argv += ["-i", str(inventory)]
    if limit:
        argv += ["--limit", limit]
    if extra_vars:
        vars_file = tmp_path / "extra-vars.yml"
        vars_file.write_text(yaml.safe_dump(extra_vars))
        argv += ["-e", f"@{vars_file}"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**env(), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}, check=False)
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    stats: dict[str, int] = {}
    for host_stats in out["stats"].values():
        for key, value in host_stats.items():
            stats[key] = stats.get(key, 0) + value
    return proc.returncode, stats, proc.stdout


def inventory_with_shape(tmp_path: Path, endpoint: str, shape: dict) -> Path:
    """A copy of the lab inventory where `endpoint` has `shape` in its host_vars."""
    root = tmp_path / "shape-override"
    inventory = root / "inventories" / "lab"
    if not inventory.exists():
        shutil.copytree(LAB_INVENTORY, inventory)
        (root / ".lab").symlink_to(ROOT / ".lab")
    host_vars = inventory / "host_vars" / f"{endpoint}.yml"
    data = yaml.safe_load((LAB_INVENTORY / "host_vars" / f"{endpoint}.yml").read_text())
    data["endpoint_shape"] = shape
    host_vars.write_text(yaml.safe_dump(data))
    return inventory


def on_host(*argv: str, check: bool = True, host: str = HOST) -> str:
    return subprocess.run(["podman", "exec", host, *argv], capture_output=True, text=True, env=env(), check=check).stdout.strip()


def unit_property(unit: str, name: str) -> str:
    return on_host("systemctl", "show", "-p", name, "--value", unit)


def served(port: int, host: str = HOST) -> str:
    return json.loads(on_host("curl", "-s", f"http://127.0.0.1:{port}/v1/models", host=host))["data"][0]["id"]


def wait_healthy(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    probe = ["podman", "exec", HOST, "curl", "-sf", f"http://127.0.0.1:{port}/health"]
    while time.monotonic() < deadline:
        if subprocess.run(probe, capture_output=True, env=env(), check=False).returncode == 0:
            return True
        time.sleep(1)
    return False


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bin" / "llm-fleet"), *argv], capture_output=True, text=True, env=env(), check=False)


def failures(out: str) -> list[str]:
    """The messages of the failed tasks in a playbook's JSON output, for assertion messages."""
    data = json.loads(out[out.index("{") :])
    found = []
    for play in data.get("plays", []):
        for task in play.get("tasks", []):
            for result in task.get("hosts", {}).values():
                if result.get("failed"):
                    found.append(f"{task['task']['name']}: {result.get('msg')} {str(result.get('stderr', ''))[-500:]}")
    return found


def extra_endpoint_inventory(root: Path, name: str, port: int, template: str = "frank-secondary", **host_vars) -> Path:
    """inventories/lab copied under root (root/.lab links the lab's facts, as ../../.lab does in the
    tree) with one more endpoint on the lab host: the template endpoint's settings (frank-secondary,
    llama-server; or frank-primary, vLLM) on its own port and cache directory, then host_vars on
    top (endpoint_shape keys merge into the shape)."""
    inventory = root / "inventories" / "lab"
    shutil.copytree(LAB_INVENTORY, inventory)
    (root / ".lab").symlink_to(ROOT / ".lab")
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["llm_endpoints"]["hosts"][name] = {"ansible_host": HOST}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    write_endpoint_vars(inventory, name, port, template, **host_vars)
    return inventory


def write_endpoint_vars(inventory: Path, name: str, port: int, template: str = "frank-secondary", **host_vars) -> None:
    base = yaml.safe_load((LAB_INVENTORY / "host_vars" / f"{template}.yml").read_text())
    shape = {**base["endpoint_shape"], "port": port, **host_vars.pop("endpoint_shape", {})}
    data = {
        **base,
        "endpoint_container": {**base["endpoint_container"], "cache_dir": f"/var/cache/{name}"},
        "llm_fleet_calibration_dir": str(inventory.parent.parent / "calibration"),
        "llm_fleet_bench_dir": str(inventory.parent.parent / "bench"),
        **host_vars,
        "endpoint_shape": shape,
    }
    (inventory / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump(data))


def remove_endpoint(name: str, host: str = HOST) -> None:
    """Everything a deploy of endpoint `name` created on the lab host (or another lab host)."""
    unit = f"{name}.service"
    on_host("systemctl", "disable", "--now", unit, check=False, host=host)
    on_host("podman", "rm", "-f", "--ignore", name, check=False, host=host)
    on_host("nft", "delete", "table", "inet", "llm_fleet_" + name.replace("-", "_"), check=False, host=host)
    on_host(
        "rm",
        "-rf",
        f"/etc/systemd/system/{unit}",
        f"/etc/llm-fleet/{name}.env",
        f"/etc/llm-fleet/{name}.podman.env",
        f"/etc/llm-fleet/{name}.nft",
        f"/etc/llm-fleet/{name}.last-good-secrets.json",
        f"/var/lib/llm-fleet/{name}",
        f"/var/cache/{name}",
        f"/var/lib/prometheus/node-exporter/llm_fleet_{unit}.prom",
        host=host,
    )
    on_host("systemctl", "daemon-reload", host=host)
    on_host("systemctl", "reset-failed", unit, check=False, host=host)


def lab_addresses() -> tuple[str, str]:
    """The lab host's own address and the controller's (its default gateway), as the host sees them."""
    own = on_host("ip", "-4", "-o", "addr", "show", "dev", "eth0").split()[3].split("/")[0]
    gateway = on_host("ip", "route", "show", "default").split()[2]
    return own, gateway


OUTSIDE_NETNS = "llmfleet-outside"


def dropped_from_outside(own: str, port: int) -> bool:
    """A connection from a network namespace on the lab host (198.18.0.2, outside every allowed
    network) to own:port: dropped means a connect timeout (curl exit 28), not a refusal."""
    on_host("ip", "netns", "add", OUTSIDE_NETNS, check=False)
    on_host("ip", "link", "add", "llmf-out0", "type", "veth", "peer", "name", "llmf-out1", check=False)
    on_host("ip", "link", "set", "llmf-out1", "netns", OUTSIDE_NETNS, check=False)
    on_host("ip", "addr", "add", "198.18.0.1/30", "dev", "llmf-out0", check=False)
    on_host("ip", "link", "set", "llmf-out0", "up")
    on_host("ip", "netns", "exec", OUTSIDE_NETNS, "ip", "addr", "add", "198.18.0.2/30", "dev", "llmf-out1", check=False)
    on_host("ip", "netns", "exec", OUTSIDE_NETNS, "ip", "link", "set", "llmf-out1", "up")
    on_host("ip", "netns", "exec", OUTSIDE_NETNS, "ip", "route", "add", "default", "via", "198.18.0.1", check=False)
    proc = subprocess.run(
        ["podman", "exec", HOST, "ip", "netns", "exec", OUTSIDE_NETNS, "curl", "-s", "-m", "3", "-o", "/dev/null", f"http://{own}:{port}/health"],
        capture_output=True,
        env=env(),
        check=False,
    )
    return proc.returncode == 28


def combined_manifest(*models: str, host: str = HOST) -> str:
    """A payload manifest on the lab host naming several of the lab's models (each has its own,
    under /srv/lab-models): for a candidate that adds a drafter or swaps the weights, whose every
    file the budget's payload identity check finds in the manifest. Returns its path on the host."""
    files, commits = [], []
    for model in models:
        manifest = json.loads((ROOT / ".lab" / "models" / f"{model}.manifest.json").read_text())
        files += manifest["files"]
        commits.append(manifest["revision"])
    combined = {"repo_id": "lab/" + "-and-".join(models), "revision": commits[0], "repo_type": "model", "files": files}
    path = "/var/lib/llm-fleet-tests/" + "-and-".join(models) + ".manifest.json"
    on_host("mkdir", "-p", "/var/lib/llm-fleet-tests", host=host)
    subprocess.run(["podman", "exec", "-i", host, "sh", "-c", f"cat > {path}"], input=json.dumps(combined), text=True, env=env(), check=True)
    return path
