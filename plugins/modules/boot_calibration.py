#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: boot_calibration
short_description: Store an engine's boot ledger under its geometry key and compare it with the prediction
version_added: 0.2.0
description:
  - Adds one boot (the memory facts the engine printed while booting, as
    P(frank.llm_fleet.endpoint_deploy#module) returns them) to the calibration store under the
    endpoint and the shape's geometry key, where
    P(frank.llm_fleet.calibration_boots#lookup) finds it for the next
    P(frank.llm_fleet.vram_budget#module) run.
  - Returns predicted vs measured for the boot - llama.cpp by the exact KV law from the stored
    geometry, vLLM from the other boots of the geometry or the formula - so a deploy shows at
    once whether the budget's arithmetic held.
  - Idempotent - the same boot recorded twice is one point. Runs where the store lives, normally
    the controller (C(delegate_to=localhost)).
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.STORES_NO_DIFF
options:
  store_dir:
    description: The calibration store directory.
    type: path
    required: true
  endpoint:
    description: The endpoint's name (the store's first directory level).
    type: str
    required: true
  host:
    description: The host the boot happened on.
    type: str
    required: true
  shape:
    description: The shape that booted, as priced (stored with O(model_geometry) in place of the payload).
    type: dict
    required: true
  geometry_key:
    description: The key from P(frank.llm_fleet.vram_budget#module)'s result.
    type: str
    required: true
  model_geometry:
    description: The model's cache geometry from P(frank.llm_fleet.vram_budget#module)'s result, so the boot can be re-priced without the model.
    type: dict
  pool_bytes:
    description: The KV pool the boot was given (vLLM), from the budget's C(kv.pool_bytes).
    type: int
  ledger:
    description: The boot ledger (P(frank.llm_fleet.endpoint_deploy#module)'s C(boot_ledger)).
    type: dict
    required: true
  recorded_at:
    description: When the boot happened (ISO 8601); not part of the boot's identity.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Keep the boot ledger as calibration
  frank.llm_fleet.boot_calibration:
    store_dir: "{{ inventory_dir }}/calibration"
    endpoint: frank-primary
    host: "{{ inventory_hostname }}"
    shape: "{{ endpoint_shape }}"
    geometry_key: "{{ budget.geometry_key }}"
    model_geometry: "{{ budget.model_geometry }}"
    pool_bytes: "{{ budget.kv.pool_bytes | default(omit) }}"
    ledger: "{{ deploy.boot_ledger }}"
    recorded_at: "{{ now(utc=true, fmt='%Y-%m-%dT%H:%M:%SZ') }}"
  delegate_to: localhost
  when: deploy.boot_ledger is defined
"""

RETURN = r"""
path:
  description: The store file the boot is in.
  returned: always
  type: str
comparison:
  description: Predicted vs measured for this boot, with C(agree) true, false or null (not predictable) and the basis.
  returned: always
  type: dict
  sample:
    predicted: {cells: 4096, seqs: 2, k_mib: "4.00", v_mib: "4.00", kv_mib: "8.00"}
    measured: {cells: 4096, seqs: 2, k_mib: "4.00", v_mib: "4.00", kv_mib: "8.00"}
    agree: true
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.calibration import boot_record, load_boots, store_boot
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import ModuleCall, run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import compare_boot, parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError


def calibrate(call: ModuleCall) -> dict:
    p = call.params
    try:
        shape = parse_shape(p["shape"], p["endpoint"])
    except ShapeError as exc:
        raise StepError(f"shape is invalid: {exc}", {}) from None
    record = boot_record(p["endpoint"], p["host"], shape, p["geometry_key"], p["model_geometry"], p["ledger"], p["pool_bytes"], p["recorded_at"])
    try:
        path, changed = store_boot(p["store_dir"], record, call.check_mode, call.host)
        boots = load_boots(p["store_dir"], p["endpoint"])
    except (OSError, ValueError) as exc:
        raise StepError(f"store_dir: cannot write the calibration store {p['store_dir']}: {exc}", {}) from None
    return {"changed": changed, "path": path, "comparison": compare_boot(record, boots)}


def main() -> None:
    run_module(
        {
            "store_dir": {"type": "path", "required": True},
            "endpoint": {"type": "str", "required": True},
            "host": {"type": "str", "required": True},
            "shape": {"type": "dict", "required": True},
            "geometry_key": {"type": "str", "required": True, "no_log": False},
            "model_geometry": {"type": "dict"},
            "pool_bytes": {"type": "int"},
            "ledger": {"type": "dict", "required": True},
            "recorded_at": {"type": "str", "required": True},
        },
        calibrate,
    )


if __name__ == "__main__":
    main()
