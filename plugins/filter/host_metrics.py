# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host_metrics role's no-op check: the probe command and the lines it prints when the
machine's unit-metrics writer is current, from the same code the unit_metrics module installs with."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_metrics import TEXTFILE_DIR, current_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError


def _unit_metrics_probe(units: list[str], textfile_dir: str = TEXTFILE_DIR) -> dict[str, Any]:
    try:
        return current_probe(list(units), textfile_dir)
    except StepError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"unit_metrics_probe": _unit_metrics_probe}
