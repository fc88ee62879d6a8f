#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deploy_table
short_description: Print the deploy's table (one verdict per endpoint) without the deploy_plan callback
version_added: 0.4.0
description:
  - Runs on the controller only (an action plugin; nothing is sent to a host). Builds the table the
    C(frank.llm_fleet.deploy_plan) callback prints at the end of a deploy - one row per endpoint,
    "unchanged" (a proven no-op), "shape change (restart)", "refused by a gate", "rolled back",
    "not reached", "fits" (a budget-only run, then titled a fleet plan) - from what the run left on
    each endpoint, and prints it at the default verbosity, as a debug message is printed.
  - C(playbooks/deploy.yml) and C(deploy_fleet.yml) run it where the callback is not enabled, so a
    user reads the verdicts with no C(ansible.cfg) line; the callback's own table also lists every play.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.READ_ONLY
options:
  endpoints:
    description: The endpoints (inventory hosts) of the table, in order; default - the play's hosts.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: The deploy's table, where the deploy_plan callback is not enabled
  frank.llm_fleet.deploy_table:
    endpoints: "{{ ansible_play_hosts_all }}"
  run_once: true
  when: "'frank.llm_fleet.deploy_plan' not in lookup('ansible.builtin.config', 'CALLBACKS_ENABLED')"
"""

RETURN = r"""
msg:
  description: The table, one line per item.
  returned: always
  type: list
  elements: str
"""
