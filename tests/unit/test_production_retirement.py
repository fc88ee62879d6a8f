"""The wire rename's retirement in inventories/production: each old unit (frank-primary,
-secondary, -large.service) is retired by the endpoint that now holds its role, on the machine that
ran it (the seeds), and what the deploy and the fleet plan read of it."""

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.filter.fleet_site import fleet_endpoints, served_id_renames
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.retire import _RETIRE_NAME_RE
from ansible_collections.frank.llm_fleet.plugins.plugin_utils import served_ids

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}

# The seeds: seed 004 "The 2026-10-09 wire aliases become the service names everywhere: systemd
# units, ..."; frank-primary's root unit on dankserver (seed 000 "frank-primary.service (root unit",
# seed 001 "Dankserver's :7770 endpoint"), frank-secondary (frank-small before) on dankclaw's 3090
# (seed 004 "scripts/{frank-small.env,frank-small.service,...} -> frank-secondary.*"), frank-large on
# dankclaw (seed 001 "dankclaw is memory-tight (frank-large's 70 GiB GTT ...").
RETIRED = {
    "frank-archon": ("dankserver", ["frank-primary.service"]),
    "frank-zealot": ("dankclaw", ["frank-secondary.service"]),
    "frank-dragoon": ("dankclaw", ["frank-large.service"]),
}


@pytest.fixture(scope="module")
def production():
    proc = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", "inventories/production", "--list"], capture_output=True, text=True, cwd=ROOT, env=ENV, check=True
    )
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_each_old_unit_is_retired_by_the_endpoint_holding_its_role_on_the_machine_that_ran_it(production):
    hostvars = production["_meta"]["hostvars"]
    found = {name: (hostvars[name]["ansible_host"], hostvars[name].get("endpoint_retired_units")) for name in production["llm_endpoints"]["hosts"]}
    assert found == RETIRED


@pytest.mark.slow
def test_no_endpoint_retires_a_unit_the_fleet_runs_and_each_name_is_one_the_deploy_takes(production):
    endpoints = production["llm_endpoints"]["hosts"]
    served = {f"{name}.service" for name in endpoints}
    retired = [unit for name in endpoints for unit in production["_meta"]["hostvars"][name].get("endpoint_retired_units", [])]
    assert not served & set(retired) and len(retired) == len(set(retired))
    assert all(_RETIRE_NAME_RE.match(unit) for unit in retired)


def test_the_deploy_and_its_no_op_proof_hand_the_retirement_to_endpoint_deploy():
    # Both endpoint_deploy calls (the no-op proof compares retired units too) take the inventory's list.
    for name in ("deploy.yml", "noop.yml"):
        tasks = yaml.safe_load((ROOT / "roles" / "endpoint" / "tasks" / name).read_text())
        (call,) = [task["frank.llm_fleet.endpoint_deploy"] for task in tasks if "frank.llm_fleet.endpoint_deploy" in task]
        assert call["retire_units"] == "{{ endpoint_retired_units }}", name


@pytest.mark.slow
def test_the_production_fleet_run_re_keys_each_old_id_to_its_wire_name(production):
    # What the companions compute from the production inventory once playbooks/retired_served_ids.yml
    # has read the retired units' records on dankserver and dankclaw (each old endpoint served its own
    # name: the aliases frank-primary, frank-secondary, frank-large).
    hostvars = {name: dict(hv) for name, hv in production["_meta"]["hostvars"].items()}
    endpoints = production["llm_endpoints"]["hosts"]
    for name in endpoints:
        reads = [
            {"item": unit, "content": base64.b64encode(json.dumps({"shape": {"served_id": unit.removesuffix(".service")}}).encode()).decode()}
            for unit in hostvars[name]["endpoint_retired_units"]
        ]
        hostvars[name]["__fleet_retired_served_ids"] = served_ids.retired_served_ids(reads)[0]
    renames = served_id_renames(fleet_endpoints(endpoints, hostvars))
    assert renames == [
        {"from": "frank-primary", "to": "frank-archon"},
        {"from": "frank-secondary", "to": "frank-zealot"},
        {"from": "frank-large", "to": "frank-dragoon"},
    ]
