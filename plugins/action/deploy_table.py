# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""deploy_table: the deploy's closing table from what the run left on each endpoint, printed like
a debug message (plugins/plugin_utils/deploy_table.py builds it); for a run without the
deploy_plan callback. In this process: nothing is sent to a host."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from ansible_collections.frank.llm_fleet.plugins.plugin_utils.deploy_table import deploy_table_from_facts


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        endpoints = self._task.args.get("endpoints")
        if endpoints is None:
            endpoints = task_vars.get("ansible_play_hosts_all") or []
        if not isinstance(endpoints, list) or not all(isinstance(name, str) for name in endpoints):
            return {**result, "failed": True, "msg": f"endpoints: expected a list of endpoint names, got {type(endpoints).__name__}"}
        table = deploy_table_from_facts(endpoints, task_vars.get("hostvars") or {}, bool(self._task.check_mode))
        # Shown at the default verbosity, as a debug message is.
        return {**result, "changed": False, "msg": table.split("\n"), "_ansible_verbose_always": True}
