# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet plan's table from the facts the plan left (playbooks/plan.yml, without the callback)."""

from __future__ import annotations

from typing import Any

from ansible_collections.frank.llm_fleet.plugins.plugin_utils.deploy_plan import plan_table_from_facts


def fleet_plan_table(hosts: list[str], hostvars: Any) -> str:
    return plan_table_from_facts(list(hosts), hostvars)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"fleet_plan_table": fleet_plan_table}
