# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vram_budget on the controller: where the task runs on the controller itself (delegate_to
localhost, a local connection, no become), the budget gate's core runs in this process, the
arguments validated by the module's own spec; anywhere else the module runs on the host as usual.

The fleet plan prices every endpoint on the controller, and a module process per endpoint (its
payload built, a Python started, the budget code imported again) cost more than the pricing itself.
"""

from __future__ import annotations

from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.budget_gate import BUDGET_OPTIONS, budget
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.user_errors import identity_problem_text

MODULE = "frank.llm_fleet.vram_budget"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _on_controller(self) -> bool:
        return getattr(self._connection, "transport", "") == "local" and not self._play_context.become

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        if not self._on_controller():
            return self._located({**result, **self._execute_module(module_name=MODULE, task_vars=task_vars)}, task_vars)
        checked = ArgumentSpecValidator(BUDGET_OPTIONS).validate(dict(self._task.args))
        if checked.error_messages:
            return {**result, "failed": True, "msg": "; ".join(checked.error_messages)}
        try:
            return {**result, **budget(checked.validated_parameters)}
        except StepError as exc:
            return self._located({**result, **exc.result, "failed": True, "msg": str(exc)}, task_vars)

    @staticmethod
    def _located(result: dict[str, Any], task_vars: dict[str, Any] | None) -> dict[str, Any]:
        """A payload identity refusal names each shape key with the inventory file and line that
        set it (the endpoint's endpoint_shape, as Ansible read it), which only the controller knows."""
        identity = result.get("payload_identity") or {}
        if result.get("failed") and identity.get("mismatches"):
            result["msg"] = identity_problem_text(identity, (task_vars or {}).get("endpoint_shape"))
        return result
