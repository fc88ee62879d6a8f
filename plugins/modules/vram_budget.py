#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vram_budget
short_description: Price an endpoint shape on every GPU before deploy, and refuse what cannot fit
version_added: 0.1.0
description:
  - Builds the per-device ledger of a shape (weights, KV, compute buffers or graphs, projector,
    drafter and its own KV, runtime overhead, non-torch memory, expert arena, declared extras)
    from the model's GGUF header or an explicit geometry, and judges it against the laws of the
    runtime - capacity, per-device free floor, maximum gap between devices, the vLLM pool law
    (C(ctx <= pool <= slots x ctx)), the measured slot ceiling, the llama.cpp prompt-cache law and
    the client window. The shape is parsed by the collection's one shape parser first, so an
    unknown key, a key of the other runtime, a missing required key or a value out of range
    (for example C(gpu_memory_utilization) of 1.0) fails naming the field.
  - vLLM KV tokens come from calibration (measured boots); a formula estimate is used only as a
    fallback, and the result says which basis it used and when it extrapolated.
  - Fails, naming the device, the term and the overage in MiB, unless O(report_only=true).
  - Reads only file headers, under O(payload_dir); without it the shape's C(model_geometry),
    C(drafter_geometry) and C(projector_bytes) stand in (a controller-side check).
  - With O(manifest), first checks the payload identity - every file the shape names (the model
    and each part of a split GGUF, the projector, the drafter, a tokenizer directory and its files;
    which keys name files is the runtime driver's knowledge) must be a path of the endpoint's pinned
    manifest - and fails naming the key, the path and the closest manifest name
    ("did you mean ...") before anything is priced. O(report_only) does not waive it.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.READ_ONLY
options:
  shape:
    description:
      - The shape, as an inventory holds it (C(endpoint_shape)). Every key is listed in
        C(docs/shape.md).
      - Common keys are C(runtime) (C(llamacpp) or C(vllm)), C(model_file) (relative to
        O(payload_dir); the first part of a split GGUF), C(ctx_size), C(parallel), C(type_k),
        C(type_v), C(tensor_split), C(n_gpu_layers), C(max_model_len), C(max_num_seqs),
        C(kv_cache_dtype), C(kv_cache_memory_bytes), C(gpu_memory_utilization), C(calibration),
        C(free_floor) and C(max_device_gap).
      - Sizes accept bytes or strings such as C(31.86 GiB), C(12,544 MiB) or C(7.2e9).
    type: dict
    required: true
  devices:
    description:
      - Devices to price on, C(name) and C(memory) each; one entry per GPU rank, or the host for a
        CPU-only engine. An optional C(arch) (C(sm_86), C(gfx1201), C(gfx1151)) lets the KV dtype
        rules refuse a cache type the device cannot run.
      - An optional C(kind), C(gpu) (the default) or C(cpu) (the host's CPU, e.g. vLLM's CPU build,
        whose KV blocks hold 128 tokens where a GPU's hold 16).
    type: list
    elements: dict
    required: true
  payload_dir:
    description:
      - Where the payload is readable on the machine the module runs on; C(model_file),
        C(projector) and C(drafter) are read under it (headers only).
      - Omit it to price from the shape's explicit geometries and sizes.
    type: path
  manifest:
    description:
      - The endpoint's pinned payload manifest (C(endpoint_payload_manifest)), as a mapping
        (C(repo_id), C(revision), C(files)) or the path of a YAML or JSON manifest file readable
        where the module runs. Paths in it are relative to the payload directory, as the shape's are.
      - Omit it to skip the payload identity check (the result's RV(payload_identity) says so).
    type: raw
  report_only:
    description: Return the verdicts without failing when the shape does not fit.
    type: bool
    default: false
  boots:
    description:
      - Stored boot ledgers from the calibration store (the P(frank.llm_fleet.calibration_boots#lookup)
        lookup reads them on the controller). Boots of this shape's geometry key become the KV
        figure's basis - vLLM tokens from measured pool/token points, llama.cpp the law checked
        against a boot at the same layout - and the result says when it must extrapolate.
    type: list
    elements: dict
    default: []
notes:
  - Pure computation on header bytes; no tensor data is read.
  - The arithmetic, each law with the measurement it is checked against, and the payload identity
    rules are in C(docs/vram_budget.md) of the collection.
seealso:
  - module: frank.llm_fleet.hub_geometry
    description: The model's geometry from the Hub by range requests, to price a shape before its download.
  - module: frank.llm_fleet.hf_payload_gate
    description: Fetches and verifies the payload against the same pinned manifest.
  - module: frank.llm_fleet.boot_calibration
    description: Stores each boot's measured figures, which this module reads back (its boots option).
"""

EXAMPLES = r"""
- name: Refuse a llama.cpp shape that cannot fit the 3090
  frank.llm_fleet.vram_budget:
    devices:
      - name: rtx3090
        memory: 24,576 MiB
    payload_dir: /srv/models/frank-secondary
    shape:
      runtime: llamacpp
      model_file: model.gguf
      ctx_size: 401408
      parallel: 2
      type_k: f16
      type_v: f16
      ubatch: 1024
      free_floor: 1.5 GiB

- name: Price the primary's vLLM shape per rank, from calibration, and only report
  frank.llm_fleet.vram_budget:
    report_only: true
    devices:
      - {name: r9700-0, memory: 31.86 GiB}
      - {name: r9700-1, memory: 31.86 GiB}
    shape:
      runtime: vllm
      tensor_parallel: 2
      max_model_len: 200704
      max_num_seqs: 3
      kv_cache_dtype: fp8
      kv_cache_memory_bytes: 3.15e9
      gpu_memory_utilization: 0.98
      calibration:
        - {kv_dtype: fp8, max_model_len: 262144, pool_bytes: 8311013376, tokens: 1079582}
  register: budget

- name: Show the ledger
  ansible.builtin.debug:
    msg: "{{ budget.table }}"
"""

RETURN = r"""
fits:
  description: Whether every rule passed.
  returned: always
  type: bool
  sample: false
ledger:
  description: Per device, every term named and sized, with used, free and capacity in bytes.
  returned: always
  type: list
  elements: dict
  sample:
    - device: r9700-0
      capacity_bytes: 34209101578
      used_bytes: 34069459681
      free_bytes: 139641897
      terms:
        - {name: weights, bytes: 6743098982, mib: 6430.72}
kv:
  description:
    - KV figures. llama.cpp - cells per stream, streams, K and V bytes, per-slot window.
      vLLM - tokens, concurrency, bytes per token and the basis (measured, extrapolated or formula).
  returned: always
  type: dict
  sample: {tokens: 1350182, concurrency: 5.15, basis: measured}
client:
  description: The client contract derived from the engine ceiling (context_window, max_tokens, compaction_at).
  returned: always
  type: dict
  sample: {ceiling: 200704, context_window: 155648, max_tokens: 45056, compaction_at: 132300}
rules:
  description: Every rule's verdict; failures name the device, the term and the overage in MiB.
  returned: always
  type: list
  elements: dict
  sample:
    - {rule: free_floor, ok: false, device: r9700-0, term: expert_arena, overage_mib: 378.9}
notes:
  description: Caveats, such as an extrapolated calibration.
  returned: always
  type: list
  elements: str
geometry_key:
  description: The key boots of this shape's geometry are stored under (runtime, cache geometry, KV dtypes, tensor parallel).
  returned: always
  type: str
  sample: llamacpp-3f2a9c41d0be
model_geometry:
  description: The model's cache geometry in the explicit O(shape) C(model_geometry) form, when the model was read.
  returned: when the model's geometry is known
  type: dict
payload_identity:
  description:
    - The payload identity check - C(checked) (false without O(manifest)), C(ok), C(manifest)
      (repo@revision), C(names) checked (C(field), C(path), C(kind)) and C(mismatches) (C(field),
      C(path), C(problem), C(closest), C(message)), and a one-line C(summary).
  returned: always
  type: dict
  sample:
    checked: true
    ok: false
    manifest: unsloth/Qwen3-8B-GGUF@0123456789ab
    mismatches:
      - field: model_file
        path: Qwen3-8B-Q4_K_M.ggfu
        problem: is not in the manifest
        closest: Qwen3-8B-Q4_K_M.gguf
table:
  description: The ledger as a text table, for display.
  returned: always
  type: str
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.budget_gate import BUDGET_OPTIONS, budget
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module


def main() -> None:
    # On the controller the action plugin of the same name runs the same core in its own process.
    run_module(BUDGET_OPTIONS, lambda call: budget(call.params))


if __name__ == "__main__":
    main()
