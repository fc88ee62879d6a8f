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
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import expert_arena, kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import geometry_from_dict
from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import LlamaCppShape, Shape, ShapeError, VllmShape, parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, MIB

# Shape keys that decide the cache's layout within one geometry (what a boot was measured at).
LLAMACPP_LAYOUT_KEYS = ("ctx_size", "parallel", "kv_unified", "ubatch", "swa_full")
VLLM_LAYOUT_KEYS = ("max_model_len", "max_num_seqs")


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
    if isinstance(shape, VllmShape):
        dtypes = [kv_law.normalise_vllm_dtype(shape.kv_cache_dtype)]
        tensor_parallel = shape.tensor_parallel
    else:
        dtypes = list(shape.kv_dtypes)
        tensor_parallel = 1
    if geometry is not None:
        spec = geometry_spec(geometry)
        model = {k: spec[k] for k in ("architecture", "n_head_kv", "head_dim_k", "head_dim_v", "layer_kinds", "sliding_window", "recurrent_state_bytes")}
    else:
        model = {"model": os.path.basename(str(shape.model_file or shape.served_id or ""))}
    identity = {"runtime": shape.runtime, "model": model, "kv_dtypes": dtypes, "tensor_parallel": tensor_parallel}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return f"{shape.runtime}-{digest}"


def _layout(shape: Shape) -> dict[str, Any]:
    keys = LLAMACPP_LAYOUT_KEYS if isinstance(shape, LlamaCppShape) else VLLM_LAYOUT_KEYS
    return {key: getattr(shape, key) for key in keys}


def stored_shape(boot: dict[str, Any]) -> Shape | None:
    """A stored boot's shape, typed; None for a record this version cannot read (it is skipped,
    never trusted)."""
    try:
        return parse_shape(boot.get("shape") or {})
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


def _identity(record: dict[str, Any]) -> str:
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
    if any(_identity(boot) == _identity(record) for boot in data["boots"]):
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


def vllm_points(boots: list[dict[str, Any]], key: str, exclude: dict[str, Any] | None = None) -> list[kv_law.VllmCalibration]:
    """Stored vLLM boots of this geometry as calibration points (pool bytes -> engine tokens)."""
    points = []
    for boot in boots:
        if boot.get("geometry_key") != key or (exclude is not None and _identity(boot) == _identity(exclude)):
            continue
        tokens = (boot.get("ledger") or {}).get("kv_tokens")
        pool = boot.get("pool_bytes")
        shape = stored_shape(boot)
        if tokens and pool and isinstance(shape, VllmShape):
            points.append(kv_law.VllmCalibration(shape.kv_cache_dtype, shape.max_model_len, int(pool), int(tokens), f"boot {boot.get('recorded_at', '')}"))
    return points


