# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: calibration_boots
short_description: Read the stored boot ledgers of endpoints from the controller's calibration store
version_added: 0.2.0
description:
  - Returns every boot recorded by P(frank.llm_fleet.boot_calibration#module) for the named endpoints
    (all endpoints when none is named), for O(frank.llm_fleet.vram_budget#module:boots).
  - A store that does not exist yet holds no boots; that is not an error.
author:
  - frank.llm_fleet maintainers (@frank-ops)
options:
  _terms:
    description: Endpoint names (the store's first directory level).
    type: list
    elements: str
    required: false
  dir:
    description: The calibration store directory on the controller.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Price an endpoint with its stored boots
  frank.llm_fleet.vram_budget:
    shape: "{{ endpoint_shape }}"
    devices: "{{ endpoint_devices }}"
    boots: "{{ lookup('frank.llm_fleet.calibration_boots', inventory_hostname, dir=inventory_dir ~ '/calibration') }}"
"""

RETURN = r"""
_raw:
  description: One list of stored boots (each with endpoint, host, geometry_key, recorded_at, shape, pool_bytes, ledger).
  type: list
  elements: list
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.calibration import load_boots


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        store = self.get_option("dir")
        boots = []
        try:
            for endpoint in terms or [None]:
                boots.extend(load_boots(store, endpoint))
        except (OSError, ValueError) as exc:
            raise AnsibleLookupError(f"calibration_boots: cannot read the store {store}: {exc}") from None
        return [boots]
