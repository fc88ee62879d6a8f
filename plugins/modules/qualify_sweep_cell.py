#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: qualify_sweep_cell
short_description: Measure one cell of a batch/ubatch sweep - prefill and decode of the shape serving now
version_added: 0.5.0
description:
  - Through the completions route both engines serve, token ids as the prompt (docs/qualify.md) -
    prefill from a one-token answer to a prompt of O(prompt_tokens), decode from a second answer
    of O(decode_tokens), O(reps) times, the median kept; free memory per device sampled throughout.
  - An engine error is returned as the cell's verdict C(failed) with its words, never raised, so
    the sweep goes on to the next cell.
  - Runs on the endpoint's host, against its own port.
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: partial
    description: Check mode is accepted, but nothing is sent.
    details: In check mode no request is made.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  idempotent:
    support: full
    description: Never reports a change.
options:
  shape:
    description: The cell's shape, parsed (the C(frank.llm_fleet.shape) filter), for the port and the served id.
    type: dict
    required: true
  prompt_tokens:
    description: Tokens in the prefill prompt.
    type: int
    default: 2048
  decode_tokens:
    description: Tokens in the decode answer.
    type: int
    default: 64
  reps:
    description: Repetitions; the median is kept.
    type: int
    default: 3
  host:
    description: The address the engine answers on.
    type: str
    default: 127.0.0.1
  api_key:
    description: The endpoint's API key; never logged.
    type: str
    default: ''
"""

EXAMPLES = r"""
- name: Measure the cell serving now
  frank.llm_fleet.qualify_sweep_cell:
    shape: "{{ endpoint_shape | frank.llm_fleet.shape('frank-secondary') }}"
  register: cell
"""

RETURN = r"""
measured:
  description: C(verdict) (C(measured) or C(failed)), C(why), C(prefill_tps), C(decode_tps), C(free_at_boot), C(free_under_load).
  returned: success
  type: dict
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import Endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.probe import free_reader
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.sweep import measure_cell
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError


def core(call) -> dict:
    p = call.params
    shape = parse_shape(p["shape"])
    if call.check_mode:
        return {"changed": False, "measured": {}, "msg": "check mode: nothing sent"}
    endpoint = Endpoint(f"http://{p['host']}:{shape.port}", p["api_key"] or None)
    return {
        "changed": False,
        "measured": measure_cell(endpoint, shape.served_id, p["prompt_tokens"], p["decode_tokens"], p["reps"], free_reader(call.host.query)),
    }


def main() -> None:
    run_module(
        {
            "shape": {"type": "dict", "required": True},
            "prompt_tokens": {"type": "int", "default": 2048, "no_log": False},
            "decode_tokens": {"type": "int", "default": 64, "no_log": False},
            "reps": {"type": "int", "default": 3},
            "host": {"type": "str", "default": "127.0.0.1"},
            "api_key": {"type": "str", "default": "", "no_log": True},
        },
        core,
        errors=(ShapeError,),
    )


if __name__ == "__main__":
    main()
