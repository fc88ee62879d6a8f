# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Boot-ledger parser: the facts an engine prints about its own memory while it boots.

These measurements are the calibration the budget trusts over any formula.

vLLM:      `GPU KV cache size: 1,079,582 tokens` (`CPU KV cache size` on the CPU build),
           `Maximum concurrency for 262,144 tokens per request: 5.15x`,
           `Available KV cache memory: 6.80 GiB`, `Model loading took 6.28 GiB ...`,
           `Graph capturing finished in 5 secs, took 0.31 GiB`, expert cache lines.
llama.cpp: `llama_kv_cache: size = 8.00 MiB (4096 cells, 2 layers, 4/4 seqs), K (f16): 4.00 MiB, V (f16): 4.00 MiB`,
           `<dev> model buffer size = ...`, `<dev> KV buffer size = ...`, `<dev> compute buffer size = ...`,
           and the `memory breakdown [MiB]` table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import parse_size

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
_SIZE = r"([0-9][0-9,]*(?:\.[0-9]+)?\s*[KMGT]i?B)"

_VLLM_KV_TOKENS = re.compile(r"(GPU|CPU|XPU|TPU) KV cache size:\s*" + _NUM + r"\s*tokens")
_VLLM_CONCURRENCY = re.compile(r"Maximum concurrency for\s*" + _NUM + r"\s*tokens per request:\s*" + _NUM + r"\s*x")
_VLLM_AVAILABLE = re.compile(r"Available KV cache memory:\s*" + _SIZE)
_VLLM_MODEL = re.compile(r"Model loading took\s*" + _SIZE)
_VLLM_GRAPHS = re.compile(r"Graph capturing finished in .*?took\s*" + _SIZE)
_VLLM_EXPERT = re.compile(r"(?i)expert[^:=\n]*(?:cache|arena|buffer)[^:=\n]*[:=]\s*" + _SIZE)
# The expert-offload fork's plan lines (seeds/004): "expert cache space 14.87 GiB / 6,496 slots of
# 2.344 MiB", "swap region 13.7 GiB / 5986 slots", "runtime overhead 5.25 GiB".
_VLLM_EXPERT_SPACE = re.compile(r"(?i)expert cache space\s*" + _SIZE + r"\s*/\s*" + _NUM + r"\s*slots(?:\s*of\s*" + _SIZE + r")?")
_VLLM_SWAP_REGION = re.compile(r"(?i)swap region\s*" + _SIZE + r"\s*/\s*" + _NUM + r"\s*slots")
_VLLM_OVERHEAD = re.compile(r"(?i)runtime overhead\s*[:=]?\s*" + _SIZE)

_LCPP_KV = re.compile(
    r"llama_kv_cache(?:_unified)?:\s*size\s*=\s*" + _SIZE + r"\s*\(\s*(\d+)\s*cells,\s*(\d+)\s*layers,\s*(\d+)\s*/\s*(\d+)\s*seqs\s*\),"
    r"\s*K\s*\((\w+)\):\s*" + _SIZE + r",\s*V\s*\((\w+)\):\s*" + _SIZE
)
_LCPP_BUFFER = re.compile(r"(\w+):\s+(\S+)\s+(model|KV|compute|output|RS)\s+buffer size\s*=\s*" + _SIZE)
_LCPP_BREAKDOWN_GPU = re.compile(r"\|\s*-\s*(.+?)\s*\|\s*(\d+)\s*=\s*(\d+)\s*\+\s*\(\s*(\d+)\s*=\s*(\d+)\s*\+\s*(\d+)\s*\+\s*(\d+)\s*\)\s*\+\s*(-?\d+)\s*\|")
_LCPP_BREAKDOWN_HOST = re.compile(r"\|\s*-\s*(.+?)\s*\|\s*(\d+)\s*=\s*(\d+)\s*\+\s*(\d+)\s*\+\s*(\d+)\s*\|")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _float(text: str) -> float:
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
        return out


