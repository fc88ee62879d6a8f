# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one way the collection's modules run: a module is its documentation, its argument spec
and one `run_module(argument_spec, core)` call.

run_module builds the AnsibleModule, calls the core with a ModuleCall (the validated params,
check and diff mode, the Host its commands and writes go through) and reports: exit_json with the
result the core returned, or fail_json with the message of a StepError and what it had gathered,
or with the message of one of the error classes the module names in `errors`. Warnings a result
carries (its `warnings` key) go through module.warn, exit_json's own `warnings` key being
deprecated. The only module_utils file that imports Ansible: the cores it calls stay plain Python.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError


class ModuleCall:
    """What a module's core is given: the params as Ansible validated them, the run's modes, the
    Host (one per run, so its actions record is the run's), and the module for what only it does."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params: dict[str, Any] = module.params
        self.check_mode: bool = module.check_mode
        self.diff: bool = module._diff

    @cached_property
    def host(self) -> Host:
        return Host(self.module.run_command, self.check_mode)


def run_module(
    argument_spec: dict[str, Any],
    core: Callable[[ModuleCall], dict[str, Any]],
    errors: tuple[type[Exception], ...] = (),
    supports_check_mode: bool = True,
    **module_kwargs: Any,
) -> None:
    """Run one module: `core` returns the result (with `changed`); a StepError, or one of
    `errors`, fails the task with its message. `module_kwargs` go to AnsibleModule (required_if...)."""
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=supports_check_mode, **module_kwargs)
    try:
        result = core(ModuleCall(module))
    except StepError as exc:
        _warn(module, exc.result)
        module.fail_json(msg=str(exc), **exc.result)
    except errors as exc:
        module.fail_json(msg=str(exc))
    _warn(module, result)
    module.exit_json(**result)


def _warn(module: AnsibleModule, result: dict[str, Any]) -> None:
    for warning in result.pop("warnings", None) or []:
        module.warn(str(warning))
