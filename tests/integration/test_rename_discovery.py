"""A renamed LAN endpoint's old unit is found and retired with its firewall, for real on the lab
host, without the operator listing it: frank-ren-a (frank-secondary's llama-server settings,
bind 0.0.0.0, one allowed network: the controller's; port 7806) is deployed with its nftables
table; the inventory then renames it frank-ren-b (the host renamed, nothing in
endpoint_retired_units). One deploy of frank-ren-b finds frank-ren-a's unit from its kept record
(the same port), stops, archives and masks it, deletes its table `inet llm_fleet_frank_ren_a` and
archives its rules file; frank-ren-b serves on the port behind its own table. A rerun changes
nothing."""

from __future__ import annotations

import json

import pytest
from lab_host import extra_endpoint_inventory, failures, lab_addresses, on_host, playbook, remove_endpoint, require_lab_host, served, unit_property

# A fault-matrix row: `make fault-matrix` runs it, `make test` does not (pytest.ini, fault_row).
pytestmark = [pytest.mark.lab, pytest.mark.fault_row]

require_lab_host()

OLD, NEW = "frank-ren-a", "frank-ren-b"
PORT = 7806


def exists(path: str) -> bool:
    return on_host("sh", "-c", f"test -e {path} && echo yes", check=False) == "yes"


def table(name: str) -> str:
    return on_host("nft", "list", "table", "inet", "llm_fleet_" + name.replace("-", "_"), check=False)


@pytest.fixture
def lan(tmp_path, request):
    def cleanup() -> None:
        remove_endpoint(NEW)
        remove_endpoint(OLD)
        on_host("systemctl", "unmask", f"{OLD}.service", check=False)
        on_host("sh", "-c", f"rm -rf /var/lib/llm-fleet/archive/*/{OLD}.service* /var/lib/llm-fleet/archive/*/{OLD}.nft")
        on_host("find", "/var/lib/llm-fleet/archive", "-mindepth", "1", "-maxdepth", "1", "-type", "d", "-empty", "-delete", check=False)
        on_host("systemctl", "daemon-reload")

    request.addfinalizer(cleanup)
    _own, controller = lab_addresses()
    return {"endpoint_shape": {"bind": "0.0.0.0"}, "endpoint_allowed_networks": [f"{controller}/32"], "endpoint_lan_without_key": True, "endpoint_probe": False}


def deploy(tmp_path, inventory, name):
    rc, stats, out = playbook(tmp_path, "deploy.yml", inventory=inventory, limit=name)
    assert rc == 0, failures(out) or out[-3000:]
    data = json.loads(out[out.index("{") :])
    steps = [
        task["hosts"][name]["steps"]
        for play in data["plays"]
        for task in play["tasks"]
        if "Deploy through the engine" in task["task"]["name"] and "steps" in task["hosts"].get(name, {})
    ]
    return stats, (steps[-1] if steps else {})


def test_a_renamed_lan_endpoints_old_unit_and_table_are_retired_without_being_listed(tmp_path, lan):
    old_inventory = extra_endpoint_inventory(tmp_path / "a", OLD, PORT, **lan)
    deploy(tmp_path, old_inventory, OLD)
    assert served(PORT) == OLD and f"tcp dport {PORT}" in table(OLD)

    # The rename: another inventory host on the same port; the old one is simply gone from it.
    new_inventory = extra_endpoint_inventory(tmp_path / "b", NEW, PORT, **lan)
    _stats, steps = deploy(tmp_path, new_inventory, NEW)
    [retired] = steps["retire"]["units"]
    assert retired["unit"] == f"{OLD}.service" and retired["state"] == "retired", retired
    assert f"/var/lib/llm-fleet/{OLD}/last-good.json serves port {PORT}" in retired["found"], retired
    assert retired["firewall"]["table_deleted"] is True, retired
    archive = retired["archived_to"].rsplit("/", 1)[0]
    assert on_host("sh", "-c", f"ls {archive}").split() == sorted([f"{OLD}.nft", f"{OLD}.service"])
    assert (unit_property(f"{OLD}.service", "UnitFileState"), unit_property(f"{OLD}.service", "ActiveState")) == ("masked", "inactive")
    assert table(OLD) == "" and not exists(f"/etc/llm-fleet/{OLD}.nft")
    assert served(PORT) == NEW and f"tcp dport {PORT}" in table(NEW)
    # The old name's record is kept (rollbacks and the OpenWebUI re-key read it).
    assert exists(f"/var/lib/llm-fleet/{OLD}/last-good.json")

    stats, steps = deploy(tmp_path, new_inventory, NEW)
    assert stats["changed"] == 0, steps
