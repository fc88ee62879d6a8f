"""Many hosts for real: a lab of three container hosts (llm-fleet-lab-host1, and host2 and host3
started here if missing and removed at the end), the fleet inventory
scripts/lab_fleet_inventory.py writes for them (lab-node1..3, one llama-server each) and
playbooks/deploy_fleet.yml rolling all three out at once (fleet_batch_size=3, --forks 3): a cold
deploy brings every endpoint up serving, the redeploy changes nothing. About 2 minutes, most of it
loading the llama.cpp engine into the two new hosts."""

import json

import pytest
from lab_fleet import NODE_PORT, deploy, fleet_inventory, host_name, node_name, remove_nodes, start_hosts, stop_hosts
from lab_host import failures, require_lab_host, served

pytestmark = pytest.mark.lab

require_lab_host()

COUNT = 3


@pytest.fixture
def fleet(tmp_path, request):
    started = start_hosts(COUNT)
    request.addfinalizer(lambda: stop_hosts(started))
    request.addfinalizer(lambda: remove_nodes(COUNT))
    remove_nodes(COUNT)  # cold: nothing of an earlier run left
    return fleet_inventory(COUNT, tmp_path / "fleet")


def deploy_batches(out: str) -> int:
    """How many batches the endpoint play ran in: each serial batch is a play of its own in the output
    (the companion services' plays that deploy_fleet.yml imports after it do not count)."""
    return sum(play["play"]["name"] == "Deploy llm_endpoints" for play in json.loads(out[out.index("{") :])["plays"])


def test_three_hosts_deploy_at_once_and_redeploy_as_a_no_op(tmp_path, fleet):
    seconds, rc, stats, out = deploy(tmp_path, fleet, COUNT)
    assert rc == 0, failures(out) or out[-3000:]
    assert deploy_batches(out) == 1, "fleet_batch_size=3 should deploy the three endpoints in one batch"
    assert stats["changed"] > 0
    for index in range(1, COUNT + 1):
        assert served(NODE_PORT, host=host_name(index)) == node_name(index)
    print(f"cold fleet deploy of {COUNT} hosts: {seconds:.1f} s")

    seconds, rc, stats, out = deploy(tmp_path, fleet, COUNT)
    assert rc == 0, failures(out) or out[-3000:]
    assert stats["changed"] == 0, out[-3000:]
    for index in range(1, COUNT + 1):
        assert served(NODE_PORT, host=host_name(index)) == node_name(index)
    print(f"no-op fleet redeploy of {COUNT} hosts: {seconds:.1f} s")
