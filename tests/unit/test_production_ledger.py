"""The production ledgers against the fleet's own readings (shared/seeds): vLLM's utilization
rule on frank-primary's served bf16 incumbent, and the terms the seeds say the other ledgers miss.
Every expected figure is quoted from a seed line or follows from one by vLLM's rule
(vllm/v1/worker/gpu_worker.py Worker.determine_available_memory: what the KV cache (or, in the
expert-offload fork, the arena) gets is total x gpu_memory_utilization less the non-KV peak)."""

import pathlib

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB, parse_size

# seeds/000: "16.65 (precise overhead 5.25) + non-torch 1.45 = 31.73 of 31.86 GiB -> ~0.13"
CARD = parse_size("31.86 GiB")
# seeds/000: "unquantized (auto), no speculative decode, KV_BYTES 11,047,010,304/rank"
INCUMBENT_POOL = 11_047_010_304
# seeds/000: "(engine-measured 798,280 tokens, 3.05x concurrency at 262,144-token"
INCUMBENT_TOKENS = 798_280
# seeds/000: "weights 6.28 + pool 6.80 (bf16 2 x 262144) + graphs 0.55 + arena"
WEIGHTS, GRAPHS = parse_size("6.28 GiB"), parse_size("0.55 GiB")
NON_TORCH = parse_size("1.45 GiB")  # "16.65 (precise overhead 5.25) + non-torch 1.45 = 31.73 of 31.86 GiB"
# seeds/000: "(7.60 GiB = fitted + compile/graph-capture headroom). It moves only the plan's"
OVERHEAD = parse_size("7.60 GiB")


def incumbent(**changes):
    """frank-primary's bf16 incumbent as the production inventory of that era priced it: the
    tcclaviger fork, TP=2, expert offload at the default overhead, the pool pinned."""
    shape = {
        "runtime": "vllm",
        "max_model_len": 262_144,
        "max_num_seqs": 3,
        "kv_cache_dtype": "auto",
        "kv_cache_memory_bytes": INCUMBENT_POOL,
        "max_num_batched_tokens": 1024,  # "requests), MNBT 1024, MoE gather 32x64 (+18.7% decode, grows with depth)."
        "tensor_parallel": 2,
        # seeds/000: "of workspace with the pool ask unchanged; measured KV capacity law" after
        # "pinned-expert path holds ~0.8 GiB/rank more. Util 0.90 returns ~2.5 GiB/rank"
        "gpu_memory_utilization": 0.90,
        "expert_offload": True,
        "weights_per_rank": WEIGHTS,
        "graph_memory": GRAPHS,
        "non_torch_memory": NON_TORCH,
        "runtime_overhead": OVERHEAD,
        # seeds/004: "14.87 GiB / 6,496 slots. The 6.1e9 -> 3.15e9 pool cut bought zero arena and"
        # at 200704 and the default overhead, on a boot at "util capped at 0.982 (never 1.00)"
        # (the fleet's 0.98 of those boots).
        "expert_arena_calibration": {"max_model_len": 200_704, "runtime_overhead": OVERHEAD, "arena": "14.87 GiB", "gpu_memory_utilization": 0.98},
        "free_floor": "0.5 GiB",
        "calibration": [{"kv_dtype": "bf16", "max_model_len": 262_144, "pool_bytes": INCUMBENT_POOL, "tokens": INCUMBENT_TOKENS}],
    }
    shape.update(changes)
    return shape


DEVICES = [{"name": "r9700-0", "memory": CARD}, {"name": "r9700-1", "memory": CARD}]


def price(shape):
    return price_shape(shape, [dict(device) for device in DEVICES])


def term(result, name, device=0):
    return sum(t.bytes for t in result.devices[device].terms if t.name == name)


def test_the_served_bf16_incumbent_fits_at_util_090_with_the_engine_measured_tokens():
    result = price(incumbent())
    assert result.fits, [v.message for v in result.failures]
    assert result.kv["tokens"] == INCUMBENT_TOKENS
    assert result.kv["concurrency"] == 3.05  # "(engine-measured 798,280 tokens, 3.05x concurrency at 262,144-token"
    assert result.devices[0].free >= parse_size("0.5 GiB")


@pytest.mark.parametrize("util", [0.85, 0.93, 0.95])
def test_a_util_change_moves_the_arena_and_free_by_total_times_delta(util):
    """A utilization nobody typed into the code: the ledger must follow vLLM's rule, not a figure."""
    base, moved = price(incumbent()), price(incumbent(gpu_memory_utilization=util))
    expected = CARD * (util - 0.90)
    assert abs((term(moved, "expert_arena") - term(base, "expert_arena")) - expected) <= 2
    assert abs((base.devices[0].free - moved.devices[0].free) - expected) <= 2
    # The pinned pool never moves (vLLM uses --kv-cache-memory-bytes as given).
    assert moved.kv["tokens"] == INCUMBENT_TOKENS


def test_the_util_098_root_boot_that_died_at_kv_allocation_is_refused():
    # seeds/000: "The 0.98 boot died at KV allocation: torch OOM tried 10.28 GiB (the exact" /
    # "3x262144 bf16 pool = 11,047,010,304 bytes) with 9.46 GiB free per rank.": 0.82 GiB short.
    # At 0.98 the arena takes the 0.08 x card back that 0.90 left free, and the card is over.
    at_098 = price(incumbent(gpu_memory_utilization=0.98))
    at_090 = price(incumbent())
    assert at_090.devices[0].free - at_098.devices[0].free == pytest.approx(0.08 * CARD, abs=2)
    assert not at_098.fits
    over = next(v for v in at_098.failures if v.rule == "fits")
    assert over.overage_mib > (10.28 - 9.46) * 1024 * 0.5


