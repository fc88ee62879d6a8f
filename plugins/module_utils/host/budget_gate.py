# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The budget gate as the vram_budget module runs it: the payload identity against the pinned
manifest first, then the ledger and every rule's verdict, failing (StepError) with the reason.

One core for both ways the gate runs: the module on a host (plugins/modules/vram_budget.py, through
module_entry.run_module) and the action plugin of the same name, which runs this in the
controller's own process when the task runs there (a fleet plan prices every endpoint on the
controller; a module process per endpoint costs more than the pricing).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFError
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import render_table
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.identity import UNCHECKED
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import ManifestError, load_manifest, parse_manifest
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import payload_identity, price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

# vram_budget's options, as AnsibleModule (and the action plugin's validator) take them.
BUDGET_OPTIONS: dict[str, dict[str, Any]] = {
    "shape": {"type": "dict", "required": True},
    "devices": {"type": "list", "elements": "dict", "required": True},
    "payload_dir": {"type": "path"},
    "manifest": {"type": "raw"},
    "report_only": {"type": "bool", "default": False},
    "boots": {"type": "list", "elements": "dict", "default": []},
}


def identity_result(shape: Any, manifest: Any) -> dict[str, Any]:
    """The payload identity check's result; StepError when the manifest is unreadable or the shape
    names a file it lacks (before any pricing reads a header that is not there)."""
    if manifest in (None, "", {}):
        return {"checked": False, "summary": UNCHECKED}
    try:
        pinned = parse_manifest(manifest) if isinstance(manifest, dict) else load_manifest(str(manifest))
        report = payload_identity(shape, pinned)
    except (ManifestError, OSError) as exc:
        raise StepError(f"manifest: cannot read the payload manifest ({exc}); fix endpoint_payload_manifest", {}) from None
    except ShapeError as exc:
        raise StepError(f"shape is invalid: {exc}", {}) from None
    if not report.ok:
        raise StepError(f"payload identity: {report.summary}", {"changed": False, "fits": False, "payload_identity": report.as_dict()})
    return report.as_dict()


def budget(params: dict[str, Any]) -> dict[str, Any]:
    """vram_budget's result for its validated params; StepError when the shape does not fit."""
    checked = identity_result(params["shape"], params.get("manifest"))
    try:
        result = price_shape(params["shape"], params["devices"], params.get("payload_dir"), boots=params.get("boots") or [])
    except (ShapeError, GGUFError, OSError) as exc:
        raise StepError(f"shape is invalid: {exc}", {}) from None
    report = result.as_dict()
    report["payload_identity"] = checked
    report["table"] = render_table(result) + f"\npayload identity: {checked['summary']}"
    if not result.fits and not params.get("report_only"):
        reasons = "; ".join(v.message for v in result.failures)
        raise StepError(f"shape does not fit: {reasons}", {"changed": False, **report})
    return {"changed": False, **report}
