import re
from pathlib import Path

import pytest
from gguf_files import write_gguf

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import render_table, slot_ceiling
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.placement import HOST, assign_layers
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, MIB, parse_size


def price(request, **kwargs):
    """price_shape() for a test's request: its devices, and its model (a GGUF written under
    tmp_path) as the payload directory and the model_file inside it."""
    shape = dict(request)
    devices = shape.pop("devices", None)
    payload_dir = None
    if "model" in shape:
        path = Path(shape.pop("model"))
        payload_dir, shape["model_file"] = str(path.parent), path.name
    return price_shape(shape, devices, payload_dir, **kwargs)


CARD = "31.86 GiB"
FP8_CALIBRATION = [
    {"kv_dtype": "fp8", "max_model_len": 262_144, "pool_bytes": 8_311_013_376, "tokens": 1_079_582},
    {"kv_dtype": "fp8", "max_model_len": 262_144, "pool_bytes": 10_388_766_720, "tokens": 1_350_182},
]


def primary_rank_shape(arena):
    """frank-primary, one rank, the measured ledger: weights 6.28 + pool 6.80 + graphs 0.55 + arena + non-torch 1.45."""
    return {
        "runtime": "vllm",
        "devices": [{"name": "r9700-0", "memory": CARD}],
        "tensor_parallel": 1,
        "max_model_len": 262_144,
        "max_num_seqs": 5,
        "kv_cache_dtype": "fp8",
        "kv_cache_memory_bytes": "6.80 GiB",
        "weights_per_rank": "6.28 GiB",
        "graph_memory": "0.55 GiB",
        "expert_arena": arena,
        "non_torch_memory": "1.45 GiB",
        "gpu_memory_utilization": 0.98,
        "free_floor": "0.5 GiB",
        "calibration": FP8_CALIBRATION,
    }


def verdict(result, rule, device=None):
    return next(v for v in result.verdicts if v.rule == rule and (device is None or v.device == device))


def test_measured_refusal_31_73_of_31_86_gib():
    result = price(primary_rank_shape("16.65 GiB"))
    device = result.devices[0]
    assert round(device.used / GIB, 2) == 31.73
    assert round(device.free / GIB, 2) == 0.13
    assert not result.fits
    floor = verdict(result, "free_floor")
    assert not floor.ok
    assert floor.device == "r9700-0"
    assert floor.term == "expert_arena"
    assert floor.overage_mib == pytest.approx((0.5 * GIB - device.free) / MIB, abs=0.1)


def test_default_overhead_arena_leaves_about_2_4_gib_and_passes():
    result = price(primary_rank_shape("14.31 GiB"))
    assert result.fits, render_table(result)
    assert 2.4 <= result.devices[0].free / GIB < 2.5


def test_over_capacity_names_the_crossing_term_and_overage():
    shape = primary_rank_shape("20 GiB")
    result = price(shape)
    fits = verdict(result, "fits")
    assert not fits.ok
    assert fits.term == "expert_arena"
    expected_over = (6.28 + 6.80 + 0.55 + 20 + 1.45 - 31.86) * 1024
    assert fits.overage_mib == pytest.approx(expected_over, abs=1)
    assert f"over by {fits.overage_mib:,.1f} MiB" in fits.message


def test_arena_is_what_remains_of_the_budget_when_not_declared():
    shape = primary_rank_shape(None)
    shape["expert_offload"] = True
    result = price(shape)
    arena = next(t for t in result.devices[0].terms if t.name == "expert_arena")
    budget = int(parse_size(CARD) * 0.98)
    # vLLM counts non-torch memory inside the utilization budget: the arena gets the rest.
    assert arena.bytes == budget - parse_size("6.28 GiB") - parse_size("6.80 GiB") - parse_size("0.55 GiB") - parse_size("1.45 GiB")
    assert result.devices[0].used == budget


def test_utilization_of_one_is_refused():
    # seeds/004: "the UTIL 1.0 verdict (unbootable: worker init demands free > budget; ValueError on both ranks".
    # The one shape parser refuses it before any pricing, naming the field and the fix.
    shape = primary_rank_shape("14.31 GiB")
    shape["gpu_memory_utilization"] = 1.0
    with pytest.raises(ShapeError, match=r"gpu_memory_utilization: 1.0 is out of range: .*unbootable.*use at most 0.98"):
        price(shape)


def test_pool_larger_than_slots_times_ctx_passes():
    # seeds/000: "fp8 3 x 262144 / MNBT 2048 / 792,069 tokens / 3.02x" served: a vLLM pool may exceed
    # max_num_seqs x max_model_len; only "holds one max_model_len" is vLLM's law.
    shape = primary_rank_shape("14.31 GiB")
    shape["max_num_seqs"] = 1  # 6.80 GiB of fp8 holds ~3.6 windows of 262,144
    law = verdict(price(shape), "pool_law")
    assert law.ok, law.message


