#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: qualify_quality_compare
short_description: Refuse a KV-dtype or weight-quant swap whose answers diverge from the baseline's
version_added: 0.5.0
description:
  - Judges the quality gate's two runs (C(playbooks/quality_gate.yml), docs/qualify.md) - the
    baseline's and the candidate's answers to the same battery. Refuses (fails the task, naming
    why) when the candidate loses the needle the baseline found, when its mean divergence on the
    short prompts exceeds O(max_divergence), when an answer is an error, or when either did not boot.
  - Writes C(ENDPOINT.quality.txt) and C(.json) to O(results_dir) before judging.
  - Runs where the results live, normally the controller (C(delegate_to=localhost)).
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: full
    description: In check mode the verdict is returned and nothing is written.
  diff_mode:
    support: none
    description: No diff is returned.
  idempotent:
    support: partial
    description: The files are rewritten on every run.
options:
  runs:
    description: The baseline's run, then the candidate's, as the gate's tasks keep them (C(name), C(booted), C(why), C(answers)).
    type: list
    elements: dict
    required: true
  salt:
    description: The run's salt (the needle's code carries it).
    type: str
    required: true
  max_divergence:
    description: The mean divergence (0 identical, 1 nothing in common) past which the swap is refused.
    type: float
    default: 0.25
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
- name: Judge the swap
  frank.llm_fleet.qualify_quality_compare:
    runs: "{{ quality_runs }}"
    salt: "{{ salt }}"
    results_dir: "{{ qualify_results_dir }}"
    endpoint: frank-secondary
  delegate_to: localhost
"""

RETURN = r"""
table:
  description: The battery's table as text.
  returned: always
  type: str
refusals:
  description: Why the swap is refused, one line each; empty when it passes.
  returned: always
  type: list
  elements: str
figures:
  description: C(mean_divergence), C(threshold), C(needle) (the code).
  returned: always
  type: dict
paths:
  description: The files written - C(json), C(table).
  returned: always
  type: dict
"""

import json
import os

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import write_atomically
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.quality import judge
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError


def core(call) -> dict:
    p = call.params
    if len(p["runs"]) != 2:
        raise StepError(f"runs: expected the baseline's and the candidate's, got {len(p['runs'])}", {})
    refusals, figures, table = judge(p["runs"][0], p["runs"][1], p["salt"], p["max_divergence"])
    where = {name: os.path.join(p["results_dir"], f"{p['endpoint']}.quality.{ext}") for name, ext in (("json", "json"), ("table", "txt"))}
    if not call.check_mode:
        os.makedirs(p["results_dir"], exist_ok=True)
        write_atomically(where["json"], json.dumps({"runs": p["runs"], "figures": figures, "refusals": refusals}, indent=2) + "\n", 0o644)
        write_atomically(where["table"], table + "\n", 0o644)
    result = {"changed": not call.check_mode, "table": table, "refusals": refusals, "figures": figures, "paths": where}
    if refusals:
        raise StepError(f"the swap is refused: {'; '.join(refusals)}", result)
    return result


def main() -> None:
    run_module(
        {
            "runs": {"type": "list", "elements": "dict", "required": True},
            "salt": {"type": "str", "required": True},
            "max_divergence": {"type": "float", "default": 0.25},
            "results_dir": {"type": "path", "required": True},
            "endpoint": {"type": "str", "required": True},
        },
        core,
        errors=(OSError,),
    )


if __name__ == "__main__":
    main()
