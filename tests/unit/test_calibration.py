"""The calibration loop: boots stored per geometry key, fed back into the budget, compared."""

import copy

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import calibration
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import geometry_from_dict
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import compare_boot, parse_shape, price_shape

MIB = 1 << 20
GIB = 1 << 30
# 2 layers x 2 KV heads x 32 dims: K and V rows of 2 x 32 x 2 B each -> 512 B per cell (f16).
GEOMETRY = {"n_layer": 2, "n_head_kv": 2, "head_dim": 32, "layer_bytes": "1 MiB"}


def llama_shape(**overrides):
    shape = {"runtime": "llamacpp", "model_geometry": GEOMETRY, "ctx_size": 8192, "parallel": 2}
    return {**shape, **overrides}


def vllm_shape(**overrides):
    shape = {
        "runtime": "vllm",
        "model_geometry": GEOMETRY,
        "max_model_len": 2048,
        "max_num_seqs": 4096,
        "kv_cache_memory_bytes": 2 * GIB,
    }
    return {**shape, **overrides}


DEVICES = {"llamacpp": [{"name": "cpu", "memory": "2 GiB"}], "vllm": [{"name": "cpu", "memory": "24 GiB"}]}


def price(shape, **kwargs):
    return price_shape(shape, DEVICES[shape["runtime"]], **kwargs)


def key(shape, geometry):
    return calibration.geometry_key(parse_shape(shape), geometry)


def llama_ledger(cells, seqs, k_bytes, v_bytes):
    line = {"size_bytes": k_bytes + v_bytes, "cells": cells, "layers": 2, "seqs_used": seqs, "seqs_max": seqs}
    return {"engine": "llamacpp", "kv_caches": [{**line, "type_k": "f16", "k_bytes": k_bytes, "type_v": "f16", "v_bytes": v_bytes}]}


def stored(shape, ledger, pool=None, when="2026-11-29T10:00:00Z"):
    result = price(shape)
    return calibration.boot_record("frank-primary", "lab", parse_shape(shape), result.geometry_key, result.model_geometry, ledger, pool, when)


def test_geometry_key_ignores_the_layout_and_follows_geometry_and_dtype():
    geometry = geometry_from_dict(GEOMETRY)
    base = key(llama_shape(), geometry)
    assert key(llama_shape(ctx_size=4096, parallel=4), geometry) == base
    assert key(llama_shape(type_k="q8_0"), geometry) != base
    wider = geometry_from_dict({**GEOMETRY, "n_head_kv": 4})
    assert key(llama_shape(), wider) != base
    assert key(vllm_shape(), geometry) != base


def test_store_is_idempotent_and_keeps_boots_per_endpoint_and_key(tmp_path):
    record = stored(llama_shape(), llama_ledger(4096, 2, 2 * MIB, 2 * MIB))
    path, changed = calibration.store_boot(str(tmp_path), record)
    assert changed and path.endswith(f"frank-primary/{record['geometry_key']}.json")
    later = {**record, "recorded_at": "2026-11-30T00:00:00Z"}  # the same boot seen again
    assert calibration.store_boot(str(tmp_path), later) == (path, False)
    other = stored(llama_shape(ctx_size=4096), llama_ledger(2048, 2, MIB, MIB))
    assert calibration.store_boot(str(tmp_path), other, check_mode=True)[1] is True
    assert len(calibration.load_boots(str(tmp_path))) == 1  # check mode wrote nothing
    calibration.store_boot(str(tmp_path), other)
    assert len(calibration.load_boots(str(tmp_path), "frank-primary")) == 2
    assert calibration.load_boots(str(tmp_path / "missing")) == []


def test_llamacpp_boot_at_the_same_layout_makes_the_figure_measured():
    boot = stored(llama_shape(), llama_ledger(4096, 2, 2 * MIB, 2 * MIB))
    assert price(llama_shape()).kv["basis"] == "formula"
    assert price(llama_shape(), boots=[boot]).kv["basis"] == "measured"
    extrapolated = price(llama_shape(ctx_size=16384), boots=[boot])
    assert extrapolated.kv["basis"] == "extrapolated"
    assert any("no boot measured at this layout" in note for note in extrapolated.notes)
    # A boot of another geometry is no evidence for this one.
    assert price(llama_shape(type_k="q8_0", type_v="q8_0"), boots=[boot]).kv["basis"] == "formula"


def test_llamacpp_measurement_that_disagrees_is_reported_not_hidden():
    boot = stored(llama_shape(), llama_ledger(4096, 2, 3 * MIB, 2 * MIB))
    result = price(llama_shape(), boots=[boot])
    assert result.kv["basis"] == "measured-differs"
    assert any("5.00 MiB" in note and "4.00 MiB" in note for note in result.notes)
    row = compare_boot(boot, [boot])
    assert row["agree"] is False and row["predicted"]["k_mib"] == "2.00" and row["measured"]["k_mib"] == "3.00"


