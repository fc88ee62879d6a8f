"""vLLM laws against the fleet's recorded boots (shared/seeds): the one-sided pool law and the
expert arena law. Every expected figure is quoted from a seed line."""

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.expert_arena import (
    ArenaCalibration,
    plan_arena,
    planner_overhead,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, MIB, parse_size

CARD = "31.86 GiB"
SLOT = parse_size("2.344 MiB")  # seeds/004: "expert cache space 14.87 GiB / 6,496 slots of 2.344 MiB"
DEFAULT_OVERHEAD = parse_size("7.60 GiB")  # seeds/004: "runtime overhead 7.60 -> 5.25 GiB (precise gfx1201 TP2 registry)"
PRECISE_OVERHEAD = parse_size("5.25 GiB")
# seeds/004, the engine's own line of the c769ff2 boot: "expert cache space 14.87 GiB / 6,496 slots of 2.344 MiB" at 200704, no precise-memory
BOOT_200704 = ArenaCalibration(200_704, DEFAULT_OVERHEAD, parse_size("14.87 GiB"))
# seeds/004: "expert cache space 17.22 GiB / 7522 slots" with 'expert_precise_memory': True, still 200704
BOOT_200704_PRECISE = ArenaCalibration(200_704, PRECISE_OVERHEAD, parse_size("17.22 GiB"))


def rank_shape(**changes):
    """frank-primary, one rank of the qwen3.8-flash-next FP8 fork (seeds/000 ledger terms)."""
    shape = {
        "runtime": "vllm",
        "tensor_parallel": 1,
        "max_model_len": 262_144,
        "max_num_seqs": 3,
        "kv_cache_dtype": "fp8",
        "kv_cache_memory_bytes": 6_100_000_000,
        "gpu_memory_utilization": 0.98,
        "expert_offload": True,
        "weights_per_rank": "6.28 GiB",
        "graph_memory": "0.55 GiB",
        "non_torch_memory": "1.45 GiB",
        "runtime_overhead": "7.60 GiB",
        "precise_runtime_overhead": "5.25 GiB",
        "expert_slot_bytes": "2.344 MiB",
        "expert_arena_calibration": {"max_model_len": 200_704, "runtime_overhead": "7.60 GiB", "arena": "14.87 GiB", "gpu_memory_utilization": 0.98},
        "free_floor": "0.5 GiB",
        "calibration": [
            # seeds/004: "MAXLEN 262144 (6.1e9 -> 792,069 tokens) but 7,892 at 200704 (3.146e9 ->" / "398,658)"
            {"kv_dtype": "fp8", "max_model_len": 262_144, "pool_bytes": 6_100_000_000, "tokens": 792_069},
            {"kv_dtype": "fp8", "max_model_len": 200_704, "pool_bytes": 3_146_000_000, "tokens": 398_658},
            # seeds/000: "bf16 measures 13,839 B/token (bf16 3x241664 boot: 11,047,010,304 B -> 798,280"
            {"kv_dtype": "bf16", "max_model_len": 262_144, "pool_bytes": 11_047_010_304, "tokens": 798_280},
        ],
    }
    shape.update(changes)
    return shape


def price(shape):
    return price_shape(shape, [{"name": "r9700-0", "memory": CARD}])


def pool_law(result):
    return next(v for v in result.verdicts if v.rule == "pool_law")


# --- the pool law ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seqs", "dtype", "pool", "quote"),
    [
        (3, "fp8", 6_100_000_000, "seeds/000: 'fp8 3 x 262144 / MNBT 2048 / 792,069 tokens / 3.02x'"),
        (4, "fp8", 8_311_013_376, "seeds/000: '4-slot boot 8,311,013,376 B -> 1,079,582 tokens'"),
        (3, "bf16", 11_047_010_304, "seeds/000: 'bf16 3x241664 boot: 11,047,010,304 B -> 798,280'"),
    ],
)
def test_vllm_pool_may_exceed_seqs_times_len(seqs, dtype, pool, quote):
    result = price(rank_shape(max_num_seqs=seqs, kv_cache_dtype=dtype, kv_cache_memory_bytes=pool))
    law = pool_law(result)
    assert law.ok, (quote, law.message)
    assert result.kv["tokens"] > seqs * 262_144 or dtype == "bf16"


