# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Boot ledgers: the facts an engine prints about its own memory while it boots.

These measurements are the calibration the budget trusts over any formula. Each runtime's
driver reads its own engine's lines into a BootLedger (runtimes/<name>.py `parse_boot_line`);
the registry's `parse_boot_log()` runs them over a journal. The lines read today:

vLLM:      `GPU KV cache size: 1,079,582 tokens` (`CPU KV cache size` on the CPU build),
           `Maximum concurrency for 262,144 tokens per request: 5.15x`,
           `Available KV cache memory: 6.80 GiB`, `Model loading took 6.28 GiB ...`,
           `Graph capturing finished in 5 secs, took 0.31 GiB`, expert cache lines.
llama.cpp: `llama_kv_cache: size = 8.00 MiB (4096 cells, 2 layers, 4/4 seqs), K (f16): 4.00 MiB, V (f16): 4.00 MiB`,
           `<dev> model buffer size = ...`, `<dev> KV buffer size = ...`, `<dev> compute buffer size = ...`,
           and the `memory breakdown [MiB]` table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
SIZE = r"([0-9][0-9,]*(?:\.[0-9]+)?\s*[KMGT]i?B)"


def to_int(text: str) -> int:
    return int(text.replace(",", ""))


def to_float(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass
class LlamaCppKvLine:
    size_bytes: int
    cells: int
    layers: int
    seqs_used: int
    seqs_max: int
    type_k: str
    k_bytes: int
    type_v: str
    v_bytes: int


@dataclass
class BootLedger:
    engine: str = ""
    kv_tokens: int | None = None
    kv_device: str | None = None
    concurrency: float | None = None
    concurrency_len: int | None = None
    kv_available_bytes: int | None = None
    model_bytes: int | None = None
    graph_bytes: int | None = None
    expert_bytes: list[int] = field(default_factory=list)
    arena_bytes: int | None = None
    arena_slots: int | None = None
    arena_slot_bytes: int | None = None
    swap_region_bytes: int | None = None
    swap_region_slots: int | None = None
    runtime_overhead_bytes: int | None = None
    kv_caches: list[LlamaCppKvLine] = field(default_factory=list)
    buffers: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> device -> bytes
    breakdown: dict[str, dict[str, int]] = field(default_factory=dict)  # device -> column -> MiB
    # Figures only one engine prints (halogen's locked weights and pool, radiance's claimable
    # budget): each driver names its own keys.
    facts: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine}
        for key in (
            "kv_tokens",
            "kv_device",
            "concurrency",
            "concurrency_len",
            "kv_available_bytes",
            "model_bytes",
            "graph_bytes",
            "arena_bytes",
            "arena_slots",
            "arena_slot_bytes",
            "swap_region_bytes",
            "swap_region_slots",
            "runtime_overhead_bytes",
        ):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.expert_bytes:
            out["expert_bytes"] = self.expert_bytes
        if self.kv_caches:
            out["kv_caches"] = [vars(line) for line in self.kv_caches]
        if self.buffers:
            out["buffers"] = self.buffers
        if self.breakdown:
            out["breakdown_mib"] = self.breakdown
        if self.facts:
            out["facts"] = dict(self.facts)
        return out