def test_llamacpp_comparison_agrees_for_a_boot_the_law_predicts():
    # 6000 pads to 6144 cells = 4 streams x 1536; 6144 x 2 layers x 2 heads x 32 x 2 B = 1.5 MiB each of K and V.
    boot = stored(llama_shape(parallel=4, ctx_size=6000), llama_ledger(1536, 4, 3 * MIB // 2, 3 * MIB // 2))
    row = compare_boot(boot, [boot])
    assert row["agree"] is True, row
    assert row["layout"] == {"ctx_size": 6000, "parallel": 4, "kv_unified": False, "ubatch": 512, "swa_full": False}


# Layers of different KV head counts (1 and 3 heads of 32 dims: still 512 B per token) have pages
# of different sizes, a grouping the exact block law does not model: such a geometry is priced
# from its stored boots, as every geometry was before the engine's block rule was adopted.
UNMODELLED = {"n_layer": 2, "n_head_kv": [1, 3], "head_dim": 32, "layer_bytes": "1 MiB"}


def test_vllm_boots_become_calibration_points_and_extrapolation_is_named():
    # The engine measured 2 GiB -> 4,194,304 tokens at max_model_len 2048 (512 B per token).
    shape = vllm_shape(model_geometry=UNMODELLED)
    boot = stored(shape, {"engine": "vllm", "kv_tokens": 4_194_304, "concurrency": 2048.0}, pool=2 * GIB)
    measured = price({**shape, "kv_cache_memory_bytes": GIB}, boots=[boot])
    assert measured.kv["basis"] == "measured" and measured.kv["tokens"] == 2_097_152
    other_length = price({**shape, "max_model_len": 4096}, boots=[boot])
    assert other_length.kv["basis"] == "extrapolated"
    assert any("extrapolated from 2048" in note for note in other_length.notes)
    assert price(shape).kv["basis"] == "formula"


def test_a_geometry_the_block_law_models_is_priced_by_the_engines_rule_not_by_its_boots():
    # A stored boot that disagrees with the engine's rule does not move the price; the
    # comparison shows the disagreement instead.
    boot = stored(vllm_shape(), {"engine": "vllm", "kv_tokens": 4_000_000, "concurrency": 1953.12}, pool=2 * GIB)
    result = price(vllm_shape(), boots=[boot])
    # 2 GiB / (2 layers x 16 x 2 heads x 64 x 2 B = 8,192 B per block) = 262,144 blocks of 16 tokens.
    assert result.kv["basis"] == "exact" and result.kv["tokens"] == 4_194_304
    assert compare_boot(boot, [boot])["agree"] is False


def test_vllm_comparison_never_predicts_a_boot_from_itself():
    shape = vllm_shape(model_geometry=UNMODELLED)
    a = stored(shape, {"engine": "vllm", "kv_tokens": 4_194_304, "concurrency": 2048.0}, pool=2 * GIB)
    alone = compare_boot(a, [a])
    assert alone["detail"].startswith("formula") and alone["agree"] is True
    b = stored({**shape, "kv_cache_memory_bytes": GIB}, {"engine": "vllm", "kv_tokens": 2_000_000, "concurrency": 976.56}, pool=GIB)
    row = compare_boot(b, [a, b])
    assert row["detail"].startswith("measured") and row["predicted"]["kv_tokens"] == 2_097_152
    assert row["agree"] is False  # b's own 2,000,000 was not used to predict b


def test_comparison_without_a_geometry_or_a_kv_line_says_why():
    boot = stored(llama_shape(), {"engine": "llamacpp"})
    assert "llama_kv_cache" in compare_boot(boot, [boot])["detail"]
    no_geometry = copy.deepcopy(stored(llama_shape(), llama_ledger(4096, 2, 2 * MIB, 2 * MIB)))
    del no_geometry["shape"]["model_geometry"]
    row = compare_boot(no_geometry, [no_geometry])
    assert row["agree"] is None and "geometry" in row["detail"]
    text = calibration.render_comparison([row])
    assert "n/a" in text


@pytest.mark.parametrize("runtime", ["llamacpp", "vllm"])
def test_budget_result_carries_key_and_geometry_for_the_store(runtime):
    result = price(llama_shape() if runtime == "llamacpp" else vllm_shape())
    assert result.geometry_key.startswith(f"{runtime}-")
    assert geometry_from_dict(result.model_geometry).n_layer == 2


def test_vllm_comparison_carries_the_arena_a_boot_printed():
    # seeds/004, the c769ff2 boot: "GPU KV cache size: 398,658 tokens," / "expert cache space 14.87 GiB / 6,496 slots of 2.344 MiB",
    # predicted from the precise-memory boot "expert cache space 17.22 GiB / 7522 slots" (overhead 5.25 -> 7.60 GiB).
    shape = vllm_shape(
        max_model_len=200_704,
        expert_offload=True,
        runtime_overhead="7.60 GiB",
        expert_slot_bytes="2.344 MiB",
        gpu_memory_utilization=0.98,
        expert_arena_calibration={"max_model_len": 200_704, "runtime_overhead": "5.25 GiB", "arena": "17.22 GiB", "gpu_memory_utilization": 0.98},
    )
    ledger = {"engine": "vllm", "kv_tokens": 4_194_304, "concurrency": 20.9, "arena_bytes": round(14.87 * GIB), "arena_slots": 6_496}
    row = compare_boot(stored(shape, ledger, pool=2 * GIB), [])
    assert row["predicted"]["arena_gib"] == row["measured"]["arena_gib"] == 14.87
    assert row["predicted"]["arena_slots"] == row["measured"]["arena_slots"] == 6_496
    wrong = dict(ledger, arena_bytes=round(16 * GIB))
    assert compare_boot(stored(shape, wrong, pool=2 * GIB), [])["agree"] is False
