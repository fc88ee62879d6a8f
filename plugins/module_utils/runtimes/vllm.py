# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM runtime: its OpenAI server's shape keys, argv, ledger, boot lines and metrics.

- the ledger per rank: weights, the KV pool (--kv-cache-memory-bytes, or what the utilization
  budget leaves), graphs (the engine's own estimate: 256 MiB + 52 MiB per captured graph),
  runtime overhead, non-torch memory and the expert-offload fork's arena (budget/expert_arena.py);
  the pool's tokens, concurrency and refusal by budget/kv_law.py `vllm_kv`: the engine's block
  accounting (`vllm_block_law`) where the geometry allows, else the stored boots of the geometry;
- the boot lines: `GPU|CPU KV cache size: N tokens`, `Maximum concurrency for N tokens per
  request: X.XXx`, `Available KV cache memory` (the CPU worker's `Explicitly|Auto set (X/Y) GiB
  for KV cache`), `Model loading took`, graph capture, and the
  expert planner's lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import calibration, expert_arena, kv_law, rules
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import BudgetResult, DeviceLedger, Verdict, _capacity_verdicts
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.pricing import PayloadReader, add_extra_terms, client_verdicts
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.identity import DIRECTORY, FILE, PayloadName
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.base import AlertRule, Panel, RefusalContract, Runtime, json_flag, serving
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.boot_ledger import NUM, SIZE, BootLedger, to_float, to_int
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import (
    MAX_SLOTS,
    MAX_TOKENS,
    Shape,
    ShapeError,
    key,
    parse_bytes,
    parse_int,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, MIB, parse_size

NAME = "vllm"
GRAPH_BASE_BYTES = 256 * MIB  # vLLM's own graph-memory estimate: 256 MiB + 52 MiB per captured graph
GRAPH_PER_CAPTURE_BYTES = 52 * MIB

# --- the shape ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmShape(Shape):
    """vLLM's OpenAI server."""

    max_model_len: int = key("int", "vLLM --max-model-len.", required=True, minimum=1, maximum=MAX_TOKENS)
    max_num_seqs: int = key("int", "vLLM --max-num-seqs.", default=1, minimum=1, maximum=MAX_SLOTS)
    kv_cache_dtype: str = key("str", "vLLM --kv-cache-dtype (auto, bf16, fp8, ...).", default="auto")
    kv_cache_memory_bytes: int | None = key("size", "vLLM --kv-cache-memory-bytes, per rank, as a size.")
    max_num_batched_tokens: int | None = key("int", "vLLM --max-num-batched-tokens.", minimum=1, maximum=MAX_TOKENS)
    tensor_parallel: int = key("int", "vLLM --tensor-parallel-size (one rank per device).", default=1, minimum=1, maximum=64)
    gpu_memory_utilization: float = key(
        "float",
        "vLLM --gpu-memory-utilization, a fraction of the whole card, below 1.0.",
        default=0.9,
        above=0.0,
        below=1.0,
        range_help="above 0 and below 1.0 (1.0 is unbootable: worker init demands free memory above the budget); use at most 0.98",
    )
    prefix_caching: bool = key("bool", "vLLM --enable-prefix-caching.", default=False)
    tool_parser: str | None = key("str", "vLLM --tool-call-parser (enables auto tool choice).")
    reasoning_parser: str | None = key("str", "vLLM --reasoning-parser.")
    speculative_config: Mapping[str, Any] | None = key("mapping", "vLLM --speculative-config (a drafter: draft model, MTP or n-gram).")
    calibration: tuple[Any, ...] = key("list", "Budget - measured boots [{kv_dtype, max_model_len, pool_bytes, tokens}].", default=(), group="budget")
    weights_per_rank: int | None = key("size", "Budget - weights per rank.", group="budget")
    weights: int | None = key("size", "Budget - weights in total (divided over the ranks).", group="budget")
    graph_memory: int | None = key("size", "Budget - measured graph memory per rank.", group="budget")
    graph_captures: int | None = key("int", "Budget - captured graphs (the engine's estimate: 256 MiB + 52 MiB each).", maximum=1024, group="budget")
    runtime_overhead: int = key("size", "Budget - vLLM runtime overhead per rank.", default=0, group="budget")
    non_torch_memory: int = key("size", "Budget - non-torch memory per rank.", default=0, group="budget")
    attention_backend: str | None = key("str", "vLLM --attention-backend (e.g. TURBOQUANT; some builds ignore the VLLM_ATTENTION_BACKEND env var).")
    expert_arena: int | None = key("size", "Budget - the expert arena per rank, declared.", group="budget")
    expert_offload: bool = key(
        "bool",
        "vLLM --enable-expert-offload (tcclaviger RDNA4 fork only); the planner sizes the arena from max_model_len, never from the pool.",
        default=False,
    )
    expert_precise_memory: bool = key(
        "bool",
        "vLLM --expert-precise-memory (tcclaviger RDNA4 fork only): the planner charges precise_runtime_overhead, not the default.",
        default=False,
    )
    precise_runtime_overhead: int | None = key(
        "size", "Budget - the fitted overhead per rank that --expert-precise-memory selects (5.25 GiB on gfx1201 TP2).", group="budget"
    )
    kv_reserve_per_token: int = key(
        "int",
        "Budget - the expert planner's KV reserve per token of max_model_len, bytes (e.g. 9190).",
        default=9190,
        minimum=1,
        maximum=1 << 24,
        group="budget",
    )
    expert_slot_bytes: int | None = key("size", "Budget - one expert slot's size (2.344 MiB for qwen3.8-flash-next FP8), for the slot count.", group="budget")
    expert_arena_calibration: Mapping[str, Any] | None = key(
        "mapping", "Budget - a boot's printed arena {max_model_len, runtime_overhead, arena}: the arena law moves it.", group="budget"
    )

    @property
    def slots(self) -> int:
        return self.max_num_seqs

    @property
    def kv_dtypes(self) -> tuple[str, ...]:
        return (self.kv_cache_dtype,)

    RUNTIME: ClassVar[str] = NAME
    # vLLM's FlexibleArgumentParser reads `_` as `-` in a flag's name and takes `--flag=value`;
    # argparse takes any unambiguous prefix (`--hos`, `--api-k`): every such spelling is refused.
    CREDENTIAL_FLAGS: ClassVar[tuple[str, ...]] = ("--api-key", "--api_key", "--hf-token", "--hf_token")
    ADDRESS_FLAGS: ClassVar[tuple[str, ...]] = ("--host", "--port")
    FLAG_UNDERSCORES: ClassVar[bool] = True
    FLAG_PREFIXES: ClassVar[bool] = True
    LAYOUT_KEYS: ClassVar[tuple[str, ...]] = ("max_model_len", "max_num_seqs")
    KV_DTYPE_FIELD: ClassVar[str] = "kv_cache_dtype"

    @property
    def request_ceiling(self) -> int:
        return self.max_model_len

    @property
    def kv_identity(self) -> tuple[list[str], int]:
        return [kv_law.normalise_vllm_dtype(self.kv_cache_dtype)], self.tensor_parallel

    @classmethod
    def check_kv_dtype(cls, dtype: str) -> None:
        """An illegal KV dtype is refused with the shape, not first by the budget or the engine."""
        if dtype.lower() not in kv_law.VLLM_KV_DTYPES:
            raise ShapeError(f"kv_cache_dtype: unknown vLLM KV dtype {dtype!r}; expected one of {', '.join(kv_law.VLLM_KV_DTYPES)}")

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        if values.get("kv_cache_dtype") is not None:
            cls.check_kv_dtype(str(values["kv_cache_dtype"]))
        if values.get("expert_precise_memory") and not values.get("expert_offload"):
            raise ShapeError("expert_precise_memory: sizes the expert offload arena; set expert_offload: true or remove it")


def shape_overhead(shape: VllmShape) -> int:
    """The overhead a shape's planner charges: precise_runtime_overhead under
    --expert-precise-memory (where given), else runtime_overhead; plus the MNBT surcharge."""
    precise = shape.expert_precise_memory and shape.precise_runtime_overhead is not None
    base = shape.precise_runtime_overhead if precise else shape.runtime_overhead
    return expert_arena.planner_overhead(base or 0, shape.max_num_batched_tokens)


# --- argv ----------------------------------------------------------------------------------------

# The shape's short spellings of a KV dtype as vLLM's --kv-cache-dtype choices (vllm/config/cache.py
# CacheDType: "bfloat16" and "float16", no "bf16"; vLLM 0.32.0's argument parser refuses bf16).
# The key guard: the module vLLM imports and the directory the deploy writes it to (the same
# directory as host/engine_python.py's ENGINE_PYTHON_DIR, which a test holds equal).
KEY_GUARD_MIDDLEWARE = "llm_fleet_vllm_key_guard.KeyGuard"
KEY_GUARD_DIR = "/usr/local/lib/llm-fleet/engine-python"
VLLM_DTYPE_SPELLING = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def vllm_argv(shape: VllmShape, model_root: str = "", entry: list[str] | None = None) -> list[str]:
    """Arguments for vLLM's OpenAI server (`entry` is the program part, e.g. the image's default)."""
    model, served_id, port = serving(shape, model_root)
    argv = list(entry or [])
    argv += ["--model", model, "--served-model-name", served_id, "--host", shape.bind, "--port", port]
    # The collection's key guard (runtimes/vllm_key_guard.py) in front of every route: vLLM's own
    # key check covers only /v1, /v2, /inference and /cohere.
    argv += ["--middleware", KEY_GUARD_MIDDLEWARE]
    argv += ["--max-model-len", str(shape.max_model_len), "--max-num-seqs", str(shape.max_num_seqs)]
    argv += ["--kv-cache-dtype", VLLM_DTYPE_SPELLING.get(shape.kv_cache_dtype.lower(), shape.kv_cache_dtype)]
    if shape.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(shape.kv_cache_memory_bytes)]
    if shape.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(shape.max_num_batched_tokens)]
    argv += ["--tensor-parallel-size", str(shape.tensor_parallel)]
    argv += ["--gpu-memory-utilization", f"{shape.gpu_memory_utilization:g}"]
    if shape.prefix_caching:
        argv.append("--enable-prefix-caching")
    if shape.tool_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", shape.tool_parser]
    if shape.reasoning_parser:
        argv += ["--reasoning-parser", shape.reasoning_parser]
    if shape.chat_template_kwargs:
        argv += ["--default-chat-template-kwargs", json_flag(shape.chat_template_kwargs)]
    if shape.attention_backend:
        argv += ["--attention-backend", shape.attention_backend]
    if shape.expert_offload:
        argv.append("--enable-expert-offload")
    if shape.expert_precise_memory:
        argv.append("--expert-precise-memory")
    if shape.speculative_config:
        # A drafter (draft model, MTP or n-gram), passed through as vLLM's JSON argument.
        argv += ["--speculative-config", json_flag(shape.speculative_config)]
    return argv + list(shape.extra_args)


# --- the ledger ----------------------------------------------------------------------------------


def _calibrations(shape: VllmShape) -> list[kv_law.VllmCalibration]:
    out = []
    for index, point in enumerate(shape.calibration):
        field_name = f"calibration[{index}]"
        if not isinstance(point, dict):
            raise ShapeError(f"{field_name}: expected a mapping with kv_dtype, max_model_len, pool_bytes, tokens")
        missing = [key for key in ("max_model_len", "pool_bytes", "tokens") if point.get(key) is None]
        if missing:
            raise ShapeError(f"{field_name}: kv_dtype, max_model_len, pool_bytes and tokens are all required (missing {', '.join(missing)})")
        out.append(
            kv_law.VllmCalibration(
                str(point.get("kv_dtype", "auto")),
                parse_int(point["max_model_len"], f"{field_name}.max_model_len", 1, 1 << 24),
                parse_bytes(point["pool_bytes"], f"{field_name}.pool_bytes"),
                parse_int(point["tokens"], f"{field_name}.tokens", 1, 1 << 40),
                str(point.get("source", "")),
            )
        )
    return out


def block_size(shape: VllmShape, kind: str = "gpu") -> int:
    """The block size the engine runs: --block-size in extra_args, else the platform's default
    (vllm/platforms/cpu.py CpuPlatform.check_and_update_config: 128 on CPU unless the user sets it;
    vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE: 16 on GPU)."""
    args = list(shape.extra_args)
    for index, arg in enumerate(args):
        value = None
        if arg == "--block-size" and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith("--block-size="):
            value = arg.split("=", 1)[1]
        if value is not None:
            return parse_int(value, "extra_args --block-size", 1, 1 << 16)
    return kv_law.VLLM_CPU_BLOCK_SIZE if kind == "cpu" else kv_law.VLLM_GPU_BLOCK_SIZE


def block_plan(shape: VllmShape, kind: str = "gpu") -> dict[str, int]:
    """The engine settings its block accounting reads: block size, the batched tokens a
    sliding-window request keeps in flight, and how many batches are in flight at once."""
    mnbt = shape.max_num_batched_tokens
    if mnbt is None:
        # vllm/engine/arg_utils.py get_batch_defaults (OpenAI server: 2048 x world size on CPU;
        # 2048 is also the GPU default outside the large-memory tiers), then
        # min(max_num_seqs x max_model_len, it).
        mnbt = min(shape.max_num_seqs * shape.max_model_len, kv_law.VLLM_CPU_DEFAULT_MNBT * shape.tensor_parallel)
    # vllm/config/vllm.py VllmConfig.max_concurrent_batches: 1 without async scheduling (the CPU
    # platform turns it off: vllm/platforms/cpu.py), 2 with it (the GPU default, V1 runner, no PP).
    batches = 1 if kind == "cpu" else 2
    return {"block_size": block_size(shape, kind), "max_num_batched_tokens": mnbt, "concurrent_batches": batches}


def _pool_verdict(kv: kv_law.VllmKv, max_len: int, device: str) -> Verdict:
    """vLLM's pool law is one-sided: the pool must hold one max_model_len, and may hold more than
    max_num_seqs x max_model_len (seeds/000: 3 x 262,144 fp8 at 6.1e9 B served 792,069 tokens,
    3.02x). The two-sided ctx <= pool <= slots x ctx law is another engine's (halogen). On the
    exact basis the engine's own check decides (kv_cache_utils.py get_kv_cache_configs /
    _check_enough_kv_cache_memory): a max_model_len request's whole blocks against the pool
    less the null block."""
    head = f"pool {kv.tokens:,} tokens ({kv.basis}), concurrency {kv.concurrency:.2f}x: "
    if kv.blocks is not None:
        blocks = kv.blocks
        if blocks.refusal is None:
            return Verdict("pool_law", True, head + f"holds at least one max_model_len ({max_len:,}) in whole blocks, less the null block")
        short_mib = round((blocks.needed_bytes - max(blocks.check_bytes, 0)) / MIB, 1)
        return Verdict("pool_law", False, head + f"the engine refuses: {blocks.refusal} Short by {short_mib:,.1f} MiB", device, "kv_pool", short_mib)
    pool_ok = kv.tokens >= max_len
    short_mib = round((max_len - kv.tokens) * kv.bytes_per_token / MIB, 1)
    return Verdict(
        "pool_law",
        pool_ok,
        head + (f"holds at least one max_model_len ({max_len:,})" if pool_ok else f"must hold one max_model_len ({max_len:,}): short by {short_mib:,.1f} MiB"),
        None if pool_ok else device,
        None if pool_ok else "kv_pool",
        None if pool_ok else short_mib,
    )


def _arena_calibration(shape: VllmShape) -> expert_arena.ArenaCalibration | None:
    """The printed arena boot, which must carry its utilization: vLLM's budget is total x util
    (vllm/v1/worker/gpu_worker.py Worker.determine_available_memory), so the arena a boot printed
    holds that boot's util, and without it a util change would move nothing."""
    boot = expert_arena.arena_calibration_from(shape.expert_arena_calibration)
    if boot is not None and boot.gpu_memory_utilization is None:
        raise ShapeError(
            "expert_arena_calibration.gpu_memory_utilization: give the utilization the boot ran at "
            "(the arena it printed is that boot's total x util less the other terms; seed 004's boots ran at 0.98)"
        )
    return boot


def _serving_free(shape: VllmShape, devices: list[DeviceLedger], notes: list[str]) -> dict[str, Any]:
    """The card's free memory once serving. vLLM plans every allocation inside total x util
    (vllm/v1/worker/gpu_worker.py Worker.determine_available_memory: the KV cache gets
    total x util less the profiled peak), and the activation working set that peak measured is
    reallocated by torch's caching allocator under load; the expert fork's planner reserves it
    as its runtime overhead. So under load the driver sees at most total x (1 - util) free,
    whatever the boot ledger leaves (seeds/004: "Driver used 30.97 of 31.86 GiB")."""
    serving = {device.name: min(device.free, device.capacity - int(device.capacity * shape.gpu_memory_utilization)) for device in devices}
    lowest = min(serving.values())
    if lowest < min(device.free for device in devices):
        notes.append(
            f"serving: the activation working set is held inside total x util once requests run, so a card keeps at most "
            f"{lowest / MIB:,.1f} MiB free under load (total x (1 - {shape.gpu_memory_utilization:g})), less than the boot ledger's free"
        )
    return {"serving_free_mib": {name: round(free / MIB, 1) for name, free in serving.items()}}


def _price_vllm(shape: VllmShape, devices: list[DeviceLedger], payload: PayloadReader, boots: list[dict[str, Any]]) -> BudgetResult:
    tp = shape.tensor_parallel
    if tp != len(devices):
        raise ShapeError(f"tensor_parallel: {tp}, but {len(devices)} devices are listed (one rank per device)")
    max_len = shape.max_model_len
    try:
        kv_law.normalise_vllm_dtype(shape.kv_cache_dtype)
    except kv_law.KvLawError as exc:
        raise ShapeError(str(exc)) from None

    weights = shape.weights_per_rank
    if weights is None:
        weights = (shape.weights // tp) if shape.weights is not None else 0
    pool = shape.kv_cache_memory_bytes
    graphs = shape.graph_memory
    if graphs is None:
        graphs = GRAPH_BASE_BYTES + GRAPH_PER_CAPTURE_BYTES * shape.graph_captures if shape.graph_captures else 0
    non_torch, arena = shape.non_torch_memory, shape.expert_arena
    overhead = shape_overhead(shape)
    notes: list[str] = []
    arena_facts: dict[str, Any] = {}
    for device in devices:
        # vllm/v1/worker/gpu_worker.py Worker.determine_available_memory: requested_memory =
        # total x utilization (request_memory rounds it up: one byte, not modelled), of which the
        # KV cache gets what the profile run leaves: weights, the activation peak
        # (runtime_overhead), non-torch memory and the CUDA-graph estimate all come out of it.
        budget = int(device.capacity * shape.gpu_memory_utilization)
        plan = None
        if shape.expert_offload and arena is None and overhead:
            arena_boot = _arena_calibration(shape)
            plan = expert_arena.plan_arena(
                budget=budget,
                non_expert=weights,
                graphs=graphs,
                overhead=overhead,
                max_model_len=max_len,
                reserve_per_token=shape.kv_reserve_per_token,
                slot_bytes=shape.expert_slot_bytes,
                calibration=arena_boot,
                capacity=device.capacity,
                utilization=shape.gpu_memory_utilization,
            )
        device_arena = plan.arena_bytes if plan is not None else (arena or 0)
        device_pool = pool if pool is not None else max(budget - weights - graphs - overhead - non_torch - device_arena, 0)
        device.add("weights", weights)
        device.add("kv_pool", device_pool, "--kv-cache-memory-bytes" if pool is not None else "what the utilization budget leaves")
        device.add("graphs", graphs)
        if plan is not None:
            # The planner's overhead is a reservation inside its plan, not memory the card holds
            # (seeds/000: "weights 6.28 + pool 6.80 + graphs 0.55 + arena 16.65 + non-torch 1.45 = 31.73").
            arena_note = f"max_model_len x {shape.kv_reserve_per_token} B reserve, overhead {overhead / GIB:.2f} GiB ({plan.basis})"
            device.add("expert_arena", plan.arena_bytes, arena_note)
            arena_facts = {
                "arena_bytes": plan.arena_bytes,
                "arena_gib": round(plan.arena_bytes / GIB, 2),
                "arena_slots": plan.slots,
                "planner_overhead_bytes": overhead,
                "kv_reserve_bytes": plan.reserve,
                "arena_basis": plan.basis,
            }
            if plan.note not in notes:
                notes.append(plan.note)
        else:
            device.add("runtime_overhead", overhead)
            if shape.expert_offload or arena is not None:
                # No planner overhead to size the arena by: the arena takes what remains of the
                # utilization budget (an upper bound); vLLM counts non-torch memory inside it.
                remainder = max(budget - weights - device_pool - graphs - overhead - non_torch, 0)
                device.add("expert_arena", arena if arena is not None else remainder, "declared" if arena is not None else "remainder of the budget")
                if arena is None and "expert arena: no runtime_overhead, so the remainder of the budget (an upper bound)" not in notes:
                    notes.append("expert arena: no runtime_overhead, so the remainder of the budget (an upper bound)")
        device.add("non_torch", non_torch)
    add_extra_terms(devices, shape.extra_terms)
    if pool is None and devices[0].kind == "cpu":
        # vllm/v1/worker/cpu_worker.py determine_available_memory: without an explicit KV space the
        # CPU worker takes ceil(node total x utilization) less its own RSS after warm-up.
        notes.append("cpu: no kv_cache_memory_bytes, so the pool is the engine's node memory x utilization less its RSS, not priced exactly")

    pool_bytes = sum(t.bytes for t in devices[0].terms if t.name == "kv_pool")
    geometry = payload.geometry(shape.model_geometry, shape.model_file, "model")
    try:
        key = calibration.geometry_key(shape, geometry)
        kv = kv_law.vllm_kv(
            pool_bytes, max_len, shape.kv_cache_dtype, _calibrations(shape) + vllm_points(boots, key), geometry, tp, **block_plan(shape, devices[0].kind)
        )
    except kv_law.KvLawError as exc:
        raise ShapeError(str(exc)) from None
    if kv.basis not in ("measured", "exact"):
        notes.append(kv.note)
    verdicts = [_pool_verdict(kv, max_len, devices[0].name)]
    verdicts.extend(_capacity_verdicts(devices, shape.free_floor, shape.max_device_gap))
    if shape.weights_per_rank is None and shape.weights is None and devices[0].kind != "cpu":
        # Free memory with no weights term is no figure at all: the weights are most of a card.
        verdicts.append(
            Verdict(
                "weights",
                False,
                "weights: the shape gives no weights, so the card's free memory is not known; give weights_per_rank "
                "(or weights, divided over the ranks): the model's safetensors size, or the boot's 'Model loading took N GiB' line",
                devices[0].name,
                "weights",
            )
        )
    if devices[0].kind != "cpu":
        arena_facts.update(_serving_free(shape, devices, notes))
    verdicts.extend(rules.judge(shape, devices, geometry, payload.path(shape.model_file), notes))
    client, client_judged = client_verdicts(shape)
    verdicts.extend(client_judged)
    spec = calibration.geometry_spec(geometry) if geometry is not None else None
    return BudgetResult(NAME, devices, {**kv.as_dict(), **arena_facts}, client, verdicts, [], notes, key, spec)


# --- boot lines and calibration -------------------------------------------------------------------

_VLLM_KV_TOKENS = re.compile(r"(GPU|CPU|XPU|TPU) KV cache size:\s*" + NUM + r"\s*tokens")
_VLLM_CONCURRENCY = re.compile(r"Maximum concurrency for\s*" + NUM + r"\s*tokens per request:\s*" + NUM + r"\s*x")
_VLLM_AVAILABLE = re.compile(r"Available KV cache memory:\s*" + SIZE)
# The CPU worker prints no "Available KV cache memory" line; its KV space is on this one
# (vllm/v1/worker/cpu_worker.py determine_available_memory): "Explicitly set (0.01/23.54) GiB for
# KV cache on node 0." or "Auto set (X/Y) GiB for KV cache on node N, ...", in GiB of 0.01.
_VLLM_CPU_KV = re.compile(r"(?:Explicitly|Auto) set \((\d+(?:\.\d+)?)/\d+(?:\.\d+)?\) GiB for KV cache")
_VLLM_MODEL = re.compile(r"Model loading took\s*" + SIZE)
_VLLM_GRAPHS = re.compile(r"Graph capturing finished in .*?took\s*" + SIZE)
_VLLM_EXPERT = re.compile(r"(?i)expert[^:=\n]*(?:cache|arena|buffer)[^:=\n]*[:=]\s*" + SIZE)
# The expert-offload fork's plan lines (seeds/004): "expert cache space 14.87 GiB / 6,496 slots of
# 2.344 MiB", "swap region 13.7 GiB / 5986 slots", "runtime overhead 5.25 GiB".
_VLLM_EXPERT_SPACE = re.compile(r"(?i)expert cache space\s*" + SIZE + r"\s*/\s*" + NUM + r"\s*slots(?:\s*of\s*" + SIZE + r")?")
_VLLM_SWAP_REGION = re.compile(r"(?i)swap region\s*" + SIZE + r"\s*/\s*" + NUM + r"\s*slots")
_VLLM_OVERHEAD = re.compile(r"(?i)runtime overhead\s*[:=]?\s*" + SIZE)


def _parse_vllm_line(line: str, ledger: BootLedger) -> None:
    match = _VLLM_KV_TOKENS.search(line)
    if match:
        ledger.kv_device = match.group(1)
        ledger.kv_tokens = to_int(match.group(2))
        # vLLM 0.32 prints the concurrency on the same line: read on.
    match = _VLLM_CONCURRENCY.search(line)
    if match:
        ledger.concurrency_len = to_int(match.group(1))
        ledger.concurrency = to_float(match.group(2))
        return
    match = _VLLM_AVAILABLE.search(line)
    if match:
        ledger.kv_available_bytes = parse_size(match.group(1), "Available KV cache memory")
        return
    match = _VLLM_CPU_KV.search(line)
    if match:
        ledger.kv_available_bytes = parse_size(f"{match.group(1)} GiB", "KV cache space")
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
        ledger.arena_slots = to_int(match.group(2))
        if match.group(3):
            ledger.arena_slot_bytes = parse_size(match.group(3), "expert slot")
    match = _VLLM_SWAP_REGION.search(line)
    if match:
        ledger.swap_region_bytes = parse_size(match.group(1), "swap region")
        ledger.swap_region_slots = to_int(match.group(2))
    match = _VLLM_OVERHEAD.search(line)
    if match:
        ledger.runtime_overhead_bytes = parse_size(match.group(1), "runtime overhead")


def vllm_points(boots: list[dict[str, Any]], key: str, exclude: dict[str, Any] | None = None) -> list[kv_law.VllmCalibration]:
    """Stored vLLM boots of this geometry as calibration points (pool bytes -> engine tokens)."""
    points = []
    for boot in boots:
        if boot.get("geometry_key") != key or (exclude is not None and calibration.boot_identity(boot) == calibration.boot_identity(exclude)):
            continue
        tokens = (boot.get("ledger") or {}).get("kv_tokens")
        pool = boot.get("pool_bytes")
        shape = calibration.stored_shape(boot, VllmShape)
        if tokens and pool and isinstance(shape, VllmShape):
            points.append(kv_law.VllmCalibration(shape.kv_cache_dtype, shape.max_model_len, int(pool), int(tokens), f"boot {boot.get('recorded_at', '')}"))
    return points


def _compare_vllm(
    boot: dict[str, Any], boots: list[dict[str, Any]], shape: VllmShape, ledger: dict[str, Any], geometry: kv_law.ModelGeometry | None
) -> dict[str, Any]:
    if not ledger.get("kv_tokens"):
        return {"agree": None, "detail": "the boot printed no KV cache size line"}
    if not boot.get("pool_bytes"):
        return {"agree": None, "detail": "no pool size recorded for this boot"}
    others = vllm_points(boots, str(boot.get("geometry_key")), exclude=boot)
    # The boot's own capacity line names its platform ("CPU KV cache size"): its block size.
    kind = "cpu" if ledger.get("kv_device") == "CPU" else "gpu"
    kv = kv_law.vllm_kv(int(boot["pool_bytes"]), shape.max_model_len, shape.kv_cache_dtype, others, geometry, shape.tensor_parallel, **block_plan(shape, kind))
    predicted = {"kv_tokens": kv.tokens, "concurrency": round(kv.concurrency, 2)}
    measured = {"kv_tokens": int(ledger["kv_tokens"]), "concurrency": round(float(ledger.get("concurrency") or 0), 2)}
    agree = predicted == measured
    detail = f"{kv.basis}: {kv.note}"
    arena = _predict_arena(shape, ledger)
    if arena is not None:
        # The arena law is a plan figure, right to ~0.3% (docs/vram_budget.md): it agrees within 1%.
        predicted["arena_gib"], measured["arena_gib"] = round(arena.arena_bytes / GIB, 2), round(ledger["arena_bytes"] / GIB, 2)
        if arena.slots is not None and ledger.get("arena_slots"):
            predicted["arena_slots"], measured["arena_slots"] = arena.slots, int(ledger["arena_slots"])
        agree = agree and abs(arena.arena_bytes - ledger["arena_bytes"]) <= ARENA_TOLERANCE * ledger["arena_bytes"]
        detail += f"; {arena.note}"
    return {"predicted": predicted, "measured": measured, "agree": agree, "detail": detail}


ARENA_TOLERANCE = 0.01


def _predict_arena(shape: VllmShape, ledger: dict[str, Any]) -> expert_arena.ArenaPlan | None:
    """The arena law's figure for a boot that printed `expert cache space`, where the shape gives
    a calibration boot at the same utilization (the stored boot records no card size)."""
    calibration_boot = expert_arena.arena_calibration_from(shape.expert_arena_calibration)
    if not ledger.get("arena_bytes") or calibration_boot is None:
        return None
    if calibration_boot.gpu_memory_utilization not in (None, shape.gpu_memory_utilization):
        return None
    return expert_arena.plan_arena(
        budget=0,
        non_expert=0,
        graphs=0,
        overhead=shape_overhead(shape),
        max_model_len=shape.max_model_len,
        reserve_per_token=shape.kv_reserve_per_token,
        slot_bytes=shape.expert_slot_bytes,
        calibration=calibration_boot,
    )


# --- the driver ------------------------------------------------------------------------------------


class Vllm(Runtime):
    name = NAME
    shape_class = VllmShape
    api_key_env = "VLLM_API_KEY"
    native_program = "vllm"
    in_flight_gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    alert_rules = (
        AlertRule("RequestsQueueing", "vllm:num_requests_waiting{sel} > 0", "5m", "warning", "{name}: requests wait for the scheduler"),
        AlertRule("KvPoolNearlyFull", "vllm:kv_cache_usage_perc{sel} > 0.95", "10m", "warning", "{name}: the KV pool is over 95% used"),
        AlertRule(
            "SpeculativeDecodingOff",
            "rate(vllm:generation_tokens_total{sel}[10m]) > 0 and rate(vllm:spec_decode_num_drafts_total{sel}[10m]) == 0",
            "10m",
            "warning",
            "{name}: generating without drafts although the shape has a drafter",
            "has_drafter",
        ),
    )
    panels = (
        Panel("Requests running / waiting", (("vllm:num_requests_running{sel}", "{{job}} running"), ("vllm:num_requests_waiting{sel}", "{{job}} waiting"))),
        Panel("KV pool used", (("vllm:kv_cache_usage_perc{sel}", "{{job}}"),), "percentunit"),
        Panel("Generation tokens/s", (("rate(vllm:generation_tokens_total{sel}[1m])", "{{job}}"),)),
        Panel("Prompt tokens/s", (("rate(vllm:prompt_tokens_total{sel}[1m])", "{{job}}"),)),
        Panel(
            "Time to first token p50 / p95",
            (
                ("histogram_quantile(0.5, sum by (le, job) (rate(vllm:time_to_first_token_seconds_bucket{sel}[5m])))", "{{job}} p50"),
                ("histogram_quantile(0.95, sum by (le, job) (rate(vllm:time_to_first_token_seconds_bucket{sel}[5m])))", "{{job}} p95"),
            ),
            "s",
        ),
        Panel(
            "Prefix cache hit rate",
            (("rate(vllm:prefix_cache_hits_total{sel}[5m]) / rate(vllm:prefix_cache_queries_total{sel}[5m])", "{{job}}"),),
            "percentunit",
        ),
        Panel("Preemptions/s", (("rate(vllm:num_preemptions_total{sel}[5m])", "{{job}}"),)),
        Panel(
            "Draft acceptance",
            (("rate(vllm:spec_decode_num_accepted_tokens_total{sel}[5m]) / rate(vllm:spec_decode_num_draft_tokens_total{sel}[5m])", "{{job}}"),),
            "percentunit",
        ),
    )
    # "This model's maximum context length is 4096 tokens. However, your request has 9000 input tokens."
    refusal = RefusalContract(
        (re.compile(r"maximum context length is (\d+) tokens"),),
        (re.compile(r"(?:your request has|you requested|your prompt contains(?: at least)?) (\d+) (?:input )?tokens"),),
    )

    def argv(self, shape: Any, model_root: str = "", entry: list[str] | None = None) -> list[str]:
        return vllm_argv(shape, model_root, entry)

    def environment(self, shape: Any, model_root: str = "") -> dict[str, str]:
        # Where the engine's Python finds the key guard --middleware names (host and container alike).
        return {"PYTHONPATH": KEY_GUARD_DIR}

    def price(self, shape: Any, devices: list[DeviceLedger], payload: PayloadReader, boots: list[dict[str, Any]]) -> BudgetResult:
        return _price_vllm(shape, devices, payload, boots)

    def payload_names(self, shape: Any) -> list[PayloadName]:
        # --model is a Hugging Face directory ('.' the payload directory itself) whose config.json
        # the engine reads first, or a single GGUF file. A drafter in speculative_config is passed to
        # the engine as written (a Hub id or the engine's own path), so it is not a payload name here.
        if not shape.model_file:
            return []
        if str(shape.model_file).endswith(".gguf"):
            return [PayloadName("model_file", shape.model_file, FILE)]
        return [PayloadName("model_file", shape.model_file, DIRECTORY, ("config.json",))]

    def prices_on_controller(self, shape: Any) -> bool:
        # Priced from its calibration: nothing is read from the host.
        return bool(shape.model_geometry or shape.calibration)

    def controller_geometry_source(self, shape: Any) -> bool:
        return False

    def parse_boot_line(self, line: str, ledger: BootLedger) -> None:
        _parse_vllm_line(line, ledger)

    def claims_boot(self, ledger: BootLedger) -> bool:
        return ledger.kv_tokens is not None or ledger.concurrency is not None

    def compare_boot(self, boot: dict[str, Any], boots: list[dict[str, Any]], shape: Any, geometry: Any) -> dict[str, Any]:
        return _compare_vllm(boot, boots, shape, boot.get("ledger") or {}, geometry)

    def calibration_points(self, boots: list[dict[str, Any]], key: str) -> list[Any]:
        return vllm_points(boots, key)


DRIVER = Vllm()
