"""The rollout's first step for each endpoint (roles/endpoint/tasks/fleet_blocked.yml, in
playbooks/deploy.yml's one-at-a-time play) through ansible-playbook: an endpoint refused before the
rollout, or proven a no-op and depending on none, ends with no task run; one whose dependency
failed is "not reached" (the fact the deploy plan reads), proven or not; the others go on."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # ansible-playbook

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# name -> (what the first pass left on it, its endpoint_depends_on)
ENDPOINTS = {
    "refused": ({"__fleet_failure": "Check the endpoint's variables (preflight): no port"}, []),
    "proven": ({"__endpoint_noop": {"noop": True, "main_pid": 7}}, []),
    "proven-behind-refused": ({"__endpoint_noop": {"noop": True, "main_pid": 8}}, ["refused"]),
    "proven-behind-proven": ({"__endpoint_noop": {"noop": True, "main_pid": 9}}, ["proven"]),
    "not-proven": ({"__endpoint_noop": {"noop": False, "full_path_reason": "record: none"}}, []),
}


def test_the_rollout_ends_refused_and_proven_endpoints_and_not_reached_ones(tmp_path):
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    # What the first pass leaves as facts, given here as the hosts' variables (read the same way).
    hosts = {name: {**local, **facts, "endpoint_depends_on": deps} for name, (facts, deps) in ENDPOINTS.items()}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"llm_endpoints": {"hosts": hosts}}}}))
    plays = [
        {
            "name": "The rollout",
            "hosts": "llm_endpoints",
            "serial": 1,
            "gather_facts": False,
            "tasks": [
                {"ansible.builtin.import_role": {"name": "frank.llm_fleet.endpoint", "tasks_from": "fleet_blocked.yml"}},
                {"name": "Reached", "ansible.builtin.debug": {"msg": "reached"}},
            ],
        },
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "PATH": f"{BIN}:{os.environ['PATH']}"}
    argv = [str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    ran: dict[str, set[str]] = {}
    not_reached = {}
    for play in out["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if not result.get("skipped"):
                    ran.setdefault(host, set()).add(task["task"]["name"])
                if "__fleet_not_reached" in (result.get("ansible_facts") or {}):
                    not_reached[host] = " ".join(result["ansible_facts"]["__fleet_not_reached"].split())
    reached = {host for host, names in ran.items() if "Reached" in names}
    assert reached == {"not-proven"}, ran
    assert not_reached == {"proven-behind-refused": "depends on refused, which failed in this run (Check the endpoint's variables (preflight): no port)"}
    # Ended in the strategy with no task run: the refused one and the proven one depending on none.
    assert "refused" not in ran and "proven" not in ran, ran
