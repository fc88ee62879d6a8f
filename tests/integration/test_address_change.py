"""The companions follow their host's address (the fault matrix's finding: after the host restarted
with a new address, Caddy failed with "bind: cannot assign requested address" and the relay
crash-looped with Errno 99 until a redeploy; nothing reported it).

On an extra lab host (llm-fleet-lab-host2, started here and removed at the end; host1 and its
endpoints are never touched): the webhook relay and the homepage deployed on its own address, the
host restarted on another address (the container's network re-attached with a new static IP), the
fault reproduced (both services fail on the old address), then one plain deploy_fleet.yml run
converges both and each answers on the new address. The recovery time printed is that run's."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import time
import urllib.request

import pytest
import yaml
from lab_fleet import start_hosts, stop_hosts
from lab_host import LAB_INVENTORY, env, failures, on_host, playbook, require_lab_host

# A fault-matrix row: `make fault-matrix` runs it, `make test` does not (pytest.ini, fault_row).
pytestmark = [pytest.mark.lab, pytest.mark.fault_row]

require_lab_host()

HOST = "llm-fleet-lab-host2"
RELAY_PORT = 18093
HOMEPAGE_PORT = 8088
RELAY_UNIT = "llm-fleet-webhook-relay.service"


def _podman(*argv: str) -> str:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, env=env(), check=True).stdout.strip()


def _address() -> str:
    return on_host("ip", "-4", "-o", "addr", "show", "dev", "eth0", host=HOST).split()[3].split("/")[0]


def _answers(url: str) -> bool:
    """A 200 for the controller (the homepage: a user's browser)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def _relay_answers(address: str) -> bool:
    """The relay's health from the host itself: its firewall admits the host's own addresses and the
    podman bridge, not the controller."""
    return on_host("curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", f"http://{address}:{RELAY_PORT}/health", check=False, host=HOST) == "200"


def _inventory(root) -> str:
    """The lab's companion groups with their hosts on HOST, and no endpoints."""
    inventory = root / "inventory"
    shutil.copytree(LAB_INVENTORY / "group_vars", inventory / "group_vars")
    shutil.rmtree(inventory / "group_vars" / "searxng_services")
    # The stand-in signal-cli is named relative to the inventory directory.
    for name in ("webhook_relays",):
        path = inventory / "group_vars" / name / "main.yml"
        path.write_text(path.read_text().replace("{{ inventory_dir }}/../../lab", str(LAB_INVENTORY.parent.parent / "lab")))
    hosts = {
        "all": {
            "children": {
                "lab_hosts": {"hosts": {HOST: None}},
                "llm_endpoints": {"hosts": {}},
                "webhook_relays": {"hosts": {"webhook-relay": {"ansible_host": HOST}}},
                "homepages": {"hosts": {"homepage": {"ansible_host": HOST}}},
            }
        }
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inventory


def _restart_on_new_address(old: str) -> str:
    """Stop HOST, attach it to its network again with another static address, start it."""
    network = _podman("inspect", HOST, "--format", "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}}{{end}}")
    subnet = ipaddress.ip_network(_podman("network", "inspect", network, "--format", "{{range .Subnets}}{{.Subnet}}{{end}}"))
    taken = set(_podman("ps", "--format", "{{.Names}}").split())
    used = {_podman("inspect", name, "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}") for name in taken}
    new = next(str(host) for host in list(subnet.hosts())[200:] if str(host) not in used and str(host) != old)
    _podman("stop", "-t", "10", HOST)
    _podman("network", "disconnect", network, HOST)
    _podman("network", "connect", "--ip", new, network, HOST)
    _podman("start", HOST)
    for _second in range(60):
        if on_host("systemctl", "is-system-running", check=False, host=HOST) in ("running", "degraded"):
            break
        time.sleep(1)
    return new


@pytest.fixture
def companion_host(request):
    started = start_hosts(2)
    request.addfinalizer(lambda: stop_hosts(started))
    if HOST not in started:
        pytest.skip(f"{HOST} was already running (another run's); this test owns its host")
    return HOST


def test_an_address_change_is_converged_by_one_fleet_run(tmp_path, companion_host):
    inventory = _inventory(tmp_path)
    rc, _stats, out = playbook(tmp_path, "deploy_fleet.yml", inventory=inventory)
    assert rc == 0, failures(out) or out[-3000:]
    old = _address()
    assert _relay_answers(old) and _answers(f"http://{old}:{HOMEPAGE_PORT}/docs")

    new = _restart_on_new_address(old)
    assert new != old and _address() == new
    # The fault, as the fleet met it: both services still name the old address and fail.
    time.sleep(5)
    assert not _relay_answers(new)
    assert not _answers(f"http://{new}:{HOMEPAGE_PORT}/docs")

    started = time.monotonic()
    rc, stats, out = playbook(tmp_path, "deploy_fleet.yml", inventory=inventory)
    recovered = time.monotonic() - started
    assert rc == 0, failures(out) or out[-3000:]
    assert stats["changed"] > 0
    assert _relay_answers(new), "the relay does not answer on the new address"
    assert _answers(f"http://{new}:{HOMEPAGE_PORT}/docs"), "the homepage does not answer on the new address"
    assert on_host("systemctl", "is-active", RELAY_UNIT, check=False, host=HOST) == "active"
    print(f"address change {old} -> {new}: one deploy_fleet.yml run served the relay and the homepage again in {recovered:.1f} s")

    # A second run changes nothing.
    rc, stats, out = playbook(tmp_path, "deploy_fleet.yml", inventory=inventory)
    assert rc == 0 and stats["changed"] == 0, failures(out) or out[-3000:]
