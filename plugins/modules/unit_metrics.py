#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: unit_metrics
short_description: Install a machine's unit-metrics writer (restarts, active) for the crash-loop alerts, in one call
version_added: 0.1.0
description:
  - Installs the writer C(LIB_DIR/llm_fleet_unit_metrics.py), a oneshot C(llm-fleet-unit-metrics.service)
    whose command names every endpoint unit of the machine, and C(llm-fleet-unit-metrics.timer)
    (every 30 s, enabled and running). The writer puts C(llm_fleet_unit_restarts_total),
    C(llm_fleet_unit_active) and C(llm_fleet_unit_start_time_seconds) for each unit into
    node_exporter's textfile directory, and removes the files of units no longer listed.
  - One remote execution per machine - the role M(frank.llm_fleet.host_metrics) calls it once for
    each machine of the deploy, so a no-op redeploy pays nothing per endpoint for its metrics.
  - Files are rewritten, and systemd reloaded, only when their content differs. The per-endpoint
    template timers of earlier versions (C(llm-fleet-unit-metrics@ENDPOINT.timer)) are disabled,
    stopped and their template files removed.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.CHANGES_HOST
options:
  units:
    description: Every endpoint unit on this machine (C(NAME.service)); an empty list writes no series.
    type: list
    elements: str
    required: true
  textfile_dir:
    description: node_exporter's textfile collector directory (Debian's prometheus-node-exporter reads this one by default).
    type: str
    default: /var/lib/prometheus/node-exporter
  unit_dir:
    description: Where the service and timer are installed.
    type: str
    default: /etc/systemd/system
  lib_dir:
    description: Where the writer script is installed.
    type: str
    default: /usr/local/lib/llm-fleet
"""

EXAMPLES = r"""
- name: The unit metrics of the two endpoints on this machine
  frank.llm_fleet.unit_metrics:
    units: [frank-secondary.service, frank-large.service]
"""

RETURN = r"""
units:
  description: The units the writer reports, sorted.
  returned: always
  type: list
  elements: str
files:
  description: The files written (or, in check mode, that would be written), by path.
  returned: always
  type: list
  elements: str
retired:
  description: The per-endpoint template timers disabled and the legacy files removed.
  returned: success
  type: list
  elements: str
actions:
  description: Every change made on the host (commands as argv, files by path), in order.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.step_report import report
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_metrics import LIB_DIR, TEXTFILE_DIR, UNIT_DIR, ensure_unit_metrics
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "units": {"type": "list", "elements": "str", "required": True},
            "textfile_dir": {"type": "str", "default": TEXTFILE_DIR},
            "unit_dir": {"type": "str", "default": UNIT_DIR},
            "lib_dir": {"type": "str", "default": LIB_DIR},
        },
        supports_check_mode=True,
    )
    report(module, lambda: ensure_unit_metrics(module.params, Host(module.run_command, module.check_mode), module._diff))


if __name__ == "__main__":
    main()
