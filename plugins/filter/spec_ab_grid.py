# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The speculative-decoding A/B's configurations from a grid (qualify/spec_ab.py `grid_configs`)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.spec_ab import GridError, grid_configs


def spec_ab_grid(grid: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        return grid_configs(grid)
    except GridError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"spec_ab_grid": spec_ab_grid}
