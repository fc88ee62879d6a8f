#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: qualify_ladder
short_description: One step of a qualification ladder - judge the rung just run, name the next value
version_added: 0.5.0
description:
  - Drives the search of C(playbooks/qualify.yml) (docs/qualify.md) - C(step), the fleet's
    subtract-a-step then one bonus rung, or C(bisect) - over one shape key.
  - Given O(measured), the rung just run is judged (C(refused) by the budget gate, C(boot_failed),
    C(probe_failed) by the full-contract probe, or C(passed)) and appended to O(rungs).
  - Returns the rungs, the next value to try (C(null) when the search is done) and the answer (the
    largest passing value). Pure computation; runs on the controller.
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: full
    description: Computes only, so check mode runs it in full.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  idempotent:
    support: full
    description: The same arguments give the same answer.
options:
  settings:
    description:
      - The search - C(key) (C(context), C(slots), C(ubatch) or a shape key), C(ceiling), C(floor),
        C(method) (C(step) or C(bisect)), C(step), C(bonus), C(resolution), C(align), C(max_rungs),
        C(ceiling_reason) (what bounds the ceiling, for the snippet's comment). An unknown field or
        a floor above the ceiling fails naming the field.
    type: dict
    required: true
  rungs:
    description: The rungs judged so far, as this module returned them.
    type: list
    elements: dict
    default: []
  measured:
    description:
      - The rung just run - C(value), C(fits) (the budget gate's answer), C(booted), C(why) (the
        gate's or the boot's own words) and C(probe) (M(frank.llm_fleet.qualify_probe)'s findings).
    type: dict
"""

EXAMPLES = r"""
- name: The first rung of a context ladder
  frank.llm_fleet.qualify_ladder:
    settings: {key: context, ceiling: 262144, floor: 131072, step: 16384, bonus: 4096}
  register: ladder
"""

RETURN = r"""
key:
  description: The shape key the ladder climbs (aliases resolved, C(context) -> C(ctx_size)).
  returned: success
  type: str
rungs:
  description: Every rung - C(rung), C(value), C(verdict), C(why), C(free_at_boot), C(free_under_probe), C(tokens), C(concurrency), C(decode_tps).
  returned: success
  type: list
  elements: dict
next:
  description: The value the next rung tries; null when the search is done.
  returned: success
  type: int
answer:
  description: The largest value that passed; null when none did.
  returned: success
  type: int
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.ladder import LadderError
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.results import step


def main() -> None:
    run_module(
        {"settings": {"type": "dict", "required": True}, "rungs": {"type": "list", "elements": "dict", "default": []}, "measured": {"type": "dict"}},
        lambda call: {"changed": False, **step(call.params["settings"], call.params["rungs"], call.params["measured"])},
        errors=(LadderError,),
    )


if __name__ == "__main__":
    main()
