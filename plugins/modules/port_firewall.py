#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: port_firewall
short_description: Keep one TCP port to loopback, this host and the networks allowed, with an nftables table of its own
version_added: 0.3.0
description:
  - The endpoints' firewall, for a companion service's port (the webhook relay's). The table
    C(inet llm_fleet_NAME) admits on O(port), in this order, loopback, any source address that is
    this host's own (C(fib saddr type local)), then O(networks), and drops the rest (the seeds'
    lesson - a rule set that admitted only the bridge subnet dropped the host's own health probe
    and failed a healthy deploy).
  - The table is written to C(DIRECTORY/NAME.nft) and applied with C(nft -f) (an atomic
    replacement); a rerun with the same arguments and the table live changes nothing. A unit
    that loads the file before every start (C(ExecStartPre=+nft -f FILE)) keeps it across reboots.
  - O(state=absent) deletes the table and its file.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.CHANGES_HOST
options:
  name:
    description: The service's name; the table is C(inet llm_fleet_NAME) with C(-) as C(_).
    type: str
    required: true
  port:
    description: The TCP port to keep. Required with O(state=present).
    type: int
  networks:
    description: The client networks admitted besides loopback and this host, as CIDRs (at least one).
    type: list
    elements: str
    default: []
  variable:
    description: The inventory variable that lists O(networks), named by errors and the generated file.
    type: str
    default: networks
  state:
    description: Whether the table is installed.
    type: str
    choices: [present, absent]
    default: present
  directory:
    description: Where the table's file lives.
    type: path
    default: /etc/llm-fleet
"""

EXAMPLES = r"""
- name: The webhook relay's port - loopback, the host, the podman bridge, then drop
  frank.llm_fleet.port_firewall:
    name: webhook-relay
    port: 18093
    networks: [10.89.0.0/16, 192.168.0.143/32]
    variable: webhook_relay_bridge_networks
"""

RETURN = r"""
path:
  description: The table's file.
  returned: always
  type: str
  sample: /etc/llm-fleet/webhook-relay.nft
table:
  description: The table's name (family inet).
  returned: always
  type: str
  sample: llm_fleet_webhook_relay
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.firewall import PolicyError, ensure_firewall, service_firewall, table_name
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.step_report import StepError, report
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "port": {"type": "int"},
            "networks": {"type": "list", "elements": "str", "default": []},
            "variable": {"type": "str", "default": "networks"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "directory": {"type": "path", "default": "/etc/llm-fleet"},
        },
        required_if=[("state", "present", ["port"])],
        supports_check_mode=True,
    )
    params = module.params
    host = Host(module.run_command, module.check_mode)

    def step() -> dict:
        firewall = None
        if params["state"] == "present":
            try:
                firewall = service_firewall(params["name"], params["port"], params["networks"], params["variable"])
            except PolicyError as exc:
                raise StepError(str(exc), {"changed": False}) from None
        result = ensure_firewall(params["name"], firewall, host, module._diff, params["directory"])
        result.pop("pre_start", None)
        return {**result, "table": table_name(params["name"])}

    report(module, step)


if __name__ == "__main__":
    main()
