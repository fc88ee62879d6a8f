# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""qualify_report, then its picture: the module writes the JSON, the table and the snippet where
the task runs; on the controller (delegate_to localhost, as roles/qualify runs it), where
matplotlib is, NAME.qualify.png is drawn beside them from the JSON just written. Anywhere else
the files are left as the module wrote them and the result says why there is no picture."""

from __future__ import annotations

import json
from typing import Any

from ansible.plugins.action import ActionBase

from ansible_collections.frank.llm_fleet.plugins.plugin_utils.plots import render_qualify_png

MODULE = "frank.llm_fleet.qualify_report"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _on_controller(self) -> bool:
        return getattr(self._connection, "transport", "") == "local"

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        result.update(self._execute_module(module_name=MODULE, task_vars=task_vars))
        if result.get("failed") or self._task.check_mode or "paths" not in result:
            return result
        where = result["paths"]
        if not self._on_controller():
            result["picture"] = f"not drawn: {where['json']} is on the host, matplotlib on the controller (delegate_to: localhost draws it)"
            return result
        try:
            with open(where["json"], encoding="utf-8") as handle:
                document = json.load(handle)
            render_qualify_png(document, where["picture"], where["json"])
        except (OSError, ValueError) as exc:
            return {**result, "failed": True, "msg": f"picture: {exc}"}
        result["picture"] = where["picture"]
        return result
