"""endpoint_depends_on in a fleet run, through ansible-playbook with the role's own fault-isolation
task files (roles/endpoint/tasks/fleet_blocked.yml and fleet_failed.yml) in the play structure of
playbooks/deploy.yml (serial, a block whose rescue keeps the failure): three endpoints on the
controller, the first one's deploy fails (a stand-in task), the second depends on it and is not
reached, naming the failed dependency and why it failed, the third (no dependency) is deployed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow

PLAY = """
- name: Deploy llm_endpoints
  hosts: llm_endpoints
  serial: 1
  max_fail_percentage: 0
  gather_facts: false
  tasks:
    - name: Deploy the endpoint, or keep why it failed and go on
      block:
        - name: Skip an endpoint whose dependency failed
          ansible.builtin.import_role: {name: frank.llm_fleet.endpoint, tasks_from: fleet_blocked.yml}
        - name: Deploy (stand-in)
          ansible.builtin.fail: {msg: the engine refused --no-such-flag}
          when: inventory_hostname == 'frank-drafter'
        - name: Deployed
          ansible.builtin.debug: {msg: "deployed {{ inventory_hostname }}"}
      rescue:
        - name: Keep the failure
          ansible.builtin.import_role: {name: frank.llm_fleet.endpoint, tasks_from: fleet_failed.yml}
"""


def test_an_endpoint_whose_dependency_failed_is_not_reached_and_the_others_deploy(tmp_path):
    inventory = {
        "all": {
            "children": {
                "llm_endpoints": {
                    "hosts": {
                        "frank-drafter": {},
                        "frank-target": {"endpoint_depends_on": ["frank-drafter"]},
                        "frank-other": {"endpoint_depends_on": []},
                    },
                    "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
                }
            }
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(PLAY)
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "PATH": f"{BIN}:{os.environ['PATH']}"}
    argv = [str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    ran: dict[str, list[str]] = {}
    facts: dict[str, dict] = {}
    for play in out["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if not result.get("skipped"):
                    ran.setdefault(host, []).append(task["task"]["name"])
                facts.setdefault(host, {}).update(result.get("ansible_facts") or {})
    assert "Deployed" not in ran["frank-drafter"] and "frank.llm_fleet.endpoint : Keep why this endpoint failed - frank-drafter" in ran["frank-drafter"]
    assert "Deployed" not in ran["frank-target"], ran["frank-target"]
    reason = facts["frank-target"]["__fleet_not_reached"]
    assert "depends on frank-drafter, which failed in this run" in reason and "--no-such-flag" in reason, reason
    assert "Deployed" in ran["frank-other"], ran["frank-other"]
