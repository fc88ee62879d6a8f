# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The failure a module's core raises to fail the task with what it had gathered: plain Python, so
a core raises it without importing Ansible; the module fails with its message and its result."""

from __future__ import annotations

from typing import Any


class StepError(RuntimeError):
    """A step refused; `result` holds what the module reports with the failure."""

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result
