#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: endpoint_preflight
short_description: The endpoint role's controller-side checks of an endpoint's variables, every problem named with its file and line
version_added: 0.4.0
description:
  - Runs on the controller only (an action plugin; nothing is sent to the host), before anything is
    priced, fetched or deployed; the endpoint role runs it first (roles/endpoint/tasks/preflight.yml).
  - Checks, and reports every problem it finds (not only the first), each naming the field, the
    file and line that set it and the fix - the variables of the removed per-endpoint roles and
    C(bench_endpoints); every C(endpoint_*) variable against the role's own argument spec (a name
    the role does not know is refused with the closest name, since Ansible would ignore it; a value
    of the wrong form with the accepted form, instead of Ansible's argument-spec dump); the shape,
    through the collection's shape parser; the vaulted C(endpoint_api_key) and
    C(endpoint_secret_environment) where the run reads them; the port, and no other endpoint of the
    inventory on the same machine with the same port (both files named); the bind policy (a LAN
    bind needs client networks and a key).
  - The secrets and the bind policy are checked where the run reads the secrets - not in a
    budget-only run (C(--tags budget)) and not in the fleet plan (C(endpoint_budget_controller_only)),
    which need no vault password.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.READ_ONLY
options:
  secrets:
    description:
      - Check the vaulted secrets and the bind policy; default - unless the run is budget-only or the
        fleet plan.
    type: bool
"""

EXAMPLES = r"""
- name: Check the endpoint's variables before anything else
  frank.llm_fleet.endpoint_preflight:
"""

RETURN = r"""
problems:
  description: Every problem found, each naming the field, the file and line that set it, and the fix.
  returned: always
  type: list
  elements: str
msg:
  description: The problems, one per line, each prefixed with the endpoint; or what the bind policy admits.
  returned: always
  type: str
"""
