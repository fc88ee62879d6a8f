# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shapes the fleet paid for, refused (or flagged) by the gate before anything boots.

Each rule is one the fleet's history proves (shared/seeds, named beside the rule):
- KV dtype legality per device architecture and attention kind (`arch` on endpoint_devices);
- known-bad shapes of one model (`known_bad` in the shape: the inventory records what the model
  cannot run, because no rule derived from the shape alone can know a compiler constraint);
- a context past the trained window: a WARNING note, the engine serves it on the base rope;
(an --override-tensor pattern that places no tensor is placement.py's verdict: it reads the tensors.)
`judge()` is called once from each runtime's pricing (runtimes/<name>.py) and returns verdicts; warnings go to notes.
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import read_hf_config
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import ModelGeometry
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import DeviceLedger, Verdict
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import Shape

# (architecture prefix, attention kind or None for any) -> KV dtype prefixes the backend cannot run, and why.
ILLEGAL_KV = (
    # seed 001: "fp8 KV is hardware-dead on the 3090 (sm_86, no cvt.e4m3x2)"
    ("sm_86", None, ("fp8",), "fp8 KV is hardware-dead on sm_86 (no cvt.e4m3x2)"),
    # seed 000: "fp8 is ILLEGAL here — it disables the sparse MLA backend's rope-free Triton path,
    # the only MLA decode gfx12 has"
    ("gfx12", "sparse_mla", ("fp8",), "fp8 KV disables the sparse MLA backend's rope-free Triton path, the only MLA decode gfx12 has"),
)


def judge(
    shape: Shape,
    devices: list[DeviceLedger],
    geometry: ModelGeometry | None,
    model_path: str | None,
    notes: list[str],
) -> list[Verdict]:
    """Every rule's verdict for a priced shape; warnings are appended to `notes`."""
    verdicts = _kv_dtype_verdicts(shape, devices, model_path)
    verdicts += _known_bad_verdicts(shape)
    _trained_window_note(shape, geometry, notes)
    return verdicts


def attention_kind(shape: Shape, model_path: str | None) -> str | None:
    """sparse_mla, mla or None: from model_geometry's `attention`, else the Hugging Face config
    (MLA configs carry kv_lora_rank; the sparse indexer adds index_topk)."""
    explicit = (shape.model_geometry or {}).get("attention")
    if explicit:
        return str(explicit)
    config_path = os.path.join(model_path, "config.json") if model_path else ""
    if not config_path or not os.path.isfile(config_path):
        return None
    # The one bounded, checked reader (a hostile config names its key and file, never a Python error).
    config = read_hf_config(config_path, "model_file")
    text = config.get("text_config") or config
    if not text.get("kv_lora_rank"):
        return None
    return "sparse_mla" if text.get("index_topk") else "mla"


def _kv_dtype_verdicts(shape: Shape, devices: list[DeviceLedger], model_path: str | None) -> list[Verdict]:
    kind = None
    out = []
    for device in devices:
        arch = getattr(device, "arch", None)
        if not arch:
            continue
        for prefix, attention, dtypes, why in ILLEGAL_KV:
            if not arch.startswith(prefix):
                continue
            if attention is not None:
                kind = kind or attention_kind(shape, model_path)
                if kind != attention:
                    continue
            bad = [dtype for dtype in shape.kv_dtypes if dtype.lower().startswith(dtypes)]
            if bad:
                field = shape.KV_DTYPE_FIELD
                out.append(Verdict("kv_dtype_illegal", False, f"{field}: {bad[0]} on {device.name} ({arch}): {why}; use bf16/auto", device.name, "kv"))
    return out


def _known_bad_verdicts(shape: Shape) -> list[Verdict]:
    out = []
    for entry in shape.known_bad:
        keys = {key: value for key, value in entry.items() if key != "reason"}
        if all(_same(getattr(shape, key, None), value) for key, value in keys.items()):
            said = ", ".join(f"{key} {value}" for key, value in keys.items())
            out.append(Verdict("known_bad", False, f"{said}: known bad for this model: {entry['reason']}; change {', '.join(keys)}"))
    return out


def _same(actual: Any, declared: Any) -> bool:
    if isinstance(actual, tuple):
        return list(actual) == list(declared) if isinstance(declared, (list, tuple)) else False
    if isinstance(actual, (int, float)) and not isinstance(actual, bool):
        try:
            return float(actual) == float(declared)
        except (TypeError, ValueError):
            return False
    return actual == declared


def _trained_window_note(shape: Shape, geometry: ModelGeometry | None, notes: list[str]) -> None:
    """seed 003: "positions past the trained 262144 extrapolate on the base rope" - served, so a note."""
    trained = geometry.n_ctx_train if geometry is not None else 0
    trained = trained or int((shape.model_geometry or {}).get("n_ctx_train") or 0)
    if not trained:
        return
    window = shape.request_window
    if window > trained:
        notes.append(f"WARNING: a {window:,}-token window is past the trained {trained:,}: positions beyond it extrapolate on the base rope")
