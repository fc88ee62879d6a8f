"""The replay suite: every shape the fleet's recorded history served or lost (seed_cases.yml),
priced by the budget gate and judged against what really happened.

- every quote is verbatim in its seed file (one line, grep -F);
- a served case the gate can price passes, and each figure the gate predicts (KV tokens,
  concurrency, expert arena and slots) is within 1% of the measured one;
- every per-card used and free figure (replay_cases.py, `FULL_CARD`) is compared within 1% of the
  measured figure itself, or skipped with the terms the seeds do not give for it; a compared figure
  that misses is a strict expected failure naming the term the ledger lacks (full_card_terms.yml);
- a failed or refused case the gate can price is refused for the seeds' reason, unless the case
  records that no pre-deploy budget can know it (gate_can_know: false, why) or that its rule
  belongs to the known-bad-shape rules of the engine command line, not to the budget.
A case the gate cannot price (the seeds do not give a field it needs) is skipped, and the skip
reason names the missing field.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from replay_cases import (
    CASES,
    FULL_CARD_TERMS,
    HERE,
    PAYLOAD_TERMS,
    TOLERANCE,
    Unpriced,
    all_full_card_figures,
    case_shape,
    expected_miss_keys,
    price,
)

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import graph_law, kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import geometry_from_dict
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.llamacpp import DRAFT_CACHE_TYPE
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, MIB, parse_size

EXPECTED_CASES = 111
EXPECTED_FIGURES = 427
# Per-card used and free readings the seeds give (replay_cases.FULL_CARD), and the cases holding them.
EXPECTED_FULL_CARD_FIGURES = 96
EXPECTED_FULL_CARD_CASES = 51

# The budget verdicts that carry each failure rule of the seeds.
BUDGET_RULES = {
    "free_floor": {"free_floor", "fits", "device_gap"},
    "oom_graph_capture": {"free_floor", "fits"},
    "runtime_oom": {"free_floor", "fits"},
    "slot_ceiling": {"slot_ceiling"},
    "cache_ram": {"cache_ram_holds_slot", "cache_ram_half_host"},
}
# llama.cpp's own KV figures (the `llama_kv_cache` / KV buffer lines) and the law's names for them.
LLAMACPP_KV_FIGURES = {"kv_buffer": "total_bytes", "kv_k": "k_bytes", "kv_v": "v_bytes", "kv_bytes_per_token": "bytes_per_token_full", "kv_cells": "n_ctx"}
# Rules a pre-deploy gate can know, but from the engine command line's known-bad shapes
# (runtimes/llamacpp.py), not from memory arithmetic.
ARGV_RULES = {"compile_seqs2", "spec_chain", "draft_depth"}
# Failure rules the typed shape itself refuses (shape/model.py), and the field its error names.
SHAPE_RULES = {"kv_dtype_illegal": "kv_cache_dtype", "spec_chain": "spec_type: ", "draft_depth": "draft_max: "}


def seeds_dir() -> Path | None:
    root = HERE.parent.parent
    for candidate in (os.environ.get("LLM_FLEET_SEEDS"), root / "shared" / "seeds", root.parent / "shared" / "seeds"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


SEEDS = seeds_dir()


def seed_lines(name: str) -> list[str]:
    assert SEEDS is not None
    return (SEEDS / name).read_text(encoding="utf-8").splitlines()


def test_suite_size():
    figures = sum(len(case["measured"]) for case in CASES)
    print(f"replay suite: {len(CASES)} cases, {figures} measured figures")
    assert len(CASES) == EXPECTED_CASES
    assert figures == EXPECTED_FIGURES
    assert len({case["id"] for case in CASES}) == len(CASES)


def all_quotes():
    for case in CASES:
        yield pytest.param(case["seed"]["file"], case["seed"]["quote"], id=f"{case['id']}-seed")
        for index, figure in enumerate(case["measured"]):
            yield pytest.param(figure.get("file", case["seed"]["file"]), figure["quote"], id=f"{case['id']}-{index}-{figure['what']}")
    for model, terms in PAYLOAD_TERMS.items():
        for index, boot in enumerate(terms.get("kv_boots", []) + terms.get("arena_boots", [])):
            yield pytest.param(boot["file"], boot["quote"], id=f"payload-{model}-{index}")


@pytest.mark.skipif(SEEDS is None, reason="shared/seeds is not on this machine (set LLM_FLEET_SEEDS)")
@pytest.mark.parametrize(("name", "quote"), list(all_quotes()))
def test_quote_is_verbatim_in_its_seed(name, quote):
    assert any(quote in line for line in seed_lines(name)), f"{name}: {quote!r} is not on one line"


# --- pricing the cases ------------------------------------------------------------------------


def price_case(case: dict):
    # The seeds' other engines with no driver here: CIRU's Orca runtime (one 2026-09-19 shape, whose
    # only figure is a 2400 s health gate, retired the same week) and luce_server (the one-day
    # Lucebox DS4.1 detour, whose shape the seeds give no memory terms for). halogen and radiance
    # have drivers (runtimes/) and are priced.
    try:
        return price(case)
    except Unpriced as exc:
        pytest.skip(f"not priceable from the seeds' fields: {exc}")


def predicted_figures(case: dict, result) -> list[tuple[str, float, float, float]]:
    """(what, predicted, measured, allowed error) for every measured figure the gate claims: KV
    figures only on a measured basis (seeds/004: "Never extrapolate a concurrency figure across
    geometries"; an extrapolated figure is announced as such in the notes), the arena only when
    calibrated. Per-card used and free are judged on their own (test_full_card_figure)."""
    out = []
    kv_claimed = result.kv.get("basis") == "measured"
    arena_claimed = result.kv.get("arena_basis") == "calibrated"
    for figure in case["measured"]:
        what, value = figure["what"], figure["value"]
        if figure.get("known_miss"):
            continue  # listed by test_known_misses_are_few_and_explained
        if what == "claimable" and "claimable_mib" in result.kv:
            measured = parse_size(value) / MIB
            out.append((what, result.kv["claimable_mib"], measured, TOLERANCE * measured))
        elif what == "kv_pool" and "reserved_bytes" in result.kv and str(value).endswith("GiB"):
            # halogen's KV reservation (the boot prints it to 0.1 GiB: half of that is allowed).
            out.append((what, result.kv["reserved_bytes"] / GIB, parse_size(value) / GIB, 0.05 + 1e-9))
        elif what in LLAMACPP_KV_FIGURES and result.runtime == "llamacpp":
            measured = parse_size(value) if isinstance(value, str) else float(value)
            out.append((what, result.kv[LLAMACPP_KV_FIGURES[what]], measured, TOLERANCE * measured))
        elif what == "kv_bytes_per_token" and kv_claimed:
            out.append((what, result.kv["bytes_per_token"], float(value), TOLERANCE * float(value)))
        elif what == "kv_tokens" and kv_claimed:
            out.append((what, result.kv["tokens"], float(value), TOLERANCE * float(value)))
        elif what == "concurrency" and kv_claimed:
            out.append((what, result.kv["concurrency"], float(value), TOLERANCE * float(value)))
        elif what == "arena" and arena_claimed:
            measured = parse_size(value)
            out.append((what, result.kv["arena_bytes"] / GIB, measured / GIB, TOLERANCE * measured / GIB))
        elif what == "arena_slots" and arena_claimed and result.kv.get("arena_slots"):
            out.append((what, result.kv["arena_slots"], float(value), TOLERANCE * float(value)))
    return out


def test_known_misses_are_few_and_explained():
    misses = [(case["id"], figure) for case in CASES for figure in case["measured"] if figure.get("known_miss")]
    for case_id, figure in misses:
        print(f"known miss: {case_id} {figure['what']} {figure['value']}: {figure['known_miss']}")
        assert len(figure["known_miss"]) > 40, f"{case_id}: say why the ledger cannot predict {figure['what']}"
    assert len(misses) <= 2


# The known_bad entry the tcclaviger-fork inventory of frank-primary carried for this model (the
# production primary is radiance now, seed 004's latest era; the finding stays with the model).
PRODUCTION_PRIMARY = {
    "known_bad": [
        {
            "max_num_seqs": 2,
            "reason": "seed 004: '--max-num-seqs 2' cannot compile on this model (torch.compile specializes query_start_loc to SEQS + 1)",
        }
    ]
}
PRODUCTION_PRIMARY_MODEL = "qwen3.8-flash-next-fp8"  # the payload that inventory served


def test_the_production_known_bad_entry_refuses_no_served_shape_of_its_model():
    served = [c for c in CASES if c["model"] == PRODUCTION_PRIMARY_MODEL and c["outcome"] == "served" and c["runtime"] == "vllm"]
    assert served
    for case in served:
        shape = {**case_shape(case), "known_bad": PRODUCTION_PRIMARY["known_bad"]}
        try:
            result = price_shape(shape, case["devices"])
        except ShapeError:
            continue  # not priceable from the seeds' fields (test_replay says why)
        assert "known_bad" not in {v.rule for v in result.failures}, case["id"]


def case_params():
    for case in CASES:
        yield pytest.param(case, id=f"{case['id']}-{case['outcome']}")


@pytest.mark.parametrize("case", list(case_params()))
def test_replay(case):
    result = price_case(case)
    failure = case.get("failure") or {}
    rule = failure.get("rule")
    if isinstance(result, ShapeError):
        if case["outcome"] != "served" and rule in SHAPE_RULES and SHAPE_RULES[rule] in str(result):
            return  # refused by the shape itself, for the seeds' reason
        if case["outcome"] != "served" and rule == "other" and "gpu_memory_utilization" in str(result) and "1.0" in str(result):
            return  # seeds/004: "the UTIL 1.0 verdict (unbootable ...)"
        pytest.skip(f"not priceable from the seeds' fields: {result}" + (f" ({case['unpriced']})" if case.get("unpriced") else ""))
    if case["outcome"] == "served":
        assert result.fits, [v.message for v in result.failures]
    elif not failure.get("gate_can_know"):
        pytest.skip(f"outside a pre-deploy gate: {failure.get('why')}")
    elif rule == "compile_seqs2" and case["model"] == PRODUCTION_PRIMARY_MODEL:
        # The production inventory records what this model cannot run (known_bad): that entry must
        # refuse the seeds' failed shape, for the seeds' reason.
        refused = price_shape({**case_shape(case), "known_bad": PRODUCTION_PRIMARY["known_bad"]}, case["devices"])
        assert "known_bad" in {v.rule for v in refused.failures}, [v.message for v in refused.verdicts]
        return
    elif rule in ARGV_RULES:
        pytest.skip(f"rule {rule}: a known-bad-shape rule of the engine command line, not a budget law ({failure.get('why')})")
    elif rule in BUDGET_RULES:
        refused = {v.rule for v in result.failures}
        assert refused & BUDGET_RULES[rule], f"expected a {rule} refusal, got {sorted(refused) or 'a pass'}"
    else:
        pytest.skip(f"rule {rule}: the seeds' reason ({failure.get('why')}) is no budget term")
    misses = [f"{what}: predicted {p:,.3f}, measured {m:,.3f}" for what, p, m, allowed in predicted_figures(case, result) if abs(p - m) > allowed]
    assert not misses, misses


# --- the full-card figures -------------------------------------------------------------------------

FULL_CARD_FIGURES = all_full_card_figures()


def test_every_full_card_figure_is_compared_or_says_which_terms_the_seeds_lack():
    cases = {item.case for item in FULL_CARD_FIGURES}
    skipped = [item for item in FULL_CARD_FIGURES if not item.compared]
    print(f"full-card figures: {len(FULL_CARD_FIGURES)} in {len(cases)} cases, {len(FULL_CARD_FIGURES) - len(skipped)} compared")
    assert (len(FULL_CARD_FIGURES), len(cases)) == (EXPECTED_FULL_CARD_FIGURES, EXPECTED_FULL_CARD_CASES)
    for item in skipped:
        # A reason names what is missing for THIS figure; no blanket "missing geometry".
        assert len(item.skip) > 60, f"{item.case} {item.label}: {item.skip!r} is no reason"
        assert "missing geometry" not in item.skip and "give model_geometry" not in item.skip.split("[")[0], item.skip


def test_each_expected_miss_names_a_compared_figure():
    compared = {(item.case, item.label) for item in FULL_CARD_FIGURES if item.compared}
    for key in expected_miss_keys():
        assert key in compared, f"full_card_terms.yml: {key} is no compared full-card figure"
        reason = FULL_CARD_TERMS["expected_misses"][key[0]][key[1]]
        assert len(reason) > 60, f"{key}: name the term the ledger lacks"


def full_card_params():
    for item in FULL_CARD_FIGURES:
        marks = [pytest.mark.xfail(strict=True, reason=" ".join(item.expected_miss.split()))] if item.expected_miss else []
        yield pytest.param(item, id=f"{item.case}-{item.label}", marks=marks)


@pytest.mark.parametrize("item", list(full_card_params()))
def test_full_card_figure(item):
    if not item.compared:
        pytest.skip(f"{item.label} {item.measured_text}: {item.skip}")
    # 1% of the measured figure itself: a 0.13 GiB free figure allows 1.3 MiB, not a third of itself.
    assert item.allowed_gib <= TOLERANCE * item.measured_gib + 1e-12
    assert item.within, f"{item.label}: predicted {item.predicted_gib:,.3f} GiB, measured {item.measured_gib:,.3f} GiB ({item.relative_error:.2%})"


# --- the drafter's KV by its own rule ----------------------------------------------------------------

# The seeds' drafter KV figures that are approximations of another rule than the engine's, each with why.
DRAFTER_KV_MISSES = {
    "primary-llamacpp-swift27b-q8kxl-1x262144-dflash7": (
        "the seed's ~40 MiB is the 2,048-position window alone; the engine's sliding cache holds window + n_ubatch cells, "
        "padded to 256 (src/llama-kv-cache-iswa.cpp, the constructor's size_swa; budget/kv_law.py): 2,560 x 20 KiB = 50 MiB"
    ),
}


def drafter_kv_params():
    for case in CASES:
        for figure in case["measured"]:
            if figure["what"] != "drafter_kv":
                continue
            reason = DRAFTER_KV_MISSES.get(case["id"])
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(case, figure, id=f"{case['id']}-drafter_kv", marks=marks)


@pytest.mark.parametrize(("case", "figure"), list(drafter_kv_params()))
def test_drafter_kv_figure(case, figure):
    # The drafter's cache depends on its own geometry and the target's cells, slots and n_ubatch only,
    # so it is priced even where the target's weights are not in the seeds.
    shape = case.get("shape") or {}
    if not shape.get("drafter_geometry"):
        pytest.skip(
            "the in-file MTP context's KV is its nextn layer at the target's cells, and the seeds give this payload's heads and head dim "
            "only as a per-token figure; tests/unit/test_llamacpp_drafter_cache.py prices seeds/001's 2,048 MiB from that figure's geometry"
        )
    drafter = geometry_from_dict(shape["drafter_geometry"], "drafter_geometry")
    batch = graph_law.llamacpp_batch(shape["ctx_size"], shape.get("parallel", 1), shape.get("batch"), shape.get("ubatch", 512))
    kv = kv_law.llamacpp_kv(
        drafter,
        shape["ctx_size"],
        shape.get("parallel", 1),
        shape.get("drafter_type_k", DRAFT_CACHE_TYPE),
        shape.get("drafter_type_v", DRAFT_CACHE_TYPE),
        unified=shape.get("kv_unified", False),
        ubatch=batch.n_ubatch,
    )
    measured = parse_size(figure["value"])
    assert abs(kv.total_bytes - measured) <= TOLERANCE * measured, f"drafter KV: predicted {kv.total_bytes / MIB:,.1f} MiB, measured {measured / MIB:,.1f} MiB"
