# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench_render: the table and the plot of a stored bench result, drawn on the controller (where
matplotlib is) by the collection's own code, whether it runs from a checkout, an installed
collection or an execution environment (the bench role used to call the checkout's bin/llm-fleet,
which an installed collection does not ship)."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.bench import render_bench_table
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.plots import render_stored_bench


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("result",))

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        path = self._task.args.get("result")
        if not isinstance(path, str) or not path:
            return {**result, "failed": True, "msg": "result: give the stored bench result's path (RESULT.json)"}
        if self._task.check_mode:
            return {**result, "changed": False, "skipped": True, "msg": "check mode: nothing drawn"}
        try:
            report, written = render_stored_bench(path)
        except (OSError, ValueError, KeyError) as exc:
            return {**result, "failed": True, "msg": f"result: {path}: {exc}"}
        table = render_bench_table(report)
        return {**result, "changed": True, "table": table, "table_lines": table.splitlines(), "written": [str(p) for p in written]}
