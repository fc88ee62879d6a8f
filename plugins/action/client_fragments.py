# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""client_fragments: the harness's models.yml fragments written on the controller in the task's own
process (plugins/plugin_utils/client_fragments.py), once for the whole play: no module process per file."""

from __future__ import annotations

from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.frank.llm_fleet.plugins.plugin_utils.client_fragments import FragmentError, fragments_for, sync_fragments

OPTIONS: dict[str, Any] = {
    "dest": {"type": "path", "required": True},
    "endpoints": {"type": "list", "elements": "str", "required": True},
    "inventory": {"type": "list", "elements": "str", "required": True},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        checked = ArgumentSpecValidator(OPTIONS).validate(dict(self._task.args))
        if checked.error_messages:
            return {**result, "failed": True, "msg": "; ".join(checked.error_messages)}
        args = checked.validated_parameters
        try:
            fragments = fragments_for(args["endpoints"], (task_vars or {}).get("hostvars") or {})
            report = sync_fragments(args["dest"], fragments, args["inventory"], check=bool(self._task.check_mode))
        except (FragmentError, OSError) as exc:
            return {**result, "failed": True, "msg": str(exc)}
        out = {
            **result,
            "changed": report.changed,
            "dest": args["dest"],
            "written": report.written,
            "unchanged": report.unchanged,
            "removed": report.removed,
        }
        if self._task.diff and report.diffs:
            out["diff"] = [{"prepared": text} for text in report.diffs]
        return out
