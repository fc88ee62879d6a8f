#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: qualify_report
short_description: Write a qualification ladder's result table and the recommended inventory snippet
version_added: 0.5.0
description:
  - Writes, in O(results_dir), C(ENDPOINT.qualify.json) (every rung, the answer, the restore's
    timing), C(ENDPOINT.qualify.txt) (the table - rung, value, verdict, free per device at boot and
    under the probe, tokens, concurrency, decode tok/s, why) and C(ENDPOINT.recommended.yml)
    (C(endpoint_shape) with the qualified value, the evidence in a comment).
  - On the controller (C(delegate_to=localhost)) its action plugin then draws C(ENDPOINT.qualify.png)
    from the JSON - one bar group per rung coloured by verdict - free MiB per device at boot and
    under the probe, tokens with concurrency, decode tok/s; a rung the probe never reached is
    marked C(not measured).
  - Runs where the results live, normally the controller (C(delegate_to=localhost)).
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: full
    description: In check mode the table and snippet are returned and nothing is written.
  diff_mode:
    support: none
    description: No diff is returned; C(paths) names the files.
  idempotent:
    support: partial
    description: The files are rewritten on every run (the ladder ran again).
options:
  results_dir:
    description: The directory of the result files.
    type: path
    required: true
  endpoint:
    description: The endpoint's name.
    type: str
    required: true
  settings:
    description: The ladder's search, as M(frank.llm_fleet.qualify_ladder) took it.
    type: dict
    required: true
  shape:
    description: The endpoint's shape as the inventory writes it (the snippet changes the ladder's key only).
    type: dict
    required: true
  rungs:
    description: The rungs, as M(frank.llm_fleet.qualify_ladder) returned them.
    type: list
    elements: dict
    required: true
  timing:
    description: The restore's figures (seconds to serve the last-good shape again).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Write the ladder's results
  frank.llm_fleet.qualify_report:
    results_dir: "{{ inventory_dir }}/qualify"
    endpoint: frank-secondary
    settings: "{{ qualify_ladder }}"
    shape: "{{ endpoint_shape }}"
    rungs: "{{ ladder.rungs }}"
  delegate_to: localhost
"""

RETURN = r"""
paths:
  description: The files - C(json), C(table), C(snippet) written, and C(picture), drawn on the controller only.
  returned: success
  type: dict
picture:
  description: The picture's path; where the task did not run on the controller, why none was drawn.
  returned: success, not in check mode
  type: str
table:
  description: The result table as text.
  returned: success
  type: str
snippet:
  description: The recommended C(endpoint_shape) as YAML text.
  returned: success
  type: str
answer:
  description: The largest passing value; null when none passed.
  returned: success
  type: int
rungs:
  description: How many rungs ran.
  returned: success
  type: int
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.ladder import LadderError
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.results import paths, render, write


def core(call) -> dict:
    p = call.params
    if call.check_mode:
        out = render(p["endpoint"], p["settings"], p["shape"], p["rungs"], p["timing"])
        out.pop("document")
        return {"changed": False, "paths": paths(p["results_dir"], p["endpoint"]), **out}
    return {"changed": True, **write(p["results_dir"], p["endpoint"], p["settings"], p["shape"], p["rungs"], p["timing"])}


def main() -> None:
    run_module(
        {
            "results_dir": {"type": "path", "required": True},
            "endpoint": {"type": "str", "required": True},
            "settings": {"type": "dict", "required": True},
            "shape": {"type": "dict", "required": True},
            "rungs": {"type": "list", "elements": "dict", "required": True},
            "timing": {"type": "dict", "default": {}},
        },
        core,
        errors=(LadderError, OSError),
    )


if __name__ == "__main__":
    main()
