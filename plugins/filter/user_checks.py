# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight's checks of what a person wrote: the shape (the key, its file, the closest key,
the accepted form) and the vaulted secrets a run cannot decrypt."""

from __future__ import annotations

from typing import Any

from ansible.template import accept_args_markers, accept_lazy_markers

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.user_errors import missing_payload_text, origin_of, shape_problem_text


def _shape_problem(raw: Any, name: str | None = None) -> str:
    """'' for a shape that parses, else what is wrong, where, and the fix."""
    if not isinstance(raw, dict):
        where = origin_of(raw)
        located = f" ({where})" if where else ""
        return f"endpoint_shape{located}: expected a mapping of shape keys, got {type(raw).__name__}; fix: runtime: llamacpp, port: 8080, ... (docs/shape.md)"
    try:
        parse_shape(raw, name)
    except ShapeError as exc:
        return shape_problem_text(exc, raw)
    return ""


# The shape keys that name a file of the payload, relative to the payload directory.
PAYLOAD_KEYS = ("model_file", "projector", "drafter")


def _missing_payload_files(raw: Any, present: list[str], payload_dir: str) -> list[str]:
    """One message per payload file the shape names that is not among `present` (the payload
    directory's files, relative to it)."""
    found = {str(path).rstrip("/") for path in present}
    missing = []
    for key in PAYLOAD_KEYS:
        value = raw.get(key) if isinstance(raw, dict) else None
        if isinstance(value, str) and value not in (".", "") and value.lstrip("./").rstrip("/") not in found:
            missing.append(missing_payload_text(value, {key: value}, payload_dir, present=sorted(found)))
    return missing


def _is_locked(value: Any) -> bool:
    # A vaulted value Ansible could not decrypt reaches a marker-accepting filter as this marker.
    return type(value).__name__ == "VaultExceptionMarker"


@accept_args_markers
@accept_lazy_markers
def _vault_locked(variables: Any, names: list[str]) -> list[str]:
    """'NAME (FILE:LINE)' for each named variable, or value of a mapping, that is vaulted and
    could not be decrypted (no vault password given, or the wrong one)."""
    locked = []
    for name in names:
        try:
            value = variables[name]
        except (KeyError, TypeError):
            continue
        entries = [(name, value)]
        if isinstance(value, dict):
            entries = [(f"{name}.{key}", value[key]) for key in value]
        for label, entry in entries:
            if _is_locked(entry):
                where = origin_of(getattr(entry, "_marker_undecryptable_ciphertext", None))
                locked.append(f"{label} ({where})" if where else label)
    return locked


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"shape_problem": _shape_problem, "vault_locked": _vault_locked, "missing_payload_files": _missing_payload_files}
