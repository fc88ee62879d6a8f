#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: qualify_probe
short_description: The survivability probe of a qualification rung, at the full client contract
version_added: 0.5.0
description:
  - Loads a serving endpoint the way its clients will (docs/qualify.md) - every slot at once with a
    prompt of (ceiling - max_tokens) tokens and the client's own max_tokens and sampling (the
    shape's client contract, what its models.yml fragment says), decoding to the window's limit;
    one prompt of ceiling + 1 tokens, which must be refused; an N-stream decode leg with the
    engine's own busy count sampled.
  - Free memory per device (nvidia-smi, amdgpu sysfs or rocm-smi; the host's MemAvailable without a
    GPU tool) is read at the start and sampled all through the legs.
  - Returns the findings M(frank.llm_fleet.qualify_ladder) judges; never fails on what it measures.
  - Runs on the endpoint's host, against its own port.
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: partial
    description: Check mode is accepted, but nothing is sent.
    details: In check mode the contract is returned and no request is made.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  idempotent:
    support: full
    description: Never reports a change; each run measures again.
options:
  shape:
    description: The rung's shape, parsed (the role's C(frank.llm_fleet.shape) filter), for the ceiling, the slots and the client contract.
    type: dict
    required: true
  host:
    description: The address the engine answers on.
    type: str
    default: 127.0.0.1
  api_key:
    description: The endpoint's API key, sent as a bearer token; never logged.
    type: str
    default: ''
  max_tokens:
    description: Bound the window leg's decode below the client's maxTokens (0 - the client's own).
    type: int
    default: 0
  decode_tokens:
    description: Tokens each stream of the N-stream decode leg decodes.
    type: int
    default: 128
  timeout:
    description: Seconds one request may take.
    type: int
    default: 3600
"""

EXAMPLES = r"""
- name: Probe the rung at the full contract
  frank.llm_fleet.qualify_probe:
    shape: "{{ endpoint_shape | frank.llm_fleet.shape('frank-secondary') }}"
  register: probe
"""

RETURN = r"""
findings:
  description:
    - C(contract) (ceiling, slots, max_tokens, prompt_tokens, sampling), C(answered) of C(slots),
      C(tokens), C(errors), C(past_window_refused) and C(past_window), C(decoding_together) of
      C(streams) and C(busy_source), C(decode_tps), C(free_at_boot) and C(free_under_probe) (bytes
      per device), C(window_wall_s).
  returned: success
  type: dict
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import Endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.probe import contract, free_reader, run_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError


def core(call) -> dict:
    p = call.params
    shape = parse_shape(p["shape"])
    terms = contract(shape, p["max_tokens"] or None)
    if call.check_mode:
        return {"changed": False, "findings": {"contract": terms.as_dict()}, "msg": "check mode: nothing sent"}
    endpoint = Endpoint(f"http://{p['host']}:{shape.port}", p["api_key"] or None)
    findings = run_probe(endpoint, shape.served_id, terms, free_reader(call.host.query), p["decode_tokens"], float(p["timeout"]))
    return {"changed": False, "findings": findings}


def main() -> None:
    run_module(
        {
            "shape": {"type": "dict", "required": True},
            "host": {"type": "str", "default": "127.0.0.1"},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "max_tokens": {"type": "int", "default": 0, "no_log": False},
            "decode_tokens": {"type": "int", "default": 128, "no_log": False},
            "timeout": {"type": "int", "default": 3600},
        },
        core,
        errors=(ShapeError, ValueError),
    )


if __name__ == "__main__":
    main()