def test_pool_smaller_than_one_window_is_refused():
    shape = primary_rank_shape("14.31 GiB")
    shape["kv_cache_memory_bytes"] = "1 GiB"
    law = verdict(price(shape), "pool_law")
    assert not law.ok and law.term == "kv_pool" and law.overage_mib > 0


def test_production_primary_shape_is_extrapolated_from_the_262k_calibration():
    shape = {
        "runtime": "vllm",
        "devices": [{"name": "r9700-0", "memory": CARD}, {"name": "r9700-1", "memory": CARD}],
        "tensor_parallel": 2,
        "max_model_len": 200_704,
        "max_num_seqs": 3,
        "kv_cache_dtype": "fp8",
        "kv_cache_memory_bytes": 3.15e9,
        "gpu_memory_utilization": 0.98,
        "calibration": FP8_CALIBRATION,
    }
    result = price(shape)
    assert result.kv["basis"] == "extrapolated"
    assert 200_704 <= result.kv["tokens"] <= 3 * 200_704
    assert result.client["context_window"] == 155_648


def test_slot_grid_on_the_3090():
    boots = [{"slots": 1, "used": "11,996 MiB"}, {"slots": 4, "used": "22,346 MiB"}]
    fixed, per_slot, ceiling = slot_ceiling(boots, 24_576 * MIB, 0)
    assert per_slot == 3_450 * MIB
    assert fixed == 8_546 * MIB
    assert ceiling == 4


def test_slot_count_beyond_the_ceiling_is_refused(tmp_path):
    model = write_gguf(tmp_path / "m.gguf")
    shape = {
        "runtime": "llamacpp",
        "devices": [{"name": "rtx3090", "memory": "24,576 MiB"}],
        "model": str(model),
        "ctx_size": 5 * 4096,
        "parallel": 5,
        "free_floor": 0,
        "slot_calibration": {"boots": [{"slots": 1, "used": "11,996 MiB"}, {"slots": 4, "used": "22,346 MiB"}]},
    }
    result = price(shape)
    slots = verdict(result, "slot_ceiling")
    assert not slots.ok
    assert slots.overage_mib == 8_546 + 5 * 3_450 - 24_576
    shape["parallel"] = 4
    assert verdict(price(shape), "slot_ceiling").ok


def test_layer_split_moves_whole_layers_and_output_goes_last():
    placement = assign_layers(10, 2, [1, 1])
    assert placement[-1] == 1  # output layer
    assert placement[:10] == sorted(placement[:10])
    assert placement.count(0) in (5, 6)
    lopsided = assign_layers(10, 2, [3, 1])
    assert lopsided.count(0) > lopsided.count(1)


def test_n_gpu_layers_keeps_the_first_layers_and_their_kv_in_host_ram():
    # llama.cpp offloads the LAST n_gpu_layers of the n_layer + 1 (the output counts as one).
    assert assign_layers(10, 1, None, 4) == [HOST] * 7 + [0] * 4
    assert assign_layers(10, 2, [1, 1], 0) == [HOST] * 11
    geometry = {"n_layer": 10, "n_head_kv": 2, "head_dim": 32, "layer_bytes": "10 MiB", "output_bytes": "5 MiB"}
    shape = {"runtime": "llamacpp", "devices": [{"name": "gpu0", "memory": "1 GiB"}], "model_geometry": geometry, "ctx_size": 4096}
    full = price(shape)
    partial = price({**shape, "n_gpu_layers": 4})
    weights = {t.name: t.bytes for t in partial.devices[0].terms}["weights"]
    assert weights == 3 * 10 * MIB + 5 * MIB  # three layers and the output on the card
    host = {t.name: t.bytes for t in partial.host_terms}
    assert host["host_layers"] == 7 * 10 * MIB
    card_kv = {t.name: t.bytes for t in partial.devices[0].terms}["kv"]
    assert card_kv + host["host_kv"] == {t.name: t.bytes for t in full.devices[0].terms}["kv"]
    assert card_kv * 7 == host["host_kv"] * 3
    assert any("n_gpu_layers 4" in note for note in partial.notes)


