"""A fourth endpoint is an inventory edit only: a copy of inventories/lab gains the host frank-extra
(a second llama-server endpoint on the lab host, its own port and cache directory, otherwise
frank-secondary's settings) and `playbooks/deploy.yml --limit frank-extra` deploys it through every
gate, with nothing under roles/ or playbooks/ changed and frank-secondary untouched."""

import json
import subprocess

import pytest
from lab_host import ROOT, extra_endpoint_inventory, failures, on_host, playbook, remove_endpoint, require_lab_host, unit_property

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-extra"
PORT = 7790
UNIT = f"{NAME}.service"
SECONDARY = "frank-secondary.service"


def roles_and_playbooks_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--", "roles", "playbooks"], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def extra_inventory(tmp_path, request):
    """inventories/lab copied under TMP with the host frank-extra added (frank-secondary's settings on
    its own port and cache directory, its boots and bench results in TMP); removed afterwards."""
    request.addfinalizer(lambda: remove_endpoint(NAME))
    return extra_endpoint_inventory(tmp_path, NAME, PORT)


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