def parse_boot_log(text: str) -> BootLedger:
    """Collect every memory fact an engine printed; later lines win (the engine may reboot)."""
    ledger = BootLedger()
    for line in text.splitlines():
        _parse_vllm_line(line, ledger)
        _parse_llamacpp_line(line, ledger)
    if ledger.kv_tokens is not None or ledger.concurrency is not None:
        ledger.engine = "vllm"
    elif ledger.kv_caches or ledger.buffers:
        ledger.engine = "llamacpp"
    return ledger


def _parse_vllm_line(line: str, ledger: BootLedger) -> None:
    match = _VLLM_KV_TOKENS.search(line)
    if match:
        ledger.kv_device = match.group(1)
        ledger.kv_tokens = _int(match.group(2))
        # vLLM 0.32 prints the concurrency on the same line: read on.
    match = _VLLM_CONCURRENCY.search(line)
    if match:
        ledger.concurrency_len = _int(match.group(1))
        ledger.concurrency = _float(match.group(2))
        return
    match = _VLLM_AVAILABLE.search(line)
    if match:
        ledger.kv_available_bytes = parse_size(match.group(1), "Available KV cache memory")
        return
    match = _VLLM_MODEL.search(line)
    if match:
        ledger.model_bytes = parse_size(match.group(1), "Model loading took")
        return
    match = _VLLM_GRAPHS.search(line)
    if match:
        ledger.graph_bytes = parse_size(match.group(1), "Graph capturing")
        return
    _parse_expert_plan(line, ledger)
    match = _VLLM_EXPERT.search(line)
    if match:
        ledger.expert_bytes.append(parse_size(match.group(1), "expert cache"))


def _parse_expert_plan(line: str, ledger: BootLedger) -> None:
    """The expert-offload planner's figures; one line may carry several (seeds/004 quotes them
    comma-separated)."""
    match = _VLLM_EXPERT_SPACE.search(line)
    if match:
        ledger.arena_bytes = parse_size(match.group(1), "expert cache space")
        ledger.arena_slots = _int(match.group(2))
        if match.group(3):
            ledger.arena_slot_bytes = parse_size(match.group(3), "expert slot")
    match = _VLLM_SWAP_REGION.search(line)
    if match:
        ledger.swap_region_bytes = parse_size(match.group(1), "swap region")
        ledger.swap_region_slots = _int(match.group(2))
    match = _VLLM_OVERHEAD.search(line)
    if match:
        ledger.runtime_overhead_bytes = parse_size(match.group(1), "runtime overhead")


def _parse_llamacpp_line(line: str, ledger: BootLedger) -> None:
    match = _LCPP_KV.search(line)
    if match:
        ledger.kv_caches.append(
            LlamaCppKvLine(
                size_bytes=parse_size(match.group(1)),
                cells=int(match.group(2)),
                layers=int(match.group(3)),
                seqs_used=int(match.group(4)),
                seqs_max=int(match.group(5)),
                type_k=match.group(6),
                k_bytes=parse_size(match.group(7)),
                type_v=match.group(8),
                v_bytes=parse_size(match.group(9)),
            )
        )
        return
    match = _LCPP_BUFFER.search(line)
    if match:
        device, kind = match.group(2), match.group(3)
        ledger.buffers.setdefault(kind, {})[device] = parse_size(match.group(4))
        return
    if "memory breakdown" in line or "|" not in line:
        return
    match = _LCPP_BREAKDOWN_GPU.search(line)
    if match:
        names = ("total", "free", "self", "model", "context", "compute", "unaccounted")
        ledger.breakdown[match.group(1)] = {name: int(match.group(i + 2)) for i, name in enumerate(names)}
        return
    match = _LCPP_BREAKDOWN_HOST.search(line)
    if match:
        names = ("self", "model", "context", "compute")
        ledger.breakdown[match.group(1)] = {name: int(match.group(i + 2)) for i, name in enumerate(names)}
