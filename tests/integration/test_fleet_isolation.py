"""Fault isolation in a fleet run (playbooks/deploy_fleet.yml): one endpoint breaks, the run goes on.

A copy of inventories/lab gains frank-broken (frank-secondary's settings on its own port), first in
inventory order. It is deployed green, then its shape is broken (an engine flag llama-server refuses,
so it dies at boot) and deploy_fleet.yml runs over frank-broken, frank-secondary, the webhook relay
and the homepage. Before, the first failure stopped the rollout: frank-secondary was left pending and
no companion play ran. Now frank-broken is rolled back (its last-known-good shape serves again),
frank-secondary, the relay and the homepage converge, the browser gate crawls the homepage, the run
ends failed, and the plan table says what deployed, what rolled back and why, and each play's outcome.
With fleet_stop_on_failure the rollout stops at the failure as before."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml
from lab_host import (
    BIN,
    ROOT,
    env,
    extra_endpoint_inventory,
    failures,
    lab_addresses,
    on_host,
    playbook,
    remove_endpoint,
    require_lab_host,
    served,
    unit_property,
    write_endpoint_vars,
)

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-broken"
PORT = 7791
SECONDARY = "frank-secondary"
LIMIT = f"{NAME},{SECONDARY},webhook-relay,homepage"


@pytest.fixture
def broken_first(tmp_path, request):
    """The lab inventory with frank-broken first among the endpoints; removed afterwards."""
    request.addfinalizer(lambda: remove_endpoint(NAME))
    inventory = extra_endpoint_inventory(tmp_path, NAME, PORT)
    (tmp_path / "lab").symlink_to(ROOT / "lab")  # the relay's signal-cli stand-in, found from inventory_dir
    hosts_file = inventory / "hosts.yml"
    hosts = yaml.safe_load(hosts_file.read_text())
    endpoints = hosts["all"]["children"]["llm_endpoints"]["hosts"]
    hosts["all"]["children"]["llm_endpoints"]["hosts"] = {NAME: endpoints.pop(NAME), **endpoints}
    hosts_file.write_text(yaml.safe_dump(hosts, sort_keys=False))
    return inventory


def plain_run(inventory, *extra: str) -> tuple[int, str, float]:
    """deploy_fleet.yml with the default stdout callback, so the deploy plan's table is printed."""
    argv = [str(BIN / "ansible-playbook"), "playbooks/deploy_fleet.yml", "-i", str(inventory), "--limit", LIMIT, *extra]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**env(), "ANSIBLE_NOCOLOR": "1"}, check=False)
    return proc.returncode, proc.stdout, time.perf_counter() - started


def table(out: str) -> dict[str, str]:
    """The deploy result's rows (endpoints and plays): first column -> the rest of the line."""
    lines = out[out.rindex("Deploy result") :].splitlines()
    rows = {}
    for line in lines[2:]:
        if line.startswith(("PLAY RECAP", "****")):
            break
        parts = line.split("  ", 1)
        if len(parts) == 2:
            rows[parts[0].strip()] = " ".join(parts[1].split())
    return rows


def test_a_broken_endpoint_rolls_back_and_the_fleet_and_its_companions_go_on(tmp_path, broken_first):
    rc, _stats, out = playbook(tmp_path, "deploy.yml", inventory=broken_first, limit=NAME)
    assert rc == 0, failures(out) or out[-3000:]
    good_pid = unit_property(f"{NAME}.service", "MainPID")
    write_endpoint_vars(broken_first, NAME, PORT, endpoint_shape={"extra_args": ["--no-such-flag"]})

    gate_dir = tmp_path / "gate"
    rc, out, seconds = plain_run(broken_first, "-e", f"browser_gate_report_dir={gate_dir}")
    print(f"fault-isolated fleet run: {seconds:.1f} s")
    assert rc != 0, out[-3000:]

    # frank-broken: rolled back, its last-known-good shape serving again.
    assert "--no-such-flag" not in unit_property(f"{NAME}.service", "ExecStart")
    assert served(PORT) == NAME
    assert unit_property(f"{NAME}.service", "MainPID") != good_pid  # the old shape was brought up again
    # The endpoint after it and the companions converged; the gate crawled the homepage.
    assert unit_property(f"{SECONDARY}.service", "ActiveState") == "active" and served(7771) == SECONDARY
    own = lab_addresses()[0]
    relay = json.loads(on_host("curl", "-sf", f"http://{own}:18093/health"))
    assert relay["status"] == "ok"
    assert "<html" in on_host("curl", "-sf", f"http://{own}:8088/").lower()
    report = json.loads((gate_dir / "report.json").read_text())
    assert report["ok"], report

    rows = table(out)
    assert rows[NAME].startswith("rolled back health:") and "last-known-good shape is serving again" in rows[NAME], rows
    assert rows[SECONDARY].split()[0] in ("unchanged", "shape", "started", "cosmetic", "new"), rows
    assert "pending" not in rows[SECONDARY]
    assert rows["Deploy the webhook relay"].split()[0] in ("ok", "changed"), rows
    assert rows["Deploy the homepage"].split()[0] in ("ok", "changed"), rows
    assert rows["Gate each homepage with a real browser"].split()[0] in ("ok", "changed"), rows
    assert rows["Report the endpoints that failed, after the companions"].startswith(f"failed {NAME}:"), rows

    # fleet_stop_on_failure: the rollout stops at the failure, the later endpoint is pending.
    rc, out, _seconds = plain_run(broken_first, "-e", "fleet_stop_on_failure=true")
    assert rc != 0
    rows = table(out)
    assert rows[NAME].startswith("rolled back"), rows
    assert rows[SECONDARY].startswith("pending"), rows
    assert rows["Deploy the webhook relay"].startswith("not reached"), rows
    assert on_host("systemctl", "is-active", f"{NAME}.service") == "active"