def test_fp8_3x262144_pool_prices_792069_tokens_3_02x():
    # seeds/000: "792,069 tokens / 3.02x / arena 6,248)"
    result = price(rank_shape())
    assert result.kv["tokens"] == 792_069
    assert result.kv["concurrency"] == 3.02


def test_pool_below_one_window_is_still_refused():
    result = price(rank_shape(kv_cache_memory_bytes="1 GiB"))
    law = pool_law(result)
    assert not law.ok and law.term == "kv_pool" and law.overage_mib > 0


def test_concurrency_is_never_extrapolated_silently():
    # seeds/004: "7,701 B/token at MAXLEN 262144 (6.1e9 -> 792,069 tokens) but 7,892 at 200704" -
    # "Never extrapolate a concurrency figure across geometries."
    shape = rank_shape(max_model_len=200_704, kv_cache_memory_bytes=3_150_000_000)
    shape["calibration"] = [shape["calibration"][0]]
    result = price(shape)
    assert result.kv["basis"] == "extrapolated"
    assert any("re-measure" in note for note in result.notes)


def test_measured_200704_boot_gives_398658_tokens_1_99x():
    # seeds/004: "GPU KV cache size: 398,658 tokens," / "Maximum concurrency for 200,704 tokens per request: 1.99x"
    result = price(rank_shape(max_model_len=200_704, kv_cache_memory_bytes=3_146_000_000))
    assert result.kv["basis"] == "measured"
    assert result.kv["tokens"] == 398_658
    assert result.kv["concurrency"] == 1.99


# --- the expert arena law ------------------------------------------------------------------------


def arena(max_model_len, overhead, calibration):
    return plan_arena(budget=0, non_expert=0, graphs=0, overhead=overhead, max_model_len=max_model_len, slot_bytes=SLOT, calibration=calibration)


@pytest.mark.parametrize(
    ("max_model_len", "overhead", "calibration", "gib", "slots", "quote"),
    [
        (262_144, DEFAULT_OVERHEAD, BOOT_200704, 14.30, 6_248, "seeds/004: '262144 -> 14.30 GiB / 6,248 slots; 200704 ->'"),
        (200_704, PRECISE_OVERHEAD, BOOT_200704, 17.22, 7_522, "seeds/004: 'expert cache space 17.22 GiB / 7522 slots'"),
        (200_704, DEFAULT_OVERHEAD, BOOT_200704_PRECISE, 14.87, 6_496, "seeds/004: 'expert cache space 14.87 GiB / 6,496 slots of 2.344 MiB'"),
        (262_144, PRECISE_OVERHEAD, BOOT_200704, 16.65, None, "seeds/000: 'arena 16.65 (precise overhead 5.25)'"),
        (262_144, DEFAULT_OVERHEAD, BOOT_200704_PRECISE, 14.31, None, "seeds/000: 'restores the 7.60 GiB default overhead: arena 14.31 GiB,'"),
    ],
)
def test_arena_reproduces_the_seed_boots_within_1_percent(max_model_len, overhead, calibration, gib, slots, quote):
    plan = arena(max_model_len, overhead, calibration)
    assert plan.arena_bytes / GIB == pytest.approx(gib, rel=0.01), quote
    if slots is not None:
        assert plan.slots == pytest.approx(slots, rel=0.01), quote


def test_pool_cut_buys_zero_arena():
    # seeds/004: "The 6.1e9 -> 3.15e9 pool cut bought zero arena and"
    big = price(rank_shape(kv_cache_memory_bytes=6_100_000_000)).kv["arena_bytes"]
    small = price(rank_shape(kv_cache_memory_bytes=3_150_000_000)).kv["arena_bytes"]
    assert big == small


