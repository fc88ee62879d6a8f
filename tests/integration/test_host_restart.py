"""A host restart, for real on an extra lab host (llm-fleet-lab-host2, started here and removed at
the end; host1 and its endpoints are never touched): lab-node2 (frank-secondary's llama-server
settings, port 7800, bound to the LAN with its own nftables table, the controller its one allowed
network) is deployed, the host restarts (systemd boots again), and with no deploy the endpoint is
back: its unit enabled and active, its table loaded again by the unit before its start, serving
its id; the controller (allowed) connects; then a deploy changes nothing. The time from the
restart to serving is printed. A row of the lab fault matrix (docs/lab.md); about 50 s, host2's start included."""

from __future__ import annotations

import subprocess
import time
import urllib.request

import pytest
import yaml
from lab_fleet import NODE_PORT, fleet_inventory, host_name, node_name, start_hosts, stop_hosts
from lab_host import env, failures, on_host, playbook, remove_endpoint, require_lab_host, served

# A fault-matrix row: `make fault-matrix` runs it, `make test` does not (pytest.ini, fault_row).
pytestmark = [pytest.mark.lab, pytest.mark.fault_row]

require_lab_host()

HOST = host_name(2)
NODE = node_name(2)
TABLE = "llm_fleet_" + NODE.replace("-", "_")


@pytest.fixture
def restart_host(tmp_path, request):
    started = start_hosts(2)
    request.addfinalizer(lambda: stop_hosts(started))
    if HOST not in started:
        pytest.skip(f"{HOST} was already running (another run's); this test restarts it, so it owns it")
    request.addfinalizer(lambda: remove_endpoint(NODE, host=HOST))
    inventory = fleet_inventory(2, tmp_path / "fleet")
    address = on_host("ip", "-4", "-o", "addr", "show", "dev", "eth0", host=HOST).split()[3].split("/")[0]
    controller = on_host("ip", "route", "show", "default", host=HOST).split()[2]
    path = inventory / "host_vars" / f"{NODE}.yml"
    node = yaml.safe_load(path.read_text())
    node["endpoint_shape"] = {**node["endpoint_shape"], "bind": "0.0.0.0"}
    node.update(endpoint_allowed_networks=[f"{controller}/32"], endpoint_lan_without_key=True, endpoint_probe=False)
    path.write_text(yaml.safe_dump(node))
    return inventory, address


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return answer.status == 200
    except OSError:
        return False


def test_after_a_host_restart_the_endpoint_serves_again_behind_its_table_with_no_deploy(tmp_path, restart_host):
    inventory, address = restart_host
    rc, _stats, out = playbook(tmp_path, "deploy.yml", inventory=inventory, limit=NODE)
    assert rc == 0, failures(out) or out[-3000:]
    assert served(NODE_PORT, host=HOST) == NODE and answers(f"http://{address}:{NODE_PORT}/health")

    restarted = time.monotonic()
    subprocess.run(["podman", "restart", "-t", "10", HOST], env=env(), capture_output=True, check=True)
    back, now = None, address
    while time.monotonic() - restarted < 180:
        # The host may come back on another address of its network (podman re-attaches it).
        now = (on_host("ip", "-4", "-o", "addr", "show", "dev", "eth0", check=False, host=HOST).split() or [""] * 4)[3].split("/")[0] or now
        if answers(f"http://{now}:{NODE_PORT}/health"):
            back = time.monotonic() - restarted
            break
        time.sleep(1)
    seen = [
        on_host(*argv, check=False, host=HOST)
        for argv in (["ip", "-4", "-o", "addr"], ["ss", "-ltn"], ["nft", "list", "ruleset"], ["systemctl", "status", "--no-pager", f"{NODE}.service"])
    ]
    assert back is not None, f"not served at {now}:{NODE_PORT} (before the restart {address}): " + "\n".join(seen)
    print(f"host restart: {NODE} served again {back:.1f} s after `podman restart {HOST}`, with no deploy (address {address} -> {now})")

    assert on_host("systemctl", "is-enabled", f"{NODE}.service", host=HOST) == "enabled"
    assert served(NODE_PORT, host=HOST) == NODE
    assert f"tcp dport {NODE_PORT}" in on_host("nft", "list", "table", "inet", TABLE, host=HOST)
    rc, stats, out = playbook(tmp_path, "deploy.yml", inventory=inventory, limit=NODE)
    assert rc == 0 and stats["changed"] == 0, failures(out) or out[-3000:]
