"""A fourth endpoint is an inventory edit only: a copy of inventories/lab gains the host frank-extra
(a second llama-server endpoint on the lab host, its own port and cache directory, otherwise
frank-secondary's settings) and `playbooks/deploy.yml --limit frank-extra` deploys it through every
gate, with nothing under roles/ or playbooks/ changed and frank-secondary untouched."""

import json
import shutil
import subprocess

import pytest
import yaml
from lab_host import HOST, ROOT, failures, on_host, playbook, require_lab_host, unit_property

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-extra"
PORT = 7790
UNIT = f"{NAME}.service"
SECONDARY = "frank-secondary.service"


def roles_and_playbooks_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--", "roles", "playbooks"], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def remove_extra_endpoint() -> None:
    """Everything the deploy created on the lab host for frank-extra."""
    on_host("systemctl", "disable", "--now", UNIT, check=False)
    on_host("podman", "rm", "-f", "--ignore", NAME, check=False)
    on_host(
        "rm",
        "-rf",
        f"/etc/systemd/system/{UNIT}",
        f"/etc/llm-fleet/{NAME}.env",
        f"/etc/llm-fleet/{NAME}.podman.env",
        f"/var/lib/llm-fleet/{NAME}",
        f"/var/cache/{NAME}",
        f"/var/lib/prometheus/node-exporter/llm_fleet_{UNIT}.prom",
    )
    on_host("systemctl", "daemon-reload")
    on_host("systemctl", "reset-failed", UNIT, check=False)


@pytest.fixture
def extra_inventory(tmp_path, request):
    """inventories/lab copied to TMP/inventories/lab (TMP/.lab links the lab's facts, as ../../.lab
    does in the tree) with the host frank-extra added; the lab host is cleaned up afterwards."""
    inventory = tmp_path / "inventories" / "lab"
    shutil.copytree(ROOT / "inventories" / "lab", inventory)
    (tmp_path / ".lab").symlink_to(ROOT / ".lab")
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["llm_endpoints"]["hosts"][NAME] = {"ansible_host": HOST}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    secondary = yaml.safe_load((inventory / "host_vars" / "frank-secondary.yml").read_text())
    extra = {
        **secondary,
        "endpoint_shape": {**secondary["endpoint_shape"], "port": PORT},
        "endpoint_container": {**secondary["endpoint_container"], "cache_dir": f"/var/cache/{NAME}"},
        # This test's boots and bench results stay in its own directory, not in the lab's store.
        "llm_fleet_calibration_dir": str(tmp_path / "calibration"),
        "llm_fleet_bench_dir": str(tmp_path / "bench"),
    }
    (inventory / "host_vars" / f"{NAME}.yml").write_text(yaml.safe_dump(extra))
    request.addfinalizer(remove_extra_endpoint)
    return inventory


def test_a_fourth_endpoint_is_an_inventory_edit_only(tmp_path, extra_inventory):
    status = roles_and_playbooks_status()
    assert status == "", f"roles/ or playbooks/ differ from the commit, so this would prove nothing:\n{status}"
    if unit_property(SECONDARY, "ActiveState") != "active":
        rc, _stats, out = playbook(tmp_path, "deploy_secondary.yml")
        assert rc == 0, failures(out)
    secondary_pid = unit_property(SECONDARY, "MainPID")
    secondary_unit = on_host("cat", f"/etc/systemd/system/{SECONDARY}")

    rc, stats, out = playbook(tmp_path, "deploy.yml", inventory=extra_inventory, limit=NAME)
    assert rc == 0, failures(out) or out[-3000:]
    assert stats["changed"] > 0 and stats["failures"] == 0

    assert unit_property(UNIT, "ActiveState") == "active"
    assert on_host("curl", "-sf", f"http://127.0.0.1:{PORT}/health")
    models = json.loads(on_host("curl", "-sf", f"http://127.0.0.1:{PORT}/v1/models"))
    assert [model["id"] for model in models["data"]] == [NAME]  # served_id defaults to the endpoint's name
    body = {"model": NAME, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    answer = json.loads(on_host("curl", "-sf", "-H", "Content-Type: application/json", "-d", json.dumps(body), f"http://127.0.0.1:{PORT}/v1/chat/completions"))
    assert answer["usage"]["completion_tokens"] > 0 and answer["choices"][0]["message"]["content"]
    record = json.loads(on_host("cat", f"/var/lib/llm-fleet/{NAME}/last-good.json"))
    assert record["shape"]["port"] == PORT and record["shape"]["served_id"] == NAME

    # frank-secondary, on the same lab host, was not touched.
    assert unit_property(SECONDARY, "MainPID") == secondary_pid
    assert on_host("cat", f"/etc/systemd/system/{SECONDARY}") == secondary_unit
    assert roles_and_playbooks_status() == ""
