#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: qualify_spec_probe
short_description: Ask the speculative-decoding A/B's prompt shapes of the configuration serving now
version_added: 0.5.0
description:
  - Sends the prose, echo and structured prompts of C(playbooks/spec_ab.yml) (docs/qualify.md), each
    with the run's salt, to the endpoint serving now, with the given sampling (temperature 0 for
    the greedy identity check); echo and structured with thinking switched off.
  - Returns each answer's text, completion tokens, decode tok/s, the engine's draft counts where it
    reports them, the echo's copy ratio, and free memory per device at the start and under load.
  - At temperature 0 each answer also carries its tokens' top two log-probabilities as C(tokens)
    (per token the chosen and the runner-up bytes as hex and the margin in nats), asked as the
    OpenAI C(logprobs) fields, so the compare can tell a numeric tie from a drafter's error.
  - Runs on the endpoint's host, against its own port. Never fails on what it measures;
    M(frank.llm_fleet.qualify_spec_compare) judges.
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: partial
    description: Check mode is accepted, but nothing is sent.
    details: In check mode no request is made and no answer is returned.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  idempotent:
    support: full
    description: Never reports a change.
options:
  shape:
    description: The configuration's shape, parsed (the C(frank.llm_fleet.shape) filter), for the port, the served id and the reasoning switch.
    type: dict
    required: true
  salt:
    description: The run's salt, in every prompt.
    type: str
    required: true
  max_tokens:
    description: Tokens each answer may take.
    type: int
    default: 96
  sampling:
    description: The request's sampling fields (the identity check needs temperature 0).
    type: dict
    default: {temperature: 0}
  extra_body:
    description: More request fields (the lab's random-weight models need C(ignore_eos)).
    type: dict
    default: {}
  battery:
    description:
      - Ask the quality gate's battery instead of the A/B's shapes (M(frank.llm_fleet.qualify_quality_compare)) -
        its short prompts, and a needle at O(needle_depth) of a filler filling O(needle_fill) of the
        request window (sized by the engine's own token count).
    type: bool
    default: false
  needle_fill:
    description: The share of the request window the needle's filler fills.
    type: float
    default: 0.75
  needle_depth:
    description: Where the needle sits in the filler (0 - the start, 1 - the end).
    type: float
    default: 0.5
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
- name: Ask the shapes of the configuration serving now
  frank.llm_fleet.qualify_spec_probe:
    shape: "{{ endpoint_shape | frank.llm_fleet.shape('frank-secondary') }}"
    salt: run-1
  register: answers
"""

RETURN = r"""
run:
  description:
    - C(answers), per shape - C(shape), C(text), C(completion_tokens), C(decode_tps), C(draft_n),
      C(draft_accepted), C(copy_ratio), C(tokens), C(error); C(free_at_boot) and C(free_under_load).
  returned: success
  type: dict
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.client_contract import reasoning_map
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import ProbeError, tokens_per_char
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError, Endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.probe import free_reader
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.quality import BATTERY, NEEDLE, needle_prompt
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.spec_ab import ask_shapes
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError


def core(call) -> dict:
    p = call.params
    shape = parse_shape(p["shape"])
    if call.check_mode:
        return {"changed": False, "run": {}, "msg": "check mode: nothing sent"}
    endpoint = Endpoint(f"http://{p['host']}:{shape.port}", p["api_key"] or None)
    no_thinking = reasoning_map(shape).get("none", {})
    prompts = None
    if p["battery"]:
        filler_chars = int(shape.request_ceiling * p["needle_fill"] / tokens_per_char(endpoint, shape.served_id))
        prompts = {**BATTERY, NEEDLE: needle_prompt(p["salt"], filler_chars, p["needle_depth"])}
    run = ask_shapes(endpoint, shape.served_id, p["salt"], p["max_tokens"], p["sampling"], p["extra_body"], no_thinking, free_reader(call.host.query), prompts)
    return {"changed": False, "run": run}


def main() -> None:
    run_module(
        {
            "shape": {"type": "dict", "required": True},
            "salt": {"type": "str", "required": True},
            "max_tokens": {"type": "int", "default": 96, "no_log": False},
            "sampling": {"type": "dict", "default": {"temperature": 0}},
            "extra_body": {"type": "dict", "default": {}},
            "battery": {"type": "bool", "default": False},
            "needle_fill": {"type": "float", "default": 0.75},
            "needle_depth": {"type": "float", "default": 0.5},
            "host": {"type": "str", "default": "127.0.0.1"},
            "api_key": {"type": "str", "default": "", "no_log": True},
        },
        core,
        errors=(ShapeError, ValueError, ApiError, ProbeError),
    )


if __name__ == "__main__":
    main()
