#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: endpoint_bench
short_description: Measure an OpenAI-compatible endpoint - conversation bench and capacity probe
version_added: 0.2.0
description:
  - Runs the conversation bench (a fixed set of real prompts, salted per run, streamed so time to
    first token is split from decode tokens per second, token counts from each job's own streamed
    usage, optionally a concurrent burst) and the capacity probe (the refusal boundary the engine
    names for an oversized prompt, whether N requests decode together, decode speed at context
    depths) where the endpoint is reachable, normally on its own host against loopback.
  - An empty answer or a stream without usage is a warning in C(bench.warnings); the module fails
    on it unless O(allow_warnings=true), so a silent pass is impossible.
  - Measures only; nothing on the host changes. In check mode nothing is sent.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.MEASURES
options:
  url:
    description: The endpoint's base URL, C(http://HOST:PORT).
    type: str
    required: true
  model:
    description: The served model id.
    type: str
    required: true
  api_key:
    description: Bearer key the endpoint wants, if any.
    type: str
  name:
    description: The arm's name in the results (usually the endpoint's name).
    type: str
    default: endpoint
  max_tokens:
    description: Completion tokens per bench job.
    type: int
    default: 128
  burst:
    description: Also send every prompt this many times at once (0 or 1 - no burst).
    type: int
    default: 0
  thinking:
    description:
      - Arms by thinking mode, sent as C(chat_template_kwargs.enable_thinking). C(default) leaves
        the template's default; C(on) and C(off) together make an A/B of the two.
    type: list
    elements: str
    choices: [default, "on", "off"]
    default: [default]
  extra_body:
    description:
      - Further request fields for every bench job, such as C(ignore_eos) for a model with random
        weights (whose first token may be end-of-sequence).
    type: dict
    default: {}
  probe:
    description: Run the capacity probe too.
    type: bool
    default: true
  parallel:
    description: Streams the probe sends at once to check parallel serving (0 - skip).
    type: int
    default: 0
  depths:
    description: Context depths (tokens) the probe measures decode speed at.
    type: list
    elements: int
    default: []
  timeout:
    description: Seconds one request may take.
    type: float
    default: 600
  allow_warnings:
    description: Return empty answers and missing usage as warnings instead of failing.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Bench frank-primary on its host
  frank.llm_fleet.endpoint_bench:
    url: http://127.0.0.1:7770
    model: frank-primary
    name: frank-primary
    burst: 4
    thinking: ["on", "off"]
    parallel: 3
    depths: [1024, 32768, 131072]
  register: measured
"""

RETURN = r"""
bench:
  description: The bench report - arms, per-job TTFT, decode tok/s and token counts, per-arm medians, bursts, warnings.
  returned: unless check mode
  type: dict
probe:
  description: The capacity probe report - boundary (window the engine names), parallel, depths.
  returned: when O(probe=true), unless check mode
  type: dict
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.bench import Arm, run_bench
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import ProbeError, run_capacity_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError, Endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import ModuleCall, run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

THINKING = {"default": None, "on": True, "off": False}


def bench(call: ModuleCall) -> dict:
    p = call.params
    if call.check_mode:
        return {"changed": False, "msg": "check mode: nothing sent"}
    endpoint = Endpoint(p["url"], p["api_key"])
    arms = [
        Arm(p["name"] if mode == "default" else f"{p['name']}/thinking-{mode}", endpoint, p["model"], THINKING[mode], p["extra_body"]) for mode in p["thinking"]
    ]
    result = {}
    try:
        result["bench"] = run_bench(arms, max_tokens=p["max_tokens"], burst=p["burst"], timeout=p["timeout"]).as_dict()
        if p["probe"]:
            result["probe"] = run_capacity_probe(endpoint, p["model"], p["parallel"], p["depths"], timeout=p["timeout"])
    except (ApiError, ProbeError, ValueError) as exc:
        raise StepError(f"measuring {p['url']} failed: {exc}", result) from None
    warnings = result["bench"]["warnings"]
    if warnings and not p["allow_warnings"]:
        raise StepError(f"{len(warnings)} bench job(s) came back wrong: " + "; ".join(warnings[:3]), result)
    return {"changed": False, **result, "warnings": warnings}


def main() -> None:
    run_module(
        {
            "url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "name": {"type": "str", "default": "endpoint"},
            "max_tokens": {"type": "int", "default": 128, "no_log": False},
            "burst": {"type": "int", "default": 0},
            "thinking": {"type": "list", "elements": "str", "choices": list(THINKING), "default": ["default"]},
            "extra_body": {"type": "dict", "default": {}},
            "probe": {"type": "bool", "default": True},
            "parallel": {"type": "int", "default": 0},
            "depths": {"type": "list", "elements": "int", "default": []},
            "timeout": {"type": "float", "default": 600},
            "allow_warnings": {"type": "bool", "default": False},
        },
        bench,
    )


if __name__ == "__main__":
    main()
