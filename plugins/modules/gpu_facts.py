#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Report the host's GPU devices (memory, driver reserve, architecture, PCIe link) as facts
version_added: 0.1.0
description:
  - Reads the host's GPUs from C(nvidia-smi), C(rocm-smi) or the amdgpu driver's sysfs files and
    returns one entry per device in bytes, so M(frank.llm_fleet.vram_budget) can price a shape on what
    the host reports instead of hand-typed devices.
  - On NVIDIA the driver's own reserve is its own field (C(memory.reserved), or total - used - free
    on drivers without it); a driver that lacks an optional query field is asked again without it.
  - On an integrated AMD GPU (Strix Halo gfx1151) the device is priced on the pool the engine
    allocates from, the larger of its VRAM carve-out and its GTT pool, never their sum.
  - A missing tool, a tool exiting non-zero or output that is not the tool's format fails, naming
    the tool, its exit status and the first line of its output.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.READ_ONLY
options:
  source:
    description:
      - Where the facts come from. V(auto) reads NVIDIA GPUs through C(nvidia-smi) when it is on
        PATH, and AMD GPUs through sysfs when amdgpu cards exist, else through C(rocm-smi).
    type: str
    choices: [auto, nvidia-smi, rocm-smi, sysfs]
    default: auto
  sysfs_root:
    description: The sysfs mount to read for V(sysfs) and V(auto).
    type: path
    default: /sys
notes:
  - What is read, the laws and the limits - docs/gpu_facts.md in the collection.
  - Only reads; check mode runs it in full.
  - The device names follow llama.cpp's (C(CUDA0), C(ROCm0)) in the tool's order; see docs/gpu_facts.md
    for when an engine's order differs.
seealso:
  - module: frank.llm_fleet.vram_budget
"""

EXAMPLES = r"""
- name: Read the GPUs of the endpoint host
  frank.llm_fleet.gpu_facts:
  register: gpus

- name: Price the shape on what the host reports
  frank.llm_fleet.vram_budget:
    shape: "{{ endpoint_shape }}"
    devices: "{{ gpus.budget_devices }}"
  delegate_to: localhost
"""

RETURN = r"""
gpu_devices:
  description:
    - One entry per device. Sizes are bytes; a figure the tool does not report is null.
    - Keys are index, name, vendor, backend, total_bytes, used_bytes, free_bytes,
      driver_reserved_bytes, architecture, compute_capability, integrated, memory_pool,
      usable_bytes, usable_free_bytes, gtt_total_bytes, gtt_free_bytes, pcie_gen_current,
      pcie_gen_max, pcie_width_current, pcie_width_max, uuid, pci_bus and source.
  returned: success
  type: list
  elements: dict
  sample:
    - index: 0
      name: NVIDIA GeForce RTX 3090
      vendor: nvidia
      backend: CUDA0
      total_bytes: 25769803776
      used_bytes: 22477275136
      free_bytes: 2819620864
      driver_reserved_bytes: 472907776
      architecture: sm_86
      memory_pool: vram
      usable_bytes: 25769803776
budget_devices:
  description: The devices as M(frank.llm_fleet.vram_budget) takes them, C(name), C(memory) and C(arch); absent when a device reports no memory size.
  returned: when every device reports its memory size
  type: list
  elements: dict
ansible_facts:
  description: The same list as C(gpu_devices), as the fact C(gpu_devices).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.frank.llm_fleet.plugins.module_utils.devices.gpu_facts import SOURCES, GpuFactsError, budget_devices, discover


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "source": {"type": "str", "choices": list(SOURCES), "default": "auto"},
            "sysfs_root": {"type": "path", "default": "/sys"},
        },
        supports_check_mode=True,
    )

    def run(argv: list[str]) -> tuple[int, str, str]:
        return module.run_command(argv, handle_exceptions=False)

    try:
        devices = discover(run, module.params["source"], module.params["sysfs_root"], which=module.get_bin_path)
    except GpuFactsError as exc:
        module.fail_json(msg=str(exc))
    facts = [device.as_dict() for device in devices]
    result: dict = {"changed": False, "gpu_devices": facts, "ansible_facts": {"gpu_devices": facts}}
    try:
        result["budget_devices"] = budget_devices(devices)
    except GpuFactsError as exc:
        module.warn(str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
