"""Endpoints are inventory hosts: the layout of both inventories, the per-endpoint playbooks, the
production budget check that contacts no host, and the refusal of the removed variable names."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Every test here runs ansible-inventory or ansible-playbook: the slow tier.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
INVENTORIES = {"production": ["frank-archon", "frank-zealot", "frank-dragoon"], "lab": ["frank-primary", "frank-secondary"]}
# The role each production endpoint holds: deploy-ROLE.yml deploys the inventory group fleet_ROLE.
ROLES = {"frank-archon": "primary", "frank-zealot": "secondary", "frank-dragoon": "large"}


def ansible(tool, *argv):
    return subprocess.run([str(BIN / tool), *argv], capture_output=True, text=True, cwd=ROOT, env=ENV, check=False)


def budget_check(inventory):
    """What an operator runs against production from here: the budget gate alone, priced on the controller."""
    return ansible("ansible-playbook", "playbooks/deploy_primary.yml", "-i", str(inventory), "--check", "--tags", "budget")


@pytest.fixture
def production(tmp_path):
    copy = tmp_path / "production"
    shutil.copytree(ROOT / "inventories" / "production", copy)
    return copy


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_every_endpoint_is_a_host_of_llm_endpoints_with_plain_endpoint_variables(name):
    proc = ansible("ansible-inventory", "-i", f"inventories/{name}", "--list")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["llm_endpoints"]["hosts"] == INVENTORIES[name]
    hostvars = data["_meta"]["hostvars"]
    for endpoint in INVENTORIES[name]:
        variables = hostvars[endpoint]
        assert variables["ansible_host"] in ({"dankserver", "dankclaw"} if name == "production" else {"llm-fleet-lab-host1"})
        assert isinstance(variables["endpoint_shape"]["port"], int)
        assert not [key for key in variables if key.startswith("frank_")]
    host_files = sorted(path.stem for path in (ROOT / "inventories" / name / "host_vars").glob("*.yml"))
    assert host_files == sorted(INVENTORIES[name])


@pytest.mark.parametrize("endpoint", INVENTORIES["production"])
def test_each_per_endpoint_playbook_selects_its_endpoint(endpoint):
    playbook = f"playbooks/deploy-{ROLES[endpoint]}.yml"
    proc = ansible("ansible-playbook", playbook, "-i", "inventories/production", "--list-hosts")
    assert proc.returncode == 0, proc.stderr
    # Every play of it (the machines' part, the endpoints, the run's verdict) lists the endpoint alone.
    plays = proc.stdout.split("hosts (")[1:]
    assert len(plays) == 3
    for play in plays:
        count, hosts = play.split("):", 1)
        assert count == "1" and hosts.split()[0] == endpoint


def test_the_production_budget_check_prints_the_ledger_without_contacting_a_host():
    proc = budget_check("inventories/production")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "r9700-0" in proc.stdout and "r9700-1" in proc.stdout and "fits: yes" in proc.stdout
    assert "frank-archon -> localhost" in proc.stdout  # priced on the controller


def test_the_removed_variable_names_fail_naming_their_new_names(production):
    host_vars = production / "host_vars" / "frank-archon.yml"
    data = yaml.safe_load(host_vars.read_text())
    data["frank_primary_shape"] = data.pop("endpoint_shape")
    data["frank_primary_devices"] = data.pop("endpoint_devices")
    data["frank_primary_name"] = "frank-primary"
    host_vars.write_text(yaml.safe_dump(data))
    proc = budget_check(production)
    assert proc.returncode != 0
    assert "frank_primary_shape -> endpoint_shape in host_vars/frank-primary.yml" in proc.stdout
    assert "frank_primary_devices -> endpoint_devices in host_vars/frank-primary.yml" in proc.stdout
    assert "frank_primary_name -> the inventory hostname frank-primary" in proc.stdout
    assert "docs/migration.md" in proc.stdout
    assert "TASK [frank.llm_fleet.endpoint : Show the ledger" not in proc.stdout  # refused before the budget gate


def test_a_shape_without_its_port_fails_before_the_budget_gate(production):
    host_vars = production / "host_vars" / "frank-archon.yml"
    data = yaml.safe_load(host_vars.read_text())
    del data["endpoint_shape"]["port"]
    host_vars.write_text(yaml.safe_dump(data))
    proc = budget_check(production)
    assert proc.returncode != 0
    assert "endpoint_shape has no port" in proc.stdout and "TASK [frank.llm_fleet.endpoint : Show the ledger" not in proc.stdout


def test_a_typo_in_a_shape_key_fails_at_the_argument_specs(production):
    host_vars = production / "host_vars" / "frank-archon.yml"
    data = yaml.safe_load(host_vars.read_text())
    data["endpoint_shape"]["max_model_lne"] = 4096
    host_vars.write_text(yaml.safe_dump(data))
    proc = budget_check(production)
    assert proc.returncode != 0
    assert "max_model_lne" in proc.stdout and "TASK [frank.llm_fleet.endpoint : Show the ledger" not in proc.stdout


def test_two_endpoints_on_one_machine_and_port_are_refused_before_the_budget(production):
    # frank-dragoon and frank-zealot share dankclaw: give frank-dragoon frank-zealot's port.
    secondary = yaml.safe_load((production / "host_vars" / "frank-zealot.yml").read_text())
    large_file = production / "host_vars" / "frank-dragoon.yml"
    large = yaml.safe_load(large_file.read_text())
    large["endpoint_shape"]["port"] = secondary["endpoint_shape"]["port"]
    large_file.write_text(yaml.safe_dump(large))
    proc = ansible("ansible-playbook", "playbooks/deploy_fleet.yml", "-i", str(production), "--check", "--tags", "budget")
    assert proc.returncode != 0
    port = secondary["endpoint_shape"]["port"]
    # The fleet rolls out one endpoint at a time: the first of the pair is refused, naming the other.
    assert f"frank-zealot: port {port} on dankclaw is also the port of frank-dragoon" in " ".join(proc.stdout.split())
    # frank-archon, alone on dankserver, was priced as usual.
    assert "fits: yes" in proc.stdout
