# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The expert arena law (vLLM fork with expert offload): how much device memory the fork's expert
planner gives its decode-critical expert cache, and how many expert slots that is.

seeds/004: "The arena is budget - non-expert - KV reserve - graphs - overhead", and "the expert
arena is sized from `max_model_len` via the registry-priced KV reserve (9190 B/token x
max_model_len), NOT from --kv-cache-memory-bytes". So the pool never moves the arena; the context
length, the overhead (7.60 GiB default, 5.25 GiB with --expert-precise-memory) and
--max-num-batched-tokens above 4096 do. docs/vram_budget.md carries the derivation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError, parse_bytes, parse_int
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB

# seeds/004: "registry-priced KV reserve (9190 B/token x max_model_len)"
REGISTRY_KV_RESERVE_PER_TOKEN = 9190
# seeds/004: "the registry overhead is base + 0.22 GiB per 1024 ABOVE its nbt 4096 anchor"
OVERHEAD_NBT_ANCHOR = 4096
OVERHEAD_PER_1024_NBT = round(0.22 * GIB)


def planner_overhead(base: int, max_num_batched_tokens: int | None) -> int:
    """The runtime overhead the planner charges: the registry base, plus 0.22 GiB per 1024 batched
    tokens above the 4096 anchor (so MNBT 1024 and 2048 pay nothing)."""
    above = max((max_num_batched_tokens or 0) - OVERHEAD_NBT_ANCHOR, 0)
    return base + OVERHEAD_PER_1024_NBT * above // 1024


@dataclass(frozen=True)
class ArenaCalibration:
    """One boot's printed arena (`expert cache space N GiB`) at a context length and overhead."""

    max_model_len: int
    runtime_overhead: int
    arena_bytes: int
    gpu_memory_utilization: float | None = None  # None: the shape's own


def arena_calibration_from(spec: Mapping[str, Any] | None, field_name: str = "expert_arena_calibration") -> ArenaCalibration | None:
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or any(spec.get(key) is None for key in ("max_model_len", "runtime_overhead", "arena")):
        raise ShapeError(f"{field_name}: give the boot's max_model_len, runtime_overhead and arena (the `expert cache space` figure)")
    util = spec.get("gpu_memory_utilization")
    if util is not None and not (isinstance(util, (int, float)) and 0 < util < 1):
        raise ShapeError(f"{field_name}.gpu_memory_utilization: the boot's utilization, above 0 and below 1.0")
    return ArenaCalibration(
        parse_int(spec["max_model_len"], f"{field_name}.max_model_len", 1, 1 << 24),
        parse_bytes(spec["runtime_overhead"], f"{field_name}.runtime_overhead"),
        parse_bytes(spec["arena"], f"{field_name}.arena"),
        float(util) if util is not None else None,
    )


@dataclass(frozen=True)
class ArenaPlan:
    arena_bytes: int
    slots: int | None
    overhead: int
    reserve: int
    basis: str  # calibrated | formula
    note: str


def plan_arena(
    *,
    budget: int,
    non_expert: int,
    graphs: int,
    overhead: int,
    max_model_len: int,
    reserve_per_token: int = REGISTRY_KV_RESERVE_PER_TOKEN,
    slot_bytes: int | None = None,
    calibration: ArenaCalibration | None = None,
    capacity: int = 0,
    utilization: float = 0.0,
) -> ArenaPlan:
    """arena = budget - non-expert - reserve_per_token x max_model_len - graphs - overhead.

    With a calibration boot the law moves that boot's arena by the overhead, reserve and budget
    (utilization x capacity) deltas only (the fork's other plan terms are the boot's); without one it is the formula above, which
    sits 0.20 GiB above the seeds' boots (an upper bound on the arena: a lower bound on free)."""
    reserve = reserve_per_token * max_model_len
    if calibration is not None:
        budget_delta = 0 if calibration.gpu_memory_utilization is None else int(capacity * (utilization - calibration.gpu_memory_utilization))
        arena = (
            calibration.arena_bytes + budget_delta + (calibration.runtime_overhead - overhead) + reserve_per_token * (calibration.max_model_len - max_model_len)
        )
        basis = "calibrated"
        note = f"expert arena moved from a boot at max_model_len {calibration.max_model_len:,}: the reserve, overhead and budget deltas only"
    else:
        arena = budget - non_expert - reserve - graphs - overhead
        basis = "formula"
        note = "expert arena by the planner's formula, uncalibrated (the seeds' boots sit ~0.2 GiB lower): give expert_arena_calibration"
    arena = max(arena, 0)
    slots = arena // slot_bytes if slot_bytes else None
    return ArenaPlan(arena, slots, overhead, reserve, basis, note)