def test_llamacpp_ledger_per_device_with_split_drafter_and_projector(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", n_layer=4, n_embd=64, n_head=2, n_head_kv=1)
    drafter = write_gguf(tmp_path / "d.gguf", n_layer=1, n_embd=64, n_head=2, n_head_kv=2)
    shape = {
        "runtime": "llamacpp",
        "devices": [{"name": "gpu0", "memory": "64 MiB"}, {"name": "gpu1", "memory": "64 MiB"}],
        "model": str(model),
        "drafter": str(drafter),
        "projector_bytes": "3 MiB",
        "ctx_size": 8192,
        "parallel": 2,
        "tensor_split": [1, 1],
        "compute_buffer": ["10 MiB", "12 MiB"],
        "extra_terms": [{"name": "reserve", "size": "1 MiB", "device": "gpu1"}],
        "free_floor": "1 MiB",
        "max_device_gap": "64 MiB",
    }
    result = price(shape)
    gpu0, gpu1 = result.devices
    names0 = [t.name for t in gpu0.terms]
    names1 = [t.name for t in gpu1.terms]
    assert names0 == ["weights", "kv", "compute", "projector"]
    assert names1 == ["weights", "kv", "compute", "drafter_weights", "drafter_kv", "reserve"]
    # The drafter has no sliding window: it caches the full target window.
    drafter_kv = next(t for t in gpu1.terms if t.name == "drafter_kv")
    assert drafter_kv.bytes == 8192 * 1 * 2 * 32 * 2 * 2
    kv_total = sum(t.bytes for d in result.devices for t in d.terms if t.name == "kv")
    assert kv_total == result.kv["total_bytes"]
    assert result.host_terms[0].name == "input_embeddings"


def test_cache_ram_must_hold_a_slot_and_stay_under_half_the_host(tmp_path):
    model = write_gguf(tmp_path / "m.gguf")
    shape = {
        "runtime": "llamacpp",
        "devices": [{"name": "gpu0", "memory": "1 GiB"}],
        "model": str(model),
        "ctx_size": 65_536,
        "parallel": 2,
        "cache_ram": "1 MiB",
        "host_ram": "1 MiB",
    }
    result = price(shape)
    # An attention-only model: the full-slot rule does not apply (seeds/001: "Gemma4 is not a
    # DeltaNet model, so the" ">12.8 GiB CACHE_RAM floor does not apply"); half the host still does.
    assert verdict(result, "cache_ram_holds_slot").ok
    assert "recurrent hybrids" in verdict(result, "cache_ram_holds_slot").message
    assert not verdict(result, "cache_ram_half_host").ok
    shape.update(cache_ram="8 MiB", host_ram="64 GiB")
    result = price(shape)
    assert verdict(result, "cache_ram_holds_slot").ok and verdict(result, "cache_ram_half_host").ok


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"type_k": "f12"}, "type_k"),
        ({"ctx_size": -1}, "ctx_size"),
        ({"ctx_size": "lots"}, "ctx_size"),
        ({"free_floor": "-1 GiB"}, "free_floor"),
        ({"free_floor": "one gig"}, "free_floor"),
        ({"devices": []}, "devices"),
        ({"devices": [{"name": "x", "memory": "12 parsecs"}]}, "devices[0].memory"),
        ({"runtime": "tgi"}, "runtime"),
        ({"tensor_split": [1, 1, 1]}, "tensor_split"),
        ({"compute_buffer": "-3 MiB"}, "compute_buffer"),
    ],
)
def test_bad_llamacpp_inputs_are_refused_naming_the_field(tmp_path, patch, field):
    model = write_gguf(tmp_path / "m.gguf")
    shape = {"runtime": "llamacpp", "devices": [{"name": "gpu0", "memory": "1 GiB"}], "model": str(model), "ctx_size": 4096}
    shape.update(patch)
    with pytest.raises(ShapeError, match="^" + re.escape(field)):
        price(shape)


def test_bad_vllm_inputs_are_refused_naming_the_field():
    shape = primary_rank_shape("14.31 GiB")
    shape["kv_cache_dtype"] = "int3"
    with pytest.raises(ShapeError, match="^kv_cache_dtype"):
        price(shape)
    shape = primary_rank_shape("14.31 GiB")
    shape["tensor_parallel"] = 2
    with pytest.raises(ShapeError, match="^tensor_parallel"):
        price(shape)
    shape = primary_rank_shape("14.31 GiB")
    shape["calibration"] = [{"kv_dtype": "fp8", "max_model_len": 1}]
    with pytest.raises(ShapeError, match=r"^calibration\[0\]"):
        price(shape)


def test_table_lists_every_term_and_verdict():
    text = render_table(price(primary_rank_shape("16.65 GiB")))
    for word in ("weights", "kv_pool", "graphs", "expert_arena", "non_torch", "[FAIL] free_floor", "fits: NO"):
        assert word in text
