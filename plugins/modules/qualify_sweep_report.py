#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: qualify_sweep_report
short_description: Write a batch/ubatch sweep's table and its cells as JSON
version_added: 0.5.0
description:
  - Writes C(ENDPOINT.sweep.txt) (cell, verdict, prefill and decode tok/s, free memory at boot and
    under load, why) and C(ENDPOINT.sweep.json) in O(results_dir) (docs/qualify.md).
  - Runs where the results live, normally the controller (C(delegate_to=localhost)).
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: full
    description: In check mode the table is returned and nothing is written.
  diff_mode:
    support: none
    description: No diff is returned.
  idempotent:
    support: partial
    description: The files are rewritten on every run.
options:
  cells:
    description: Per cell - C(cell) (its shape overrides), C(verdict), C(why) and M(frank.llm_fleet.qualify_sweep_cell)'s figures.
    type: list
    elements: dict
    required: true
  results_dir:
    description: The directory of the result files.
    type: path
    required: true
  endpoint:
    description: The endpoint's name (the files' prefix).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Write the sweep's table
  frank.llm_fleet.qualify_sweep_report:
    cells: "{{ sweep_cells_measured }}"
    results_dir: "{{ qualify_results_dir }}"
    endpoint: frank-secondary
  delegate_to: localhost
"""

RETURN = r"""
table:
  description: The table as text.
  returned: success
  type: str
paths:
  description: The files written - C(json), C(table).
  returned: success
  type: dict
"""

import json
import os

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import write_atomically
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.sweep import table


def core(call) -> dict:
    p = call.params
    text = table(p["cells"])
    where = {name: os.path.join(p["results_dir"], f"{p['endpoint']}.sweep.{ext}") for name, ext in (("json", "json"), ("table", "txt"))}
    if not call.check_mode:
        os.makedirs(p["results_dir"], exist_ok=True)
        write_atomically(where["json"], json.dumps({"cells": p["cells"]}, indent=2) + "\n", 0o644)
        write_atomically(where["table"], text + "\n", 0o644)
    return {"changed": not call.check_mode, "table": text, "paths": where}


def main() -> None:
    run_module(
        {
            "cells": {"type": "list", "elements": "dict", "required": True},
            "results_dir": {"type": "path", "required": True},
            "endpoint": {"type": "str", "required": True},
        },
        core,
        errors=(OSError,),
    )


if __name__ == "__main__":
    main()
