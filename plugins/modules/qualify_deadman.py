#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: qualify_deadman
short_description: The host's dead-man's switch of a qualification window
version_added: 0.5.0
description:
  - Keeps an endpoint serving whatever happens to the controller during a qualification window
    (docs/qualify.md). O(state=saved) copies the production unit file beside itself
    (C(UNIT.qualify-last-good)); O(state=armed) arms (again) a transient systemd timer that, unless
    armed again or removed within O(seconds), puts the saved unit file back, reloads systemd and
    restarts the unit, on the host alone; O(state=restored) runs that restore now;
    O(state=absent) stops the timer and removes the saved copy.
  - O(state=saved) refuses while a switch of the unit is still armed - an earlier window's
    controller died and its copy is the last-good one.
  - Runs on the endpoint's host, as root.
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: full
    description: In check mode the commands are listed in C(actions) and none runs.
  diff_mode:
    support: none
    description: No diff is returned; C(actions) lists the commands.
  idempotent:
    support: none
    description: Every call re-arms or changes the switch, so it always reports a change.
options:
  unit:
    description: The production unit, C(NAME.service).
    type: str
    required: true
  seconds:
    description: Seconds without a word from the controller before the host restores the unit (at least 10; longer than one rung's boot and probe).
    type: int
    default: 900
  state:
    description: What to do with the switch.
    type: str
    choices: [saved, armed, restored, absent]
    required: true
  unit_dir:
    description: The directory of the unit file.
    type: path
    default: /etc/systemd/system
"""

EXAMPLES = r"""
- name: Arm the switch before a rung
  frank.llm_fleet.qualify_deadman:
    unit: frank-secondary.service
    seconds: 600
    state: armed
"""

RETURN = r"""
timer:
  description: The transient timer's name.
  returned: success
  type: str
saved_path:
  description: The saved last-good unit file.
  returned: success
  type: str
actions:
  description: The commands run (or, in check mode, that would run).
  returned: success
  type: list
  elements: str
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.deadman import DeadMan, apply


def main() -> None:
    run_module(
        {
            "unit": {"type": "str", "required": True},
            "seconds": {"type": "int", "default": 900},
            "state": {"type": "str", "required": True, "choices": ["saved", "armed", "restored", "absent"]},
            "unit_dir": {"type": "path", "default": "/etc/systemd/system"},
        },
        lambda call: apply(call.host, DeadMan(call.params["unit"], call.params["seconds"], call.params["unit_dir"]), call.params["state"]),
        errors=(ValueError,),
    )


if __name__ == "__main__":
    main()
