# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The calibration loop: every boot's own ledger, stored on the controller under the shape's
geometry key, fed back into the budget and compared with what the budget predicted.

A geometry key names what a per-token KV price depends on: runtime, the model's cache geometry
(layers, KV heads, head dims, layer kinds, window), the KV dtypes and the tensor-parallel
degree. Context length and slots are not in it: boots of one geometry at different lengths are
exactly the points the budget interpolates between, and a length no boot measured is what it
must say it extrapolates.

Store layout: DIR/ENDPOINT/GEOMETRY_KEY.json = {"endpoint", "geometry_key", "boots": [...]}.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import Shape, ShapeError, parse_into
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB


def geometry_spec(geometry: kv_law.ModelGeometry) -> dict[str, Any]:
    """A model geometry as the explicit `model_geometry` mapping the budget accepts, so a stored
    boot can be re-priced on a controller that does not hold the model."""
    attention = [layer for layer in geometry.layers if layer.kind != "recurrent"]
    recurrent = [layer for layer in geometry.layers if layer.kind == "recurrent"]
    return {
        "architecture": geometry.architecture,
        "n_layer": geometry.n_layer,
        "n_head_kv": [layer.n_head_kv for layer in geometry.layers],
        "head_dim_k": attention[0].head_dim_k if attention else 1,
        "head_dim_v": attention[0].head_dim_v if attention else 1,
        "layer_kinds": [layer.kind for layer in geometry.layers],
        "sliding_window": geometry.sliding_window,
        "recurrent_state_bytes": recurrent[0].recurrent_state_bytes if recurrent else 0,
        "layer_bytes": [geometry.layer_weight_bytes.get(il, 0) for il in range(geometry.n_layer)],
        "input_bytes": geometry.input_weight_bytes,
        "output_bytes": geometry.output_weight_bytes,
    }


def geometry_key(shape: Shape, geometry: kv_law.ModelGeometry | None) -> str:
    """Stable key of what the per-token KV price depends on (see the module docstring)."""
    dtypes, tensor_parallel = shape.kv_identity
    if geometry is not None:
        spec = geometry_spec(geometry)
        model = {k: spec[k] for k in ("architecture", "n_head_kv", "head_dim_k", "head_dim_v", "layer_kinds", "sliding_window", "recurrent_state_bytes")}
    else:
        model = {"model": os.path.basename(str(shape.model_file or shape.served_id or ""))}
    identity = {"runtime": shape.runtime, "model": model, "kv_dtypes": dtypes, "tensor_parallel": tensor_parallel}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return f"{shape.runtime}-{digest}"


def stored_shape(boot: dict[str, Any], cls: type[Shape]) -> Shape | None:
    """A stored boot's shape as one runtime's class; None for a record of another runtime or one
    this version cannot read (it is skipped, never trusted)."""
    raw = boot.get("shape")
    if not isinstance(raw, Mapping) or raw.get("runtime") != cls.RUNTIME:
        return None
    try:
        return parse_into(cls, raw)
    except ShapeError:
        return None


def boot_record(
    endpoint: str,
    host: str,
    shape: Shape,
    key: str,
    geometry: dict[str, Any] | None,
    ledger: dict[str, Any],
    pool_bytes: int | None,
    recorded_at: str,
) -> dict[str, Any]:
    """One stored boot: the shape it booted (its geometry in place of the payload) and its ledger."""
    kept = {k: v for k, v in shape.as_dict().items() if k not in ("calibration", "slot_calibration")}
    if geometry:
        kept["model_geometry"] = geometry
    return {
        "endpoint": endpoint,
        "host": host,
        "geometry_key": key,
        "recorded_at": recorded_at,
        "shape": kept,
        "pool_bytes": pool_bytes,
        "ledger": ledger,
    }


def boot_identity(record: dict[str, Any]) -> str:
    # The same boot recorded twice (an idempotent rerun) is one point; the time is not identity.
    return json.dumps({k: record.get(k) for k in ("host", "shape", "pool_bytes", "ledger")}, sort_keys=True)


def store_path(store_dir: str, endpoint: str, key: str) -> str:
    return os.path.join(store_dir, endpoint, f"{key}.json")


def store_boot(store_dir: str, record: dict[str, Any], check_mode: bool = False, host: Host | None = None) -> tuple[str, bool]:
    """Add a boot under its endpoint and geometry key; (path, changed). Idempotent. The write goes
    through `host` (without one, a files-only Host in `check_mode`)."""
    path = store_path(store_dir, record["endpoint"], record["geometry_key"])
    text = read_text(path)
    data = json.loads(text) if text else {"endpoint": record["endpoint"], "geometry_key": record["geometry_key"], "boots": []}
    if any(boot_identity(boot) == boot_identity(record) for boot in data["boots"]):
        return path, False
    data["boots"].append(record)
    (host or Host.files_only(check_mode)).write(path, json.dumps(data, indent=2, sort_keys=True) + "\n", 0o644, dir_mode=0o755)
    return path, True


def load_boots(store_dir: str, endpoint: str | None = None) -> list[dict[str, Any]]:
    """Every stored boot (of one endpoint, when given), oldest first within each file."""
    pattern = os.path.join(store_dir, endpoint or "*", "*.json")
    boots: list[dict[str, Any]] = []
    for path in sorted(glob.glob(pattern)):
        with open(path, encoding="utf-8") as handle:
            boots.extend(json.load(handle).get("boots") or [])
    return boots


def engine_mib(value: int | float) -> str:
    # The engine prints MiB with two decimals; agreement is judged at the engine's precision.
    return f"{value / MIB:.2f}"


def render_comparison(rows: list[dict[str, Any]]) -> str:
    """Predicted vs measured, one line per stored boot."""
    if not rows:
        return "no stored boots"
    lines = []
    for row in rows:
        layout = ", ".join(f"{k} {v}" for k, v in row["layout"].items())
        verdict = {True: "AGREE", False: "DIFFER", None: "n/a"}[row.get("agree")]
        lines.append(f"{row['endpoint']} on {row['host']} at {row['recorded_at']}  [{row['geometry_key']}]  {layout}")
        if "predicted" in row:
            for name in row["predicted"]:
                lines.append(f"    {name:<12} predicted {row['predicted'][name]!s:>14}   measured {row['measured'][name]!s:>14}")
        lines.append(f"    {verdict}: {row.get('detail', '')}")
    return "\n".join(lines)