def llamacpp_measured(boots: list[dict[str, Any]], key: str, shape: LlamaCppShape) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the boot measured at this exact cache layout or None, the layouts measured for this geometry)."""
    layout = _layout(shape)
    same_key = [(b, stored_shape(b)) for b in boots if b.get("geometry_key") == key and (b.get("ledger") or {}).get("kv_caches")]
    readable = [(b, s) for b, s in same_key if isinstance(s, LlamaCppShape)]
    exact = next((b for b, s in reversed(readable) if _layout(s) == layout), None)
    return exact, [_layout(s) for _b, s in readable]


def engine_mib(value: int | float) -> str:
    # The engine prints MiB with two decimals; agreement is judged at the engine's precision.
    return f"{value / MIB:.2f}"


def compare_boot(boot: dict[str, Any], boots: list[dict[str, Any]]) -> dict[str, Any]:
    """Predicted vs measured for one stored boot. The prediction never uses the boot itself:
    llama.cpp by the exact law from the stored geometry, vLLM from the other boots of the
    geometry (or the formula when there are none)."""
    ledger = boot.get("ledger") or {}
    row: dict[str, Any] = {
        "endpoint": boot.get("endpoint"),
        "host": boot.get("host"),
        "recorded_at": boot.get("recorded_at"),
        "geometry_key": boot.get("geometry_key"),
        "runtime": str((boot.get("shape") or {}).get("runtime", ledger.get("engine", ""))),
        "layout": {},
    }
    try:
        shape = parse_shape(boot.get("shape") or {})
        row["layout"] = _layout(shape)
        geometry = geometry_from_dict(shape.model_geometry, "model_geometry") if shape.model_geometry else None
        if isinstance(shape, LlamaCppShape):
            row.update(_compare_llamacpp(shape, ledger, geometry))
        else:
            row.update(_compare_vllm(boot, boots, shape, ledger, geometry))  # type: ignore[arg-type]
    except (kv_law.KvLawError, ValueError, KeyError, TypeError) as exc:
        row.update(agree=None, detail=f"cannot predict: {exc}")
    return row


def _compare_llamacpp(shape: LlamaCppShape, ledger: dict[str, Any], geometry: kv_law.ModelGeometry | None) -> dict[str, Any]:
    lines = ledger.get("kv_caches") or []
    if not lines:
        return {"agree": None, "detail": "the boot printed no llama_kv_cache line (run the engine with --log-verbosity 4)"}
    if geometry is None:
        return {"agree": None, "detail": "no stored geometry to predict from"}
    kv = kv_law.llamacpp_kv(
        geometry, shape.ctx_size, shape.parallel, shape.type_k, shape.cache_type_v, unified=shape.kv_unified, ubatch=shape.ubatch, swa_full=shape.swa_full
    )
    line = lines[0]  # the target's cache; a drafter's follows it
    predicted = {
        "cells": kv.cells_per_stream,
        "seqs": kv.n_streams,
        "k_mib": engine_mib(kv.k_bytes),
        "v_mib": engine_mib(kv.v_bytes),
        "kv_mib": engine_mib(kv.total_bytes),
    }
    measured = {
        "cells": line["cells"],
        "seqs": line["seqs_max"],
        "k_mib": engine_mib(line["k_bytes"]),
        "v_mib": engine_mib(line["v_bytes"]),
        "kv_mib": engine_mib(line["size_bytes"]),
    }
    return {"predicted": predicted, "measured": measured, "agree": predicted == measured, "detail": "exact law"}


def _compare_vllm(
    boot: dict[str, Any], boots: list[dict[str, Any]], shape: VllmShape, ledger: dict[str, Any], geometry: kv_law.ModelGeometry | None
) -> dict[str, Any]:
    if not ledger.get("kv_tokens"):
        return {"agree": None, "detail": "the boot printed no KV cache size line"}
    if not boot.get("pool_bytes"):
        return {"agree": None, "detail": "no pool size recorded for this boot"}
    others = vllm_points(boots, str(boot.get("geometry_key")), exclude=boot)
    kv = kv_law.vllm_kv(int(boot["pool_bytes"]), shape.max_model_len, shape.kv_cache_dtype, others, geometry, shape.tensor_parallel)
    predicted = {"kv_tokens": kv.tokens, "concurrency": round(kv.concurrency, 2)}
    measured = {"kv_tokens": int(ledger["kv_tokens"]), "concurrency": round(float(ledger.get("concurrency") or 0), 2)}
    agree = predicted == measured
    detail = f"{kv.basis}: {kv.note}"
    arena = _predict_arena(shape, ledger)
    if arena is not None:
        # The arena law is a plan figure, right to ~0.3% (docs/vram_budget.md): it agrees within 1%.
        predicted["arena_gib"], measured["arena_gib"] = round(arena.arena_bytes / GIB, 2), round(ledger["arena_bytes"] / GIB, 2)
        if arena.slots is not None and ledger.get("arena_slots"):
            predicted["arena_slots"], measured["arena_slots"] = arena.slots, int(ledger["arena_slots"])
        agree = agree and abs(arena.arena_bytes - ledger["arena_bytes"]) <= ARENA_TOLERANCE * ledger["arena_bytes"]
        detail += f"; {arena.note}"
    return {"predicted": predicted, "measured": measured, "agree": agree, "detail": detail}


ARENA_TOLERANCE = 0.01


def _predict_arena(shape: VllmShape, ledger: dict[str, Any]) -> expert_arena.ArenaPlan | None:
    """The arena law's figure for a boot that printed `expert cache space`, where the shape gives
    a calibration boot at the same utilization (the stored boot records no card size)."""
    calibration_boot = expert_arena.arena_calibration_from(shape.expert_arena_calibration)
    if not ledger.get("arena_bytes") or calibration_boot is None:
        return None
    if calibration_boot.gpu_memory_utilization not in (None, shape.gpu_memory_utilization):
        return None
    return expert_arena.plan_arena(
        budget=0,
        non_expert=0,
        graphs=0,
        overhead=expert_arena.shape_overhead(shape),
        max_model_len=shape.max_model_len,
        reserve_per_token=shape.kv_reserve_per_token,
        slot_bytes=shape.expert_slot_bytes,
        calibration=calibration_boot,
    )


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