def test_an_arena_boot_without_its_utilization_is_refused_naming_the_field():
    shape = incumbent(expert_arena_calibration={"max_model_len": 200_704, "runtime_overhead": OVERHEAD, "arena": "14.87 GiB"})
    with pytest.raises(ShapeError, match=r"expert_arena_calibration\.gpu_memory_utilization"):
        price(shape)


@pytest.mark.parametrize("util", [0.90, 0.87])
def test_without_a_pinned_pool_the_kv_pool_is_total_times_util_less_the_non_kv_peak(util):
    """No --kv-cache-memory-bytes, no expert offload: determine_available_memory's own rule, and
    the tokens follow the measured bf16 price (798,280 tokens at 11,047,010,304 B)."""
    shape = incumbent(gpu_memory_utilization=util, kv_cache_memory_bytes=None, expert_offload=False, expert_arena_calibration=None)
    result = price(shape)
    pool = int(CARD * util) - WEIGHTS - GRAPHS - OVERHEAD - NON_TORCH
    assert abs(term(result, "kv_pool") - pool) <= 1
    assert abs(result.kv["tokens"] - pool * INCUMBENT_TOKENS / INCUMBENT_POOL) <= 1
    assert result.kv["basis"] == "measured"


def precise_200704(**changes):
    """frank-primary's live shape of seed 004 (the 1ac4d48 deploy), as the production inventory of
    that era typed it: fp8 3 x 200,704, KV_BYTES 3.15e9/rank, precise overhead, util 0.98."""
    shape = incumbent(
        max_model_len=200_704,
        kv_cache_dtype="fp8",
        kv_cache_memory_bytes=3_150_000_000,  # "-- the probe's projection is now production." / "pool 3,150,000,000, MNBT 1024"
        gpu_memory_utilization=0.98,
        expert_precise_memory=True,
        precise_runtime_overhead="5.25 GiB",  # "runtime overhead 7.60 -> 5.25 GiB (precise gfx1201 TP2 registry)"
        graph_memory="0.31 GiB",  # "the engine's own post-capture line reports 0.31 GiB"
        calibration=[{"kv_dtype": "fp8", "max_model_len": 200_704, "pool_bytes": 3_150_000_000, "tokens": 398_658}],
    )
    shape.update(changes)
    return shape


def test_frank_primary_under_load_keeps_no_more_than_total_times_one_minus_util_free():
    result = price(precise_200704())
    # "5.25 GiB, expert cache space 17.22 GiB / 7522 slots, swap region 13.7 GiB /"
    assert abs(term(result, "expert_arena") - parse_size("17.22 GiB")) < parse_size("0.01 GiB")
    assert result.kv["tokens"] == 398_658  # "5986 slots, GPU KV cache 398,658 tokens / 1.99x, pool 3,150,000,000, MNBT 1024"
    # The boot ledger alone leaves the 3.67 GiB the engine's budget never lets the card keep.
    assert result.devices[0].free > parse_size("3.5 GiB")
    serving = result.kv["serving_free_mib"]["r9700-0"] * 2**20
    # seeds/004: "Driver used 30.97 of 31.86 GiB; the 0.89 GiB/card margin held through a live"
    live_free = parse_size("31.86 GiB") - parse_size("30.97 GiB")
    # The rule is a bound (the card never keeps more than total x (1 - util) under load); the
    # rest of the live margin is the planner's graph estimate (0.55 GiB) above the measured 0.31.
    assert serving == pytest.approx(0.02 * CARD, abs=2**20)
    assert serving <= live_free < serving + parse_size("0.3 GiB")
    assert any(note.startswith("serving:") for note in result.notes)


def production_shape(endpoint):
    path = pathlib.Path(__file__).resolve().parents[2] / "inventories" / "production" / "host_vars" / f"{endpoint}.yml"
    host_vars = yaml.safe_load(path.read_text(encoding="utf-8"))
    return host_vars["endpoint_shape"], host_vars["endpoint_devices"]


def test_frank_zealot_prices_the_driver_reserve_and_misses_only_on_the_seeds_rounded_weights():
    shape, devices = production_shape("frank-zealot")
    card = price_shape(shape, devices).devices[0]
    terms = {t.name: t.bytes for t in card.terms}
    # seeds/004: "Deploy verified: nvidia-smi 21,436 MiB used / 2,689 free at ubatch 2048 -"
    used, free = 21_436 * MIB, 2_689 * MIB
    assert terms["driver_reserved"] == card.capacity - used - free  # the free-field law: 451 MiB
    # "verbosity-4 ledger confirms the KV law to the MiB (CUDA0 KV buffer" / "12,544.00 MiB"
    assert terms["kv"] == 12_544 * MIB
    # "401,408 pool), compute buffers 1,136 MiB CUDA0 + 848 MiB host, mmproj" / "879 + 248 MiB"
    assert terms["compute"] == 1_136 * MIB and terms["projector"] == (879 + 248) * MIB
    # Every term the engine printed is exact, so the whole miss is the weights' "~7 GiB"
    # (which carries the host-resident input embedding): the card keeps 539 MiB more free than priced.
    assert free - card.free == terms["weights"] - (used - terms["kv"] - terms["compute"] - terms["projector"]) == 539 * MIB


def test_a_vllm_shape_without_weights_is_refused_not_priced_free():
    # The llama.cpp-era frank-large was priced with no weights at all ("63.9 GiB free" on a host
    # serving an 87.3 GiB model); a vLLM card without weights_per_rank or weights is the same hole.
    shape = incumbent(weights_per_rank=None)
    result = price(shape)
    assert not result.fits
    refusal = next(v for v in result.failures if v.rule == "weights")
    assert "weights_per_rank" in refusal.message
    assert price(incumbent()).fits  # the same shape with its weights is priced
