"""The deploy plan for real: `--check --diff` of playbooks/deploy_fleet.yml against the lab ends
with the callback frank.llm_fleet.deploy_plan's table (enabled in ansible.cfg), one row per
endpoint: a refusal names its gate, the endpoints after it go on (or stay pending when the
operator asks the run to stop at the first failure), a changed shape is a restart. Check mode: nothing on the lab host changes."""

import shutil
import subprocess

import pytest
import yaml
from lab_host import BIN, ROOT, env, inventory_with_shape, lab_shape, on_host, require_lab_host

pytestmark = pytest.mark.lab

require_lab_host()


def plan_rows(*argv: str) -> tuple[int, dict[str, str], str]:
    """Run deploy_fleet.yml with the default stdout callback; the table's rows by endpoint."""
    argv = [str(BIN / "ansible-playbook"), "playbooks/deploy_fleet.yml", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env(), check=False)
    out = proc.stdout
    assert "Deploy plan (check mode: nothing was changed)" in out, out[-3000:]
    table = out.split("Deploy plan (check mode: nothing was changed)", 1)[1].strip().split("\n\n")[0].splitlines()
    assert table[0].split() == ["endpoint", "verdict", "detail"]
    # endpoint -> "verdict detail", the columns' padding collapsed to one space
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in table[1:]}
    return proc.returncode, rows, out


@pytest.mark.parametrize("stop_on_failure", [False, True], ids=["isolated", "stop-on-failure"])
def test_a_refused_first_endpoint_is_named_and_the_rest_follow_the_failure_policy(tmp_path, stop_on_failure):
    # A copy of the lab inventory where frank-primary (first in order) cannot fit its device.
    inventory = tmp_path / "inventories" / "lab"
    shutil.copytree(ROOT / "inventories" / "lab", inventory)
    (tmp_path / ".lab").symlink_to(ROOT / ".lab")
    host_vars = inventory / "host_vars" / "frank-primary.yml"
    primary = yaml.safe_load(host_vars.read_text())
    host_vars.write_text(yaml.safe_dump({**primary, "endpoint_devices": [{"name": "lab-cpu", "memory": "1 MiB"}]}))
    unit_before = on_host("cat", "/etc/systemd/system/frank-primary.service", check=False)

    policy = ["-e", "fleet_stop_on_failure=true"] if stop_on_failure else []
    rc, rows, out = plan_rows("-i", str(inventory), "--check", "--diff", *policy)
    assert rc != 0
    assert list(rows) == ["frank-primary", "frank-secondary"], out[-3000:]
    assert rows["frank-primary"].startswith("refused by a gate (budget)") and "lab-cpu" in rows["frank-primary"]
    if stop_on_failure:
        # The operator's choice: the first failure ends the rollout.
        assert rows["frank-secondary"].startswith("pending"), rows
    else:
        # The default policy (docs/roles.md, "When an endpoint fails"): the rollout goes on.
        assert not rows["frank-secondary"].startswith("pending"), rows
    assert on_host("cat", "/etc/systemd/system/frank-primary.service", check=False) == unit_before


def test_a_changed_shape_is_planned_as_a_restart(tmp_path):
    inventory = inventory_with_shape(tmp_path, "frank-secondary", {**lab_shape("frank-secondary"), "ctx_size": 4096})
    rc, rows, out = plan_rows("-i", str(inventory), "--limit", "frank-secondary", "--check", "--diff")
    assert rc == 0, out[-3000:]
    assert list(rows) == ["frank-secondary"]
    # A fresh lab host has no record yet: then the plan says install.
    assert rows["frank-secondary"].startswith(("shape change (restart)", "new endpoint (install)")), rows
    assert "unit" in rows["frank-secondary"]
