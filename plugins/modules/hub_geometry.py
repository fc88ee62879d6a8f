#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hub_geometry
short_description: Read a model's geometry from the Hugging Face Hub by range requests, before its download
version_added: 0.4.0
description:
  - Reads only what P(frank.llm_fleet.vram_budget#module) reads of a payload - the GGUF header of
    every split part, of the projector and of the drafter; or a Hugging Face model's
    C(config.json) and the JSON headers of its safetensors files - by HTTP range requests, and
    returns the shape keys that price the model as its downloaded files would
    (C(model_geometry), C(projector_bytes), C(drafter_geometry); C(weights) for a safetensors
    model), so a shape can be priced before a long download.
  - "A file the repo does not hold at that commit (a misspelt O(model_file), O(projector) or
    O(drafter), or a model directory without C(config.json)) fails naming the shape key and the
    closest name the repo's tree holds (one listing of the tree, after the Hub's 404), before any
    download, for example 'model_file: model.Q4_K_M.ggfu is not in the repo at this revision (HTTP
    404); did you mean model.Q4_K_M.gguf? (repo OWNER/NAME@REVISION)'."
  - A header is read from a small prefix that grows, by at least doubling, only while the header
    is longer. What a Hub may make it read is bounded per header and in total; a header claiming
    an absurd length is refused naming the file, the repo and the bound.
  - Uses the Hub client of P(frank.llm_fleet.hf_payload_gate#module) - the same endpoint and
    mirror rules (O(endpoint), else E(HF_ENDPOINT)), redirects to the CDN followed by hand, and the
    token sent to the Hub's origin only, never to a CDN, never in results or messages.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.READ_ONLY
options:
  repo_id:
    description: The model's repo on the Hub (C(owner/name)).
    type: str
    required: true
  revision:
    description:
      - A branch, tag or commit. It is resolved to its commit first, so every file is read at the
        same one (a 40-hex commit is used as given, with no API request).
    type: str
    default: main
  repo_type:
    description: The repo's type.
    type: str
    choices: [model, dataset, space]
    default: model
  model_file:
    description:
      - The shape's C(model_file) as a path in the repo - a GGUF (the first part of a split set;
        the other parts are found by its C(split.count)), or a Hugging Face model's directory (C(.)
        for the repo's root) or its C(config.json).
    type: str
    required: true
  projector:
    description: The shape's C(projector) GGUF, as a path in the repo (llama.cpp).
    type: str
  drafter:
    description: The shape's C(drafter) GGUF, as a path in the repo (llama.cpp).
    type: str
  weights_files:
    description:
      - The safetensors files to size, relative to the model's directory. Default - the files
        C(model.safetensors.index.json) maps, else C(model.safetensors).
    type: list
    elements: str
  shape:
    description:
      - The endpoint's shape; when given, RV(shape) returns it with RV(shape_keys) filled in where
        it states none (a geometry or size the inventory states stays the one priced).
    type: dict
  endpoint:
    description: The Hub or a mirror. Defaults to E(HF_ENDPOINT), else C(https://huggingface.co).
    type: str
  token:
    description: Access token for gated or private repos. Defaults to E(HF_TOKEN). Sent to the Hub only.
    type: str
  timeout:
    description: Seconds per network operation.
    type: float
    default: 60
  initial_prefix:
    description: The first bytes read of each GGUF (grown while its header is longer).
    type: int
    default: 262144
  max_total_bytes:
    description: The most this call reads, all files together; past it the call fails naming it.
    type: int
    default: 1073741824
notes:
  - Reads no tensor data. Runs wherever the Hub is reachable, normally the controller
    (C(delegate_to=localhost)) before the payload is fetched.
  - A shape with C(override_tensor) is priced per tensor only from a header on disk; with the
    Hub's C(model_geometry) its overridden tensors are not moved off the cards (an upper bound).
seealso:
  - module: frank.llm_fleet.vram_budget
  - module: frank.llm_fleet.hf_payload_gate
"""

EXAMPLES = r"""
- name: Read the model's geometry from the Hub (no download)
  frank.llm_fleet.hub_geometry:
    repo_id: unsloth/Qwen3-30B-A3B-GGUF
    revision: main
    model_file: Q4_K_M/Qwen3-30B-A3B-Q4_K_M-00001-of-00002.gguf
  delegate_to: localhost
  register: hub_geometry

- name: Price the shape with it before the payload is on disk
  frank.llm_fleet.vram_budget:
    shape: "{{ endpoint_shape | combine(hub_geometry.shape_keys) }}"
    devices: "{{ endpoint_devices }}"
  delegate_to: localhost

- name: Or fill in only what the shape does not state
  frank.llm_fleet.hub_geometry:
    repo_id: Qwen/Qwen3-8B
    model_file: .
    shape: "{{ endpoint_shape }}"
  delegate_to: localhost
  register: hub_priced

- name: Price it
  frank.llm_fleet.vram_budget:
    shape: "{{ hub_priced.shape }}"
    devices: "{{ endpoint_devices }}"
  delegate_to: localhost
"""

RETURN = r"""
shape_keys:
  description:
    - The shape keys that price the model as its files on disk would - C(model_geometry) always;
      C(projector_bytes) and C(drafter_geometry) when given those files; C(weights) (all
      tensors of the safetensors files, bytes) for a safetensors model. Combine them into the shape.
  returned: always
  type: dict
  sample: {model_geometry: {architecture: llama, n_layer: 2, n_head_kv: [2, 2], head_dim_k: 32}, projector_bytes: 6291456}
shape:
  description: O(shape) with RV(shape_keys) filled in where it states none, for P(frank.llm_fleet.vram_budget#module).
  returned: when O(shape) is given
  type: dict
commit:
  description: The commit every file was read at.
  returned: always
  type: str
model_format:
  description: C(gguf) or C(safetensors).
  returned: always
  type: str
files:
  description: Per file read - path, size on the Hub, bytes read and range requests.
  returned: always
  type: list
  elements: dict
bytes_read:
  description: Bytes read, all files together.
  returned: always
  type: int
bytes_total:
  description: The files' sizes together (what a download of them would move).
  returned: always
  type: int
requests:
  description: Range requests made (redirects followed inside them not counted).
  returned: always
  type: int
"""

import os

from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import ModuleCall, run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_pricing import HubPricingError, fill_shape, price_from_hub


def geometry(call: ModuleCall) -> dict:
    params = call.params
    client = HubClient(params["endpoint"], params["token"] or os.environ.get("HF_TOKEN") or None, params["timeout"])
    result = price_from_hub(
        client,
        params["repo_id"],
        params["model_file"],
        revision=params["revision"],
        projector=params["projector"],
        drafter=params["drafter"],
        weights_files=params["weights_files"],
        repo_type=params["repo_type"],
        initial_prefix=params["initial_prefix"],
        max_total_bytes=params["max_total_bytes"],
    )
    report = {"changed": False, **result.as_dict()}
    if params["shape"] is not None:
        report["shape"] = fill_shape(params["shape"], result.shape_keys)
    return report


def main() -> None:
    run_module(
        {
            "repo_id": {"type": "str", "required": True},
            "revision": {"type": "str", "default": "main"},
            "repo_type": {"type": "str", "choices": ["model", "dataset", "space"], "default": "model"},
            "model_file": {"type": "str", "required": True},
            "projector": {"type": "str"},
            "drafter": {"type": "str"},
            "weights_files": {"type": "list", "elements": "str"},
            "shape": {"type": "dict"},
            "endpoint": {"type": "str"},
            "token": {"type": "str", "no_log": True},
            "timeout": {"type": "float", "default": 60},
            "initial_prefix": {"type": "int", "default": 262144},
            "max_total_bytes": {"type": "int", "default": 1073741824},
        },
        geometry,
        errors=(HubPricingError,),
    )


if __name__ == "__main__":
    main()
