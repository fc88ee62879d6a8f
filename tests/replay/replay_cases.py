"""The seed cases, priced, and the full-card judgement: shared by test_replay.py and
scripts/seed_replay_report.py.

A full-card figure is a per-card used or free reading of one boot (`FULL_CARD`). Each is either
compared with the ledger's own figure for that card, within 1% of the measured figure itself (not of
the card: a 0.13 GiB free figure allows 1.3 MiB), or skipped with the reason the seeds cannot price
it: the terms its payload lacks (full_card_terms.yml), a figure read at another moment than the boot,
or a measured quantity the ledger does not model (`known_miss`). A compared figure that misses is an
expected failure only where full_card_terms.yml names the term the ledger lacks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import SHAPE_CLASSES, price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, SizeError, parse_size

HERE = Path(__file__).parent
CASES = yaml.safe_load((HERE / "seed_cases.yml").read_text(encoding="utf-8"))
PAYLOAD_TERMS = yaml.safe_load((HERE / "payload_terms.yml").read_text(encoding="utf-8"))
FULL_CARD_TERMS = yaml.safe_load((HERE / "full_card_terms.yml").read_text(encoding="utf-8"))
TOLERANCE = 0.01  # of the measured figure itself

# Per-card used and free readings. The first three are boot readings the ledger prices (free_subtraction:
# card minus used, the figure the ledger's free is); the others were read at another moment, or of
# another shape than the case's, and are skipped with that reason.
BOOT_FIGURES = ("used", "free", "free_subtraction", "free_at_boot", "headroom")
OTHER_MOMENT = {
    "free_under_load": "read under a live generation (activations and the vision encoder's buffers allocated after the boot); the ledger prices the boot",
    "free_after_vision": "read after a vision probe (the encoder's buffers stay resident once an image ran); the ledger prices the boot",
    "idle_used": "read idle after serving, from another boot of the era than the case's shape (the seed does not say which)",
    "slot_boot_used": "a boot of another shape (one slot of the slot grid), not the case's; it is the slot-calibration point the case's shape carries",
    "free_at_kv_alloc": (
        "torch's free reading at the KV allocation, mid-boot (weights and the activation profile resident, pool, graphs and arena "
        "not yet): the seeds give no term for what is held at that instant"
    ),
    "free_at_graph_capture": "torch's free reading when CUDA graph capture failed ('0 bytes free'), a transient inside the boot, not its resident terms",
    "free_at_runtime": "torch's free reading when a live request's activation failed ('0 bytes free'), after the boot; the ledger prices the boot",
    "free_at_slab_pair_29120": "the engine's budget probe at a 29,120 MiB slab pair, not the deployed shape; its claimable figure is compared instead",
}
FULL_CARD = BOOT_FIGURES + tuple(OTHER_MOMENT)
# Engines the seeds ran that have no driver here, and why no memory term of theirs can be priced.
NO_DRIVER = "CIRU and luce_server have no driver (retired engines the seeds give no memory terms for)"


class Unpriced(Exception):
    """The seeds' fields cannot price this case; the message says which field or term."""


def case_shape(case: dict) -> dict:
    """The case's budget keys (engine knobs the budget does not read are left out), plus its
    payload's measured boots other than the case's own."""
    names = {f.name for f in dataclasses.fields(SHAPE_CLASSES[case["runtime"]])}
    shape = {key: value for key, value in (case.get("shape") or {}).items() if key in names}
    shape["runtime"] = case["runtime"]
    terms = PAYLOAD_TERMS.get(case["model"]) or {}
    for key, value in (terms.get("shape") or {}).items():
        shape.setdefault(key, value)
    if case["runtime"] == "vllm":
        try:
            own = parse_size(shape["kv_cache_memory_bytes"]) if shape.get("kv_cache_memory_bytes") is not None else None
        except SizeError:
            own = None  # price_shape names the field
        shape["calibration"] = [
            {k: boot[k] for k in ("kv_dtype", "max_model_len", "pool_bytes", "tokens")}
            for boot in terms.get("kv_boots", [])
            if not (boot["pool_bytes"] == own and boot["max_model_len"] == shape.get("max_model_len"))
        ]
        overhead = shape.get("runtime_overhead")
        arena_boots = [
            boot
            for boot in terms.get("arena_boots", [])
            if not (
                boot["max_model_len"] == shape.get("max_model_len") and overhead is not None and parse_size(boot["runtime_overhead"]) == parse_size(overhead)
            )
            and boot.get("speculative", "none") == (case.get("shape") or {}).get("speculative", "none")
        ]
        if arena_boots and shape.get("expert_offload"):
            # The boot nearest the case's context: the reserve law (9,190 B/token) moves it least.
            nearest = min(arena_boots, key=lambda boot: abs(boot["max_model_len"] - (shape.get("max_model_len") or 0)))
            shape["expert_arena_calibration"] = {k: nearest[k] for k in ("max_model_len", "runtime_overhead", "arena", "gpu_memory_utilization")}
    return shape