def test_arena_formula_from_the_budget_sits_within_1_5_percent_of_the_boot():
    # seeds/004: "The arena is budget - non-expert - KV reserve - graphs - overhead"; util 0.98, no calibration:
    # the uncalibrated formula overprices the 14.87 GiB boot by ~1.4% (an upper bound on the arena).
    shape = rank_shape(max_model_len=200_704, expert_arena_calibration=None)
    result = price(shape)
    assert result.kv["arena_basis"] == "formula"
    assert result.kv["arena_bytes"] / GIB == pytest.approx(14.87, rel=0.015)
    assert result.kv["arena_bytes"] >= parse_size("14.87 GiB")


def test_mnbt_up_to_4096_costs_the_arena_nothing_and_above_costs_0_22_gib_per_1024():
    # seeds/000: "Overhead adds 0.22 GiB/1024 nbt above 4096, so" / "MNBT 2048 pays nothing."
    assert planner_overhead(DEFAULT_OVERHEAD, 1024) == planner_overhead(DEFAULT_OVERHEAD, 2048) == planner_overhead(DEFAULT_OVERHEAD, 4096) == DEFAULT_OVERHEAD
    assert (planner_overhead(DEFAULT_OVERHEAD, 8192) - DEFAULT_OVERHEAD) / GIB == pytest.approx(0.88, abs=0.001)


def test_graph_estimate_is_256_mib_plus_52_per_graph():
    # seeds/004: "the fork charges an analytic 256 MiB + 52 MiB/graph = 0.55 GiB" (6 graphs)
    result = price(rank_shape(graph_memory=None, graph_captures=6))
    graphs = next(t for t in result.devices[0].terms if t.name == "graphs")
    assert graphs.bytes / GIB == pytest.approx(0.55, abs=0.005)


# --- the per-card ledger ----------------------------------------------------------------------


def test_precise_bf16_2x262144_ledger_31_73_of_31_86():
    # seeds/000: "weights 6.28 + pool 6.80 (bf16 2 x 262144) + graphs 0.55 + arena" / "16.65 (precise overhead 5.25)
    # + non-torch 1.45 = 31.73 of 31.86 GiB -> ~0.13" GiB free
    result = price(rank_shape(max_num_seqs=2, kv_cache_dtype="auto", kv_cache_memory_bytes=7_300_000_000, expert_precise_memory=True))
    card = result.devices[0]
    assert [t.name for t in card.terms] == ["weights", "kv_pool", "graphs", "expert_arena", "non_torch"]
    assert card.used / GIB == pytest.approx(31.73, rel=0.01)
    assert card.free / GIB == pytest.approx(0.13, abs=0.01 * 31.86)
    floor = next(v for v in result.verdicts if v.rule == "free_floor")
    assert not floor.ok  # 0.13 GiB cannot carry graph capture's transient allocations


def test_default_overhead_bf16_2x262144_ledger_leaves_about_2_4_gib():
    # seeds/000: "Dropping the flag restores the 7.60 GiB default overhead: arena 14.31 GiB," / "total ~29.4 GiB, ~2.4 GiB free."
    result = price(rank_shape(max_num_seqs=2, kv_cache_dtype="auto", kv_cache_memory_bytes=7_300_000_000))
    card = result.devices[0]
    assert card.used / GIB == pytest.approx(29.4, rel=0.01)
    assert card.free / GIB == pytest.approx(2.4, abs=0.05)
    assert result.fits


def test_arena_without_overhead_falls_back_to_the_budget_remainder_and_says_so():
    result = price(rank_shape(runtime_overhead=0, expert_arena_calibration=None))
    assert any("remainder of the budget" in note for note in result.notes)
    assert result.devices[0].used == int(parse_size(CARD) * 0.98)


def test_arena_slots_report_in_the_kv_facts():
    result = price(rank_shape(max_model_len=200_704, kv_cache_memory_bytes=3_150_000_000))
    # seeds/004: "expert cache space 14.87 GiB / 6,496 slots of 2.344 MiB" (the calibration boot itself)
    assert result.kv["arena_slots"] == 6_496
    assert result.kv["arena_gib"] == 14.87
    assert result.kv["kv_reserve_bytes"] == 9190 * 200_704
    assert abs(result.kv["arena_bytes"] - parse_size("14.87 GiB")) < MIB
