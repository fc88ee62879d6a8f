# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The radiance runtime: a vLLM fork in its publisher's container (served as frank-archon in seed
004). It builds on runtimes/vllm.py: the shape class and the driver are subclasses, the argv is
vLLM's (the fork takes its parent's flags), and what is the fork's own lives here:

- the dtype law: "only bf16|fp8, no K/V split; the QSA block key is dtype-fixed, which is why bf16
  costs 1.89x and not 2x" (refused at parse time, naming kv_cache_dtype);
- the claimable budget, from the engine's own table: "card 32,624 MiB, pair at 29,120 settling
  2,058 MiB free against its 209.19 MiB floor => 30,969 claimable": claimable = pair + free - floor,
  and the pair (the expert slab and the KV pool, "the shipped pair 25600/5120") must fit it;
- the token contract: the pool holds max_num_seqs full windows ("843,276 tokens = 4 x 200,000");
- the boot lines as the seed quotes them ("12 all-reduce rows, 5.87 GiB of KV lent to the slab",
  the budget table, the slab's slots) feeding calibration;
- the client quirks: "radiance answers in reasoning_content" and "radiance echoes the requested
  name" (a rename is verified on /v1/models, never on a chat answer);
- the payload: a `.rad` file ("The Swift1.5 w4dn8 .rad").
docs/vram_budget.md ("radiance") says what the seeds do not give.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import BudgetResult, DeviceLedger, Verdict, _capacity_verdicts
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.pricing import PayloadReader, add_extra_terms, client_verdicts
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.identity import FILE, PayloadName
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.base import AlertRule, Panel
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.boot_ledger import NUM, BootLedger, to_float, to_int
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.vllm import Vllm, VllmShape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError, key, parse_bytes
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import MIB

NAME = "radiance"
KV_DTYPES = ("bf16", "fp8")
BF16_COST = 1.89  # bf16 KV per token against fp8's (seed 004: "bf16 costs 1.89x and not 2x")
DTYPE_LAW = "seed 004: 'only bf16|fp8, no K/V split; the QSA block key is dtype-fixed'"
_SPLIT = re.compile(r"[,/:;+ ]|(?:^|_)[kv]$|^[kv](?:_|=)")


# --- the shape ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RadianceShape(VllmShape):
    """radiance, a vLLM fork: vLLM's keys plus the fork's slab and claimable budget."""

    kv_cache_dtype: str = key("str", "radiance --kv-cache-dtype: bf16 or fp8 only, one dtype for K and V.", default="fp8")
    expert_slab: int | None = key("size", "radiance: the expert slab per rank (the pair's first half, e.g. 25,600 MiB).", group="budget")
    claim_calibration: Mapping[str, Any] | None = key(
        "mapping",
        "Budget - the engine's budget table {card, pair, free, floor}: claimable = pair + free - floor (30,969 MiB on an R9700).",
        group="budget",
    )
    pool_tokens: int | None = key(
        "int", "Budget - the pool's tokens as a boot printed them at this pair (the token contract).", maximum=1 << 32, group="budget"
    )

    RUNTIME: ClassVar[str] = NAME

    @property
    def request_ceiling(self) -> int:
        return self.max_model_len

    @classmethod
    def check_kv_dtype(cls, dtype: str) -> None:
        check_dtype(dtype)  # radiance's own dtype law, not vLLM's list

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        super().check_values(values)
        check_dtype(str(values.get("kv_cache_dtype", "fp8")))
        model = values.get("model_file")
        if model and not str(model).endswith(".rad"):
            raise ShapeError(f"model_file: {model!r} is not a .rad payload; radiance serves its own .rad container (seed 004: 'The Swift1.5 w4dn8 .rad')")


def check_dtype(dtype: str) -> None:
    if _SPLIT.search(dtype.strip().lower()):
        raise ShapeError(f"kv_cache_dtype: {dtype!r} splits K and V; radiance keeps one dtype for both ({DTYPE_LAW})")
    if dtype not in KV_DTYPES:
        raise ShapeError(f"kv_cache_dtype: {dtype!r}; radiance stores KV only as bf16 or fp8 ({DTYPE_LAW})")


def pool_cost(fp8_bytes: int, dtype: str) -> int:
    """The same pool's cost at `dtype`, from its fp8 cost: bf16 is 1.89x, not 2x."""
    check_dtype(dtype)
    return round(fp8_bytes * BF16_COST) if dtype == "bf16" else fp8_bytes


def holds_windows(tokens: int, seqs: int, window: int) -> bool:
    """The token contract: the pool holds `seqs` full windows (843,276 >= 4 x 200,000)."""
    return tokens >= seqs * window


# --- the claimable budget ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimLaw:
    card: int
    pair: int
    free: int
    floor: int

    @property
    def claimable(self) -> int:
        """What the slab and the KV pool may claim: the calibration pair plus what it left free
        above the engine's floor."""
        return self.pair + self.free - self.floor

    @property
    def fixed(self) -> int:
        """The card's part no claim reaches (context, runtime): card - pair - free."""
        return self.card - self.pair - self.free


def claim_law(raw: Mapping[str, Any] | None) -> ClaimLaw | None:
    if not raw:
        return None
    values = {}
    for name in ("card", "pair", "free", "floor"):
        if raw.get(name) is None:
            raise ShapeError(f"claim_calibration.{name}: required (the engine's budget table: card, pair, free, floor)")
        values[name] = parse_bytes(raw[name], f"claim_calibration.{name}")
    law = ClaimLaw(**values)
    if law.fixed < 0:
        raise ShapeError("claim_calibration: pair + free exceed the card")
    return law


def _price_radiance(shape: RadianceShape, devices: list[DeviceLedger], payload: PayloadReader, boots: list[dict[str, Any]]) -> BudgetResult:
    tp = shape.tensor_parallel
    if tp != len(devices):
        raise ShapeError(f"tensor_parallel: {tp}, but {len(devices)} devices are listed (one rank per device)")
    law = claim_law(shape.claim_calibration)
    slab = shape.expert_slab or 0
    kv_pool = shape.kv_cache_memory_bytes or 0
    notes: list[str] = []
    verdicts: list[Verdict] = []
    for device in devices:
        device.add("expert_slab", slab, "the pair's slab")
        device.add("kv_pool", kv_pool, f"--kv-cache-memory-bytes, {shape.kv_cache_dtype}")
        if law is not None:
            device.add("engine_fixed", law.fixed, "card - pair - settled free, at the calibration boot")
    add_extra_terms(devices, shape.extra_terms)
    floor = law.floor if law is not None else shape.free_floor
    kv: dict[str, Any] = {"pair_mib": round((slab + kv_pool) / MIB, 1), "kv_dtype": shape.kv_cache_dtype}
    if law is None:
        notes.append("claimable: no claim_calibration (the engine's budget table), so the pair is judged against the card alone")
    else:
        claimable = law.claimable
        ok = slab + kv_pool <= claimable
        over = round((slab + kv_pool - claimable) / MIB, 1)
        verdicts.append(
            Verdict(
                "claimable",
                ok,
                f"pair {slab / MIB:,.0f} + {kv_pool / MIB:,.0f} = {(slab + kv_pool) / MIB:,.0f} MiB "
                + (f"<= {claimable / MIB:,.0f} claimable" if ok else f"exceeds {claimable / MIB:,.0f} claimable by {over:,.1f} MiB")
                + f" (card {law.card / MIB:,.0f} MiB, pair at {law.pair / MIB:,.0f} settling {law.free / MIB:,.0f} MiB free"
                + f" against its {law.floor / MIB:,.2f} MiB floor)",
                None if ok else devices[0].name,
                None if ok else ("kv_pool" if kv_pool else "expert_slab"),
                None if ok else over,
            )
        )
        kv.update(claimable_mib=round(claimable / MIB), claimable_bytes=claimable)
    contract = shape.max_num_seqs * shape.max_model_len
    kv["contract_tokens"] = contract
    if shape.pool_tokens is not None:
        ok = holds_windows(shape.pool_tokens, shape.max_num_seqs, shape.max_model_len)
        kv.update(tokens=shape.pool_tokens, concurrency=round(shape.pool_tokens / shape.max_model_len, 2))
        verdicts.append(
            Verdict(
                "pool_law",
                ok,
                f"pool {shape.pool_tokens:,} tokens "
                + ("holds" if ok else "does not hold")
                + f" {shape.max_num_seqs} x {shape.max_model_len:,} = {contract:,}",
                None if ok else devices[0].name,
                None if ok else "kv_pool",
            )
        )
    else:
        notes.append(
            f"tokens: the seeds print no pool token count at this pair; the contract is {shape.max_num_seqs} x {shape.max_model_len:,} = {contract:,} tokens "
            "(live-verified at 3 slots: '3 x 199,984-token prompts accepted (599,952 tokens), fourth refused')"
        )
    verdicts.extend(_capacity_verdicts(devices, floor, shape.max_device_gap))
    client, client_judged = client_verdicts(shape)
    verdicts.extend(client_judged)
    geometry_key = f"{NAME}:{shape.kv_cache_dtype}:len={shape.max_model_len}:seqs={shape.max_num_seqs}:tp={tp}"
    return BudgetResult(NAME, devices, kv, client, verdicts, [], notes, geometry_key, None)


# --- boot lines and calibration -------------------------------------------------------------------

_KV_TOKENS = re.compile(r"(GPU|CPU) KV cache size:\s*" + NUM + r"\s*tokens")
_BOOT = (
    ("card_mib", re.compile(r"card\s*" + NUM + r"\s*MiB")),
    ("pair_mib", re.compile(r"pair at\s*" + NUM)),
    ("free_mib", re.compile(r"settling\s*" + NUM + r"\s*MiB free")),
    ("floor_mib", re.compile(NUM + r"\s*MiB floor")),
    ("claimable_mib", re.compile(NUM + r"\s*claimable")),
    ("all_reduce_rows", re.compile(NUM + r"\s*all-reduce rows")),
    ("kv_lent_gib", re.compile(NUM + r"\s*GiB of KV lent to the slab")),
    ("slab_slots", re.compile(r"slab\s*(?:" + NUM + r"\s*->\s*)?" + NUM + r"\s*slots")),
)
_WINDOWS = re.compile(NUM + r"\s*tokens\s*=\s*(\d+)\s*x\s*" + NUM)


def _parse_radiance_line(line: str, ledger: BootLedger) -> None:
    facts = ledger.facts
    for name, pattern in _BOOT:
        match = pattern.search(line)
        if match:
            text = match.groups()[-1]
            facts[f"radiance_{name}"] = to_float(text) if name.endswith(("_mib", "_gib")) else to_int(text)
    match = _WINDOWS.search(line)
    if match:
        facts["radiance_pool_tokens"] = to_int(match.group(1))
        facts["radiance_seqs"] = to_int(match.group(2))
        facts["radiance_window"] = to_int(match.group(3))
    match = _KV_TOKENS.search(line)
    if match:
        # The parent's line, where the fork prints it (vLLM's driver reads it too; same value).
        ledger.kv_device, ledger.kv_tokens = match.group(1), to_int(match.group(2))


def _close(predicted: Any, measured: Any) -> bool:
    if isinstance(predicted, bool) or not isinstance(predicted, (int, float)):
        return bool(predicted == measured)
    return abs(predicted - measured) <= 1  # the table prints whole MiB


def _compare_radiance(boot: dict[str, Any], shape: RadianceShape) -> dict[str, Any]:
    facts = (boot.get("ledger") or {}).get("facts") or {}
    predicted: dict[str, Any] = {}
    measured: dict[str, Any] = {}
    law = claim_law(shape.claim_calibration)
    if law is not None and "radiance_claimable_mib" in facts:
        predicted["claimable_mib"], measured["claimable_mib"] = round(law.claimable / MIB), round(float(facts["radiance_claimable_mib"]))
    tokens = facts.get("radiance_pool_tokens") or (boot.get("ledger") or {}).get("kv_tokens")
    if tokens:
        predicted["holds_contract"] = True
        measured["holds_contract"] = holds_windows(int(tokens), shape.max_num_seqs, shape.max_model_len)
    if not measured:
        return {"agree": None, "detail": "the boot printed neither the budget table nor the pool's tokens"}
    agree = all(_close(predicted[name], measured[name]) for name in measured)
    return {"predicted": predicted, "measured": measured, "agree": agree, "detail": "claimable = pair + free - floor; pool tokens >= seqs x max_model_len"}


# --- the driver ------------------------------------------------------------------------------------


class Radiance(Vllm):
    name = NAME
    shape_class = RadianceShape
    # As vLLM's image, the publisher's container runs its own entrypoint: the argv is its flags.
    # No /metrics of radiance is captured in the seeds: observability/exported/radiance.metrics is
    # a minimal exposition of the two in-flight gauges the drain needs, in the driver's namespace,
    # and no alert rule or panel is claimed beyond what it holds.
    in_flight_gauges = (f"{NAME}:num_requests_running", f"{NAME}:num_requests_waiting")
    alert_rules = (AlertRule("RequestsQueueing", f"{NAME}:num_requests_waiting{{sel}} > 0", "5m", "warning", "{name}: requests wait for the scheduler"),)
    panels = (
        Panel(
            "Requests running / waiting",
            ((f"{NAME}:num_requests_running{{sel}}", "{{job}} running"), (f"{NAME}:num_requests_waiting{{sel}}", "{{job}} waiting")),
        ),
    )
    reasoning_field = "reasoning_content"  # seed 004: "radiance answers in reasoning_content"
    echoes_requested_name = True  # seed 004: "verify a rename on /v1/models, never on a chat response"

    def price(self, shape: Any, devices: list[DeviceLedger], payload: PayloadReader, boots: list[dict[str, Any]]) -> BudgetResult:
        return _price_radiance(shape, devices, payload, boots)

    def payload_names(self, shape: Any) -> list[PayloadName]:
        # The fork serves one .rad container file, not vLLM's Hugging Face directory.
        return [PayloadName("model_file", shape.model_file, FILE)] if shape.model_file else []

    def prices_on_controller(self, shape: Any) -> bool:
        # Every term is declared in the shape (the pair and the budget table).
        return True

    def parse_boot_line(self, line: str, ledger: BootLedger) -> None:
        _parse_radiance_line(line, ledger)

    def claims_boot(self, ledger: BootLedger) -> bool:
        return any(name.startswith(f"{NAME}_") for name in ledger.facts)

    def compare_boot(self, boot: dict[str, Any], boots: list[dict[str, Any]], shape: Any, geometry: Any) -> dict[str, Any]:
        return _compare_radiance(boot, shape)

    def calibration_points(self, boots: list[dict[str, Any]], key: str) -> list[Any]:
        return []


DRIVER = Radiance()