def price(case: dict):
    """The case's BudgetResult, or the ShapeError the budget refuses it with; Unpriced where the
    runtime has no driver or the seeds give no pool and no weights."""
    if case["runtime"] not in SHAPE_CLASSES:
        raise Unpriced(f"runtime {case['runtime']}: {NO_DRIVER}")
    shape = case.get("shape") or {}
    if case["runtime"] == "vllm" and shape.get("kv_cache_memory_bytes") is None and shape.get("weights_per_rank") is None:
        raise Unpriced("the pool is the engine's profile and the seeds give no weights_per_rank")
    try:
        return price_shape(case_shape(case), case["devices"])
    except ShapeError as exc:
        return exc


@dataclass
class FullCardFigure:
    case: str
    runtime: str
    term: str  # used, free, ...
    device: str | None
    measured_text: str
    predicted_gib: float | None = None
    measured_gib: float | None = None
    allowed_gib: float | None = None
    skip: str | None = None  # why the figure is not compared
    expected_miss: str | None = None  # the missing term, where the comparison misses on purpose

    @property
    def label(self) -> str:
        return f"{self.term}@{self.device}" if self.device else self.term

    @property
    def compared(self) -> bool:
        return self.skip is None

    @property
    def error_gib(self) -> float:
        return (self.predicted_gib or 0.0) - (self.measured_gib or 0.0)

    @property
    def relative_error(self) -> float:
        return abs(self.error_gib) / self.measured_gib if self.measured_gib else float("inf")

    @property
    def within(self) -> bool:
        return self.compared and abs(self.error_gib) <= (self.allowed_gib or 0.0)


def _missing_terms(case: dict, detail: str) -> str:
    terms = FULL_CARD_TERMS["missing_terms"].get(case["model"])
    if terms is None:
        raise KeyError(f"{case['id']}: full_card_terms.yml has no missing_terms entry for payload {case['model']!r}")
    return f"the seeds do not give {terms}" + (f" [{detail}]" if detail else "")


def full_card_figures(case: dict) -> list[FullCardFigure]:
    """Every full-card figure of the case, judged or skipped with its reason."""
    figures = [figure for figure in case["measured"] if figure["what"] in FULL_CARD]
    if not figures:
        return []
    try:
        result = price(case)
        priced_error = None
    except Unpriced as exc:
        result, priced_error = None, str(exc)
    if isinstance(result, ShapeError):
        result, priced_error = None, str(result)
    expected = FULL_CARD_TERMS["expected_misses"].get(case["id"]) or {}
    out = []
    for figure in figures:
        item = FullCardFigure(case["id"], case["runtime"], figure["what"], figure.get("device"), str(figure["value"]))
        out.append(item)
        if figure.get("known_miss"):
            item.skip = f"known miss: {' '.join(figure['known_miss'].split())}"
            continue
        if case["runtime"] not in SHAPE_CLASSES:
            item.skip = f"runtime {case['runtime']}: {NO_DRIVER}"
            continue
        if figure["what"] in OTHER_MOMENT:
            item.skip = OTHER_MOMENT[figure["what"]]
            continue
        if result is None:
            item.skip = _missing_terms(case, f"pricing: {priced_error}")
            continue
        cards = {card.name: card for card in result.devices}
        card = cards.get(figure.get("device")) if figure.get("device") else result.devices[0]
        if card is None:
            item.skip = f"device {figure.get('device')!r} is not one of the case's devices ({', '.join(cards)})"
            continue
        item.device = card.name
        engine_total = "total_bytes" in result.kv and "reserved_bytes" in result.kv  # halogen's own "GiB in all"
        if not engine_total and not any(term.name == "weights" for term in card.terms):
            item.skip = _missing_terms(case, f"{card.name}'s ledger carries no weights term")
            continue
        try:
            measured = parse_size(figure["value"])
        except SizeError:
            item.skip = f"{figure['value']!r} is a range or a ladder, not one size"
            continue
        if figure["what"] == "used" and engine_total:
            predicted = result.kv["total_bytes"]
        elif figure["what"] == "used":
            predicted = card.used
        else:
            predicted = card.free
        item.predicted_gib, item.measured_gib = predicted / GIB, measured / GIB
        item.allowed_gib = TOLERANCE * measured / GIB
        if case["runtime"] == "halogen":
            # halogen prints its figures to 0.1 GiB: half of that where it is tighter than 1%.
            item.allowed_gib = min(item.allowed_gib, 0.05 + 1e-9)
        item.expected_miss = expected.get(item.label)
    return out


def all_full_card_figures() -> list[FullCardFigure]:
    return [item for case in CASES for item in full_card_figures(case)]


def expected_miss_keys() -> set[tuple[str, str]]:
    return {(case_id, label) for case_id, labels in FULL_CARD_TERMS["expected_misses"].items() for label in labels}
