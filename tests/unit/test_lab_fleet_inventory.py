"""scripts/lab_fleet_inventory.py: the N-host lab's fleet inventory (one llama-server endpoint per
lab host), checked without a lab."""

import subprocess
import sys
from pathlib import Path

import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "lab_fleet_inventory.py"
LAB_HOST_VARS = ROOT / "inventories" / "lab" / "host_vars"


def write(tmp_path: Path, count: str, facts: bool = True) -> subprocess.CompletedProcess:
    root = tmp_path / "checkout"
    if not root.exists():
        (root / "scripts").mkdir(parents=True)
        (root / "scripts" / SCRIPT.name).write_text(SCRIPT.read_text())
        (root / "inventories").symlink_to(ROOT / "inventories")
        if facts:
            (root / ".lab" / "facts").mkdir(parents=True)
            (root / ".lab" / "facts" / "engine-llamacpp.image").write_text("localhost/engine:abc\n")
            (root / ".lab" / "facts" / "engine-llamacpp.digest").write_text("sha256:" + "1" * 64 + "\n")
    return subprocess.run([sys.executable, str(root / "scripts" / SCRIPT.name), count, str(tmp_path / "out")], capture_output=True, text=True, check=False)


def test_one_endpoint_per_lab_host_with_the_lab_facts_pinned(tmp_path):
    proc = write(tmp_path, "3")
    assert proc.returncode == 0, proc.stderr
    inventory = tmp_path / "out" / "inventory"
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["children"]
    assert list(hosts["lab_hosts"]["hosts"]) == ["llm-fleet-lab-host1", "llm-fleet-lab-host2", "llm-fleet-lab-host3"]
    assert hosts["llm_endpoints"]["hosts"] == {
        "lab-node1": {"ansible_host": "llm-fleet-lab-host1"},
        "lab-node2": {"ansible_host": "llm-fleet-lab-host2"},
        "lab-node3": {"ansible_host": "llm-fleet-lab-host3"},
    }
    node = yaml.safe_load((inventory / "host_vars" / "lab-node2.yml").read_text())
    assert node["endpoint_image"] == "localhost/engine:abc"
    assert node["endpoint_image_digest"] == "sha256:" + "1" * 64
    assert node["endpoint_container"]["cache_dir"] == "/var/cache/lab-node2"
    assert parse_shape(node["endpoint_shape"], "lab-node2").runtime == "llamacpp"


def test_lab_node1_never_meets_the_lab_endpoints_on_host1(tmp_path):
    assert write(tmp_path, "1").returncode == 0
    inventory = tmp_path / "out" / "inventory"
    node_port = yaml.safe_load((inventory / "host_vars" / "lab-node1.yml").read_text())["endpoint_shape"]["port"]
    lab_ports = {yaml.safe_load(path.read_text())["endpoint_shape"]["port"] for path in LAB_HOST_VARS.glob("*.yml")}
    assert node_port not in lab_ports
    group_vars = yaml.safe_load((inventory / "group_vars" / "all.yml").read_text())
    # Host1's unit-metrics writer names the lab's endpoints; the fleet deploy must leave it alone.
    assert group_vars["host_metrics_enabled"] is False
    assert group_vars["llm_fleet_calibration_dir"] == str(tmp_path / "out" / "calibration")


def test_a_fleet_of_zero_is_refused(tmp_path):
    proc = write(tmp_path, "0")
    assert proc.returncode == 2
    assert "N must be at least 1" in proc.stderr


def test_missing_lab_facts_name_the_file_and_the_fix(tmp_path):
    proc = write(tmp_path, "2", facts=False)
    assert proc.returncode == 2
    assert "engine-llamacpp.image" in proc.stderr and "lab/lab.sh up" in proc.stderr
