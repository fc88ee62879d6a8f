# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a host step reports: StepError (a refusal that carries what the module reports with the
failure) and `report`, which runs a module's step and turns its result or its refusal into
exit_json or fail_json. Every host module and host step shares these two."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StepError(RuntimeError):
    """A step refused; `result` holds what the module reports with the failure."""

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


def report(module: Any, step: Callable[[], dict[str, Any]]) -> None:
    """Run a module's step and report it: exit_json with its result, or fail_json with the
    step's message and what it had gathered (journal lines, health details)."""
    try:
        result = step()
    except StepError as exc:
        _warn(module, exc.result)
        module.fail_json(msg=str(exc), **exc.result)
    _warn(module, result)
    module.exit_json(**result)


def _warn(module: Any, result: dict[str, Any]) -> None:
    """A step's warnings through module.warn (exit_json's own `warnings` key is deprecated)."""
    for warning in result.pop("warnings", None) or []:
        module.warn(str(warning))
