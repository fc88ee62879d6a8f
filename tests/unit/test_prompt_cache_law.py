"""The --cache-ram law against seeds/001 (Swift-Qwen3.8-27B, 2 x 196,608, in-file MTP) and the
Gemma4 exemption."""

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import KIB, MIB

# seeds/001: "16 full-attention layers x 4 kv" / "heads x 256 dim x 2 B x 2 for K/V, plus the MTP draft context's 4096 B"
# A DeltaNet hybrid with one in-file MTP layer. The layer total is not in the seeds (16 full of 64 is
# assumed); the per-token state law depends only on the 16 full layers, the slot rule on "recurrent".
SWIFT_27B = {
    "n_layer": 64,
    "n_head_kv": 4,
    "head_dim": 256,
    "layer_kinds": ["full" if (il + 1) % 4 == 0 else "recurrent" for il in range(64)],
    "recurrent_state_bytes": 0,  # the seeds give no DeltaNet state size; the seed's law is per token
    "nextn_layers": 1,
}


def swift(cache_ram, geometry=None):
    shape = {
        "runtime": "llamacpp",
        "model_geometry": geometry or SWIFT_27B,
        "ctx_size": 393_216,  # 2 x 196,608: seeds/001 "a FULL 196608-token slot"
        "parallel": 2,
        "type_k": "f16",
        "type_v": "f16",
        "cache_ram": cache_ram,
        "host_ram": "128 GiB",
    }
    return price_shape(shape, [{"name": "r9700-0", "memory": "31.86 GiB"}, {"name": "r9700-1", "memory": "31.86 GiB"}])


def holds_slot(result):
    return next(v for v in result.verdicts if v.rule == "cache_ram_holds_slot")


def test_state_law_is_68_kib_per_token_with_the_mtp_draft_context():
    # seeds/001: "The state law at this shape is 68 KiB/token"
    assert swift("16384 MiB").kv["prompt_state_per_token"] == 68 * KIB


def test_12800_mib_cannot_hold_a_full_196608_token_slot():
    # seeds/001: "a FULL 196608-token slot" / "state (~12.8 GiB)": 196,608 x 68 KiB = 13,056 MiB
    result = swift("12800 MiB")
    verdict = holds_slot(result)
    assert not verdict.ok
    assert verdict.overage_mib == pytest.approx(13_056 - 12_800, abs=0.1)
    assert result.kv["per_slot_state_bytes"] == 196_608 * 68 * KIB


def test_16384_mib_holds_it():
    # seeds/001: "16384 holds ~240k: a FULL 196608-token slot" ... "now fits with ~3 GiB spare"
    result = swift("16384 MiB")
    assert holds_slot(result).ok
    assert (16_384 * MIB - result.kv["per_slot_state_bytes"]) / MIB == pytest.approx(3 * 1024, rel=0.11)


@pytest.mark.parametrize(("cap", "held"), [("8192 MiB", 120_000), ("16384 MiB", 240_000)])
def test_tokens_held(cap, held):
    # seeds/001: "8192 MiB held ~120k tokens and 16384 holds ~240k"
    assert swift(cap).kv["cache_ram_tokens_held"] == pytest.approx(held, rel=0.03)


def test_8192_mib_refused_as_in_production():
    # seeds/001: "firing in production: 137 times ... at 11.0-11.4" GiB per state: the 8192 cap
    assert not holds_slot(swift("8192 MiB")).ok


def test_without_the_mtp_layer_the_state_is_64_kib_per_token():
    geometry = {**SWIFT_27B, "nextn_layers": 0}
    assert swift("16384 MiB", geometry).kv["prompt_state_per_token"] == 64 * KIB


def test_gemma4_2048_mib_is_not_held_to_the_full_slot_rule():
    # seeds/001: "Cap it at 2048 to" "give back ~6 GiB of LPDDR. Gemma4 is not a DeltaNet model, so the"
    # ">12.8 GiB CACHE_RAM floor does not apply."
    kinds = ["full" if (il + 1) % 6 == 0 else "swa" for il in range(30)]
    gemma = {"n_layer": 30, "n_head_kv": 8, "head_dim": 256, "layer_kinds": kinds, "sliding_window": 1024}
    result = price_shape(
        {"runtime": "llamacpp", "model_geometry": gemma, "ctx_size": 262_144, "parallel": 1, "cache_ram": "2048 MiB"},
        [{"name": "rtx3090", "memory": "24,576 MiB"}],
    )
    verdict = holds_slot(result)
    assert verdict.ok and "recurrent hybrids" in verdict.message
    assert result.kv["per_slot_state_bytes"] > 2048 * MIB  # it would fail the rule if the rule applied
