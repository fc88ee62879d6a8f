#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: qualify_spec_compare
short_description: Judge a speculative-decoding A/B - identical greedy text across configurations, no empty answer
version_added: 0.5.0
description:
  - Compares each prompt shape's text across the configurations of C(playbooks/spec_ab.yml) - a
    configuration whose text differs from the first one's, an empty answer, an error answer or a
    configuration that did not boot fails the task, naming each.
  - A text that first differs where the baseline's first and second choice were within O(tie_margin)
    nats, and that took exactly the runner-up, is a numeric tie (a drafter's batched verification
    rounds otherwise than one-token decode), shown as C(tie@N) and not a failure. It needs the
    answers' token log-probabilities, which M(frank.llm_fleet.qualify_spec_probe) asks for at
    temperature 0; without them any difference fails.
  - Writes the table (config, shape, tokens, decode tok/s, acceptance, copy ratio, free memory at
    boot and under load, identical) and the runs as JSON to O(results_dir), before judging.
  - Runs where the results live, normally the controller (C(delegate_to=localhost)).
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: full
    description: In check mode the verdict and table are returned and nothing is written.
  diff_mode:
    support: none
    description: No diff is returned.
  idempotent:
    support: partial
    description: The files are rewritten on every run.
options:
  runs:
    description: Per configuration - C(name), C(booted), C(why), and M(frank.llm_fleet.qualify_spec_probe)'s C(run) fields.
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
  tie_margin:
    description: Nats between the baseline's top two choices within which a divergence is a numeric tie.
    type: float
    default: 0.05
"""

EXAMPLES = r"""
- name: Judge the A/B
  frank.llm_fleet.qualify_spec_compare:
    runs: "{{ spec_runs }}"
    results_dir: "{{ qualify_results_dir }}"
    endpoint: frank-secondary
  delegate_to: localhost
"""

RETURN = r"""
table:
  description: The table as text.
  returned: always
  type: str
failures:
  description: What failed the identity check, one line each.
  returned: always
  type: list
  elements: str
paths:
  description: The files written - C(json), C(table).
  returned: success
  type: dict
"""

import json
import os

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import write_atomically
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.spec_ab import TIE_MARGIN, compare
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError


def core(call) -> dict:
    p = call.params
    if not 0 <= p["tie_margin"] <= 1:
        raise StepError(f"tie_margin: {p['tie_margin']} is not between 0 and 1 nats (qualify_spec_tie_margin; 0 compares strictly)")
    failures, table = compare(p["runs"], p["tie_margin"])
    where = {name: os.path.join(p["results_dir"], f"{p['endpoint']}.spec_ab.{ext}") for name, ext in (("json", "json"), ("table", "txt"))}
    if not call.check_mode:
        os.makedirs(p["results_dir"], exist_ok=True)
        write_atomically(where["json"], json.dumps({"runs": p["runs"], "failures": failures}, indent=2) + "\n", 0o644)
        write_atomically(where["table"], table + "\n", 0o644)
    result = {"changed": not call.check_mode, "table": table, "failures": failures, "paths": where}
    if failures:
        raise StepError(f"speculative A/B failed: {'; '.join(failures)}", result)
    return result


def main() -> None:
    run_module(
        {
            "runs": {"type": "list", "elements": "dict", "required": True},
            "results_dir": {"type": "path", "required": True},
            "endpoint": {"type": "str", "required": True},
            "tie_margin": {"type": "float", "default": TIE_MARGIN},
        },
        core,
        errors=(OSError,),
    )


if __name__ == "__main__":
    main()
