#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: client_fragments
short_description: Write the clients' models.yml fragments on the controller, and remove a retired endpoint's
version_added: 0.4.0
description:
  - Runs on the controller only (an action plugin, no module process; nothing is sent to a host),
    once for the play - the same fragments C(llm-fleet generate) writes under C(client/).
  - Writes the fragment of each of O(endpoints) into O(dest) (made, mode 0755, when missing), each
    only when its bytes differ, atomically, mode 0644.
  - Removes a fragment this collection generated (its header says so) for an endpoint that is not in
    O(inventory) - a retired endpoint's fragment must not outlive it. Files it did not generate, and
    fragments of endpoints still in the inventory, are left alone.
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: full
    description: In check mode it reports what it would write and remove, and changes nothing.
  diff_mode:
    support: full
    description: A unified diff of each fragment it writes (or would).
  idempotent:
    support: full
    description: A second run with the same inventory reports no change.
options:
  dest:
    description: The fragments' directory on the controller (C(fleet_client_dir)).
    type: path
    required: true
  endpoints:
    description: The endpoints (inventory hosts of group C(llm_endpoints)) whose fragments this run writes.
    type: list
    elements: str
    required: true
  inventory:
    description: Every endpoint of the inventory; a generated fragment of any other is removed.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Write the clients' models.yml fragments
  frank.llm_fleet.client_fragments:
    dest: "{{ fleet_client_dir }}"
    endpoints: "{{ ansible_play_hosts }}"
    inventory: "{{ groups['llm_endpoints'] }}"
  run_once: true
"""

RETURN = r"""
dest:
  description: The fragments' directory.
  returned: success
  type: str
written:
  description: The fragments written (or that would be, in check mode).
  returned: success
  type: list
  elements: str
unchanged:
  description: The fragments whose bytes were already right.
  returned: success
  type: list
  elements: str
removed:
  description: The retired endpoints' fragments removed (or that would be).
  returned: success
  type: list
  elements: str
"""
