# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The endpoint's shape, typed: the one place that declares every shape key.

An inventory holds a shape as a plain mapping (`endpoint_shape`). `parse_shape()` turns it into
a `LlamaCppShape` or a `VllmShape`: it owns every default, every per-runtime required key, every
range and every error, and each error names the field and the fix. Everything that reads a shape
(the budget, the engine argv, the calibration store, the client contract, observability, the CLI)
takes the typed shape, so the gate prices exactly the shape that launches.

Each key is declared once, as a dataclass field whose metadata carries its kind, its help text
and its bounds; the role's argument_specs and the docs' shape table are generated from that
metadata (`SHAPE_FIELDS`), and a test proves they agree with the parser.

Paths (`model_file`, `projector`, `drafter`) are relative to the endpoint's payload directory
(absolute paths are taken as they are); `resolve_path()` places them where the host or the engine
sees the payload.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, SizeError, parse_size

RUNTIMES = ("llamacpp", "vllm")
BOTH = frozenset(RUNTIMES)
LLAMACPP = frozenset({"llamacpp"})
VLLM = frozenset({"vllm"})

# Upper bounds on every count an inventory (or a stored record) can carry: a typo such as
# `ctx_size: 4000000000` fails here with the bound named, never as a runaway allocation later.
MAX_TOKENS = 1 << 24  # 16,777,216 positions: far beyond any trained window
MAX_SLOTS = 4096
MAX_BYTES = 1 << 50  # 1 PiB
MAX_LAYERS = 100_000


class ShapeError(ValueError):
    """A shape field that is missing, unknown, of the wrong kind or out of range; names the field."""


def _key(kind: str, help_text: str, runtimes: frozenset[str] = BOTH, *, default: Any = None, group: str = "engine", **rules: Any) -> Any:
    """A shape key: its kind (int, size, float, bool, str, choice, args, split, overrides, sizes,
    mapping, list), help text, the runtimes that take it, its default and its bounds."""
    meta = {"kind": kind, "help": help_text, "runtimes": runtimes, "group": group, **rules}
    return field(default=default, metadata=meta)  # pylint: disable=invalid-field-call  # called only from the dataclass bodies below


# --- coercion: each kind once, every message names the field -----------------------------------


def parse_int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
        raise ShapeError(f"{name}: expected a whole number, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ShapeError(f"{name}: expected a whole number, got {value!r}")
        number = int(value)
    else:
        try:
            number = int(str(value).strip().replace(",", "").replace("_", ""))
        except ValueError:
            raise ShapeError(f"{name}: expected a whole number, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ShapeError(f"{name}: must be at least {minimum:,}, got {number:,}")
    if maximum is not None and number > maximum:
        raise ShapeError(f"{name}: must be at most {maximum:,}, got {number:,}")
    return number


def parse_bytes(value: Any, name: str, maximum: int = MAX_BYTES) -> int:
    try:
        number = parse_size(value, name)
    except SizeError as exc:
        raise ShapeError(str(exc)) from None
    if number > maximum:
        raise ShapeError(f"{name}: must be at most {maximum / GIB:,.0f} GiB, got {value!r}")
    return number


def parse_float(value: Any, name: str) -> float:
    if isinstance(value, bool):
        raise ShapeError(f"{name}: expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ShapeError(f"{name}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ShapeError(f"{name}: expected a finite number, got {value!r}")
    return number


def parse_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    raise ShapeError(f"{name}: expected true or false, got {value!r}")


def parse_text(value: Any, name: str) -> str:
    """A single-line string: it reaches an argv, a unit file or a record, where a newline or a
    control character could smuggle in another directive."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ShapeError(f"{name}: expected a string, got {value!r}")
    text = str(value)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise ShapeError(f"{name}: control characters (newline, carriage return, ...) are not allowed in {text!r}")
    return text


def _parse_args(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise ShapeError(f"{name}: expected a list of arguments, e.g. [--log-verbosity, '4']")
    return tuple(parse_text(item, f"{name}[{index}]") for index, item in enumerate(value))


def _parse_split(value: Any, name: str) -> tuple[float, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ShapeError(f"{name}: expected a list of shares or 'a,b', e.g. [36, 29]")
    shares = tuple(parse_float(item, f"{name}[{index}]") for index, item in enumerate(items))
    if any(share < 0 for share in shares) or sum(shares) <= 0:
        raise ShapeError(f"{name}: shares must be non-negative and not all zero, got {value!r}")
    return shares


def _parse_overrides(value: Any, name: str) -> tuple[tuple[str, str], ...]:
    """llama.cpp --override-tensor: a mapping pattern -> buffer, or a list of {pattern, buffer}."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(item, Mapping) for item in value):
        pairs = [(item.get("pattern"), item.get("buffer")) for item in value]
    else:
        raise ShapeError(f"{name}: expected a mapping pattern -> buffer, e.g. {{exps: CPU}}")
    out = []
    for pattern, buffer in pairs:
        if not pattern or not buffer or any(ch in str(pattern) for ch in ",=") or "," in str(buffer):
            raise ShapeError(f"{name}: {pattern!r}={buffer!r} is not a usable pattern=buffer pair")
        out.append((parse_text(pattern, f"{name}.{pattern}"), parse_text(buffer, f"{name}.{pattern}")))
    return tuple(out)


def override_tensor_order(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The order llama.cpp receives the --override-tensor pairs in: longest (most specific) pattern
    first, because its loader takes the first match and a broad pattern first would swallow the
    specific ones (seed 001: "the loader is first-match-wins, so the specific patterns must precede
    the broad exps=CPU sweep"). The argv is joined in this order and the budget places in it."""
    return tuple(sorted(pairs, key=lambda pair: -len(pair[0])))


def _parse_sizes(value: Any, name: str) -> int | tuple[int, ...]:
    """One size for every device, or one per device."""
    if isinstance(value, (list, tuple)):
        return tuple(parse_bytes(item, f"{name}[{index}]") for index, item in enumerate(value))
    return parse_bytes(value, name)


def _coerce(meta: Mapping[str, Any], value: Any, name: str) -> Any:
    kind = meta["kind"]
    if kind == "int":
        return parse_int(value, name, meta.get("minimum", 0), meta.get("maximum"))
    if kind == "size":
        return parse_bytes(value, name)
    if kind == "float":
        number = parse_float(value, name)
        low, high = meta.get("above"), meta.get("below")
        if (low is not None and number <= low) or (high is not None and number >= high):
            raise ShapeError(f"{name}: {number} is out of range: {meta['range_help']}")
        return number
    if kind == "bool":
        return parse_bool(value, name)
    if kind in ("str", "choice"):
        text = parse_text(value, name)
        if kind == "choice" and text not in meta["choices"]:
            raise ShapeError(f"{name}: expected one of {', '.join(meta['choices'])}, got {text!r}")
        return text
    if kind == "args":
        return _parse_args(value, name)
    if kind == "split":
        return _parse_split(value, name)
    if kind == "overrides":
        return _parse_overrides(value, name)
    if kind == "sizes":
        return _parse_sizes(value, name)
    if kind == "mapping":
        if not isinstance(value, Mapping):
            raise ShapeError(f"{name}: expected a mapping, got {value!r}")
        return dict(value)
    if kind == "list":
        if not isinstance(value, (list, tuple)):
            raise ShapeError(f"{name}: expected a list, got {value!r}")
        return tuple(value)
    raise AssertionError(f"unknown shape kind {kind}")  # a declaration bug, not an input error


# --- the shapes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What every runtime takes."""

    runtime: str = _key("choice", "The engine: llamacpp or vllm.", choices=RUNTIMES, required=True, group="identity")
    launch: str = _key(
        "choice",
        "native (a binary under the root unit) or podman (a container under the root unit).",
        default="native",
        choices=("native", "podman"),
        group="identity",
    )
    served_id: str | None = _key(
        "str", "The model id clients ask for (llama.cpp --alias, vLLM --served-model-name); default the endpoint's name.", group="identity"
    )
    port: int | None = _key("int", "The endpoint's port (required to serve).", minimum=1, maximum=65535, group="identity")
    bind: str = _key("str", "Address the engine listens on: loopback unless the inventory declares the LAN.", default="127.0.0.1", group="identity")
    probe_host: str = _key("str", "Address the health gate and the probes use.", default="127.0.0.1", group="identity")
    model_file: str | None = _key(
        "str", "The model's path relative to the payload directory (the first part of a split GGUF, or '.' for a Hugging Face directory)."
    )
    restart_sec: int = _key("int", "The unit's RestartSec.", default=5, minimum=0, maximum=3600, group="unit")
    extra_args: tuple[str, ...] = _key("args", "Further engine arguments, as a list.", default=())
    chat_template_kwargs: Mapping[str, Any] | None = _key(
        "mapping",
        "Chat-template kwargs as JSON: llama.cpp --chat-template-kwargs, vLLM --default-chat-template-kwargs.",
    )
    known_bad: tuple[Any, ...] = _key(
        "list",
        "Budget - shapes this model cannot run [{<key>: <value>, ..., reason}]: a shape matching an entry is refused.",
        default=(),
        group="budget",
    )
    # The budget's own knobs.
    free_floor: int = _key("size", "Budget - the free memory each device must keep.", default=parse_size("1.5 GiB"), group="budget")
    max_device_gap: int = _key("size", "Budget - the most two devices' use may differ.", default=parse_size("0.5 GiB"), group="budget")
    extra_terms: tuple[Any, ...] = _key("list", "Budget - declared extra terms [{name, size, device}].", default=(), group="budget")
    model_geometry: Mapping[str, Any] | None = _key("mapping", "Budget - the model geometry, where its header or config is not readable.", group="budget")
    # The client contract.
    reasoning_control: str | None = _key(
        "choice", "Client contract - how the chat template switches reasoning.", choices=("enable_thinking", "reasoning_effort", "none"), group="client"
    )
    client_base_url: str | None = _key("str", "Client contract - the URL clients use (default http://HOST:PORT/v1).", group="client")
    client_gap: int | None = _key("int", "Client contract - the gap between the engine ceiling and the advertised window.", maximum=MAX_TOKENS, group="client")
    client_max_tokens: int | None = _key("int", "Client contract - maxTokens.", minimum=1, maximum=MAX_TOKENS, group="client")
    reasoning_efforts: tuple[str, ...] = _key(
        "list",
        "Client contract - the reasoning_effort values the template accepts, e.g. [low, medium, xhigh].",
        default=(),
        group="client",
    )

    @property
    def has_drafter(self) -> bool:
        return bool(getattr(self, "drafter", None) or getattr(self, "speculative_config", None) or getattr(self, "spec_type", None))

    @property
    def has_projector(self) -> bool:
        return bool(getattr(self, "projector", None) or getattr(self, "projector_bytes", None))

    @property
    def slots(self) -> int:
        """Concurrent sequences: llama.cpp --parallel, vLLM --max-num-seqs."""
        raise NotImplementedError

    @property
    def kv_dtypes(self) -> tuple[str, ...]:
        raise NotImplementedError

    def as_dict(self) -> dict[str, Any]:
        """The shape as a plain mapping (every declared key that is set), for records and results."""
        out: dict[str, Any] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value is None or value == ():
                continue
            if item.metadata["kind"] == "overrides":
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[item.name] = value
        return out

    def replace(self, **changes: Any) -> Shape:
        """A copy with some keys changed, parsed again (so the change is validated too)."""
        return parse_shape({**self.as_dict(), **changes})


@dataclass(frozen=True)
class LlamaCppShape(Shape):
    """llama.cpp `llama-server`."""

    ctx_size: int = _key("int", "llama.cpp --ctx-size: the pool, divided into --parallel windows.", LLAMACPP, required=True, minimum=1, maximum=MAX_TOKENS)
    parallel: int = _key("int", "llama.cpp --parallel (slots); each gets ctx_size / parallel positions.", LLAMACPP, default=1, minimum=1, maximum=MAX_SLOTS)
    type_k: str = _key("str", "llama.cpp K cache type (f16, q8_0, q4_0, ...).", LLAMACPP, default="f16")
    type_v: str | None = _key("str", "llama.cpp V cache type (default: type_k).", LLAMACPP)
    kv_unified: bool = _key("bool", "llama.cpp --kv-unified (one pool shared by all slots).", LLAMACPP, default=False)
    swa_full: bool = _key("bool", "llama.cpp --swa-full (full-size sliding-window caches).", LLAMACPP, default=False)
    batch: int | None = _key("int", "llama.cpp --batch-size.", LLAMACPP, minimum=1, maximum=1 << 20)
    ubatch: int = _key("int", "llama.cpp --ubatch-size (compute buffers scale with it).", LLAMACPP, default=512, minimum=1, maximum=1 << 16)
    n_gpu_layers: int = _key("int", "llama.cpp --n-gpu-layers: the last N layers go to the devices.", LLAMACPP, default=999, maximum=MAX_LAYERS)
    tensor_split: tuple[float, ...] | None = _key("split", "llama.cpp --tensor-split, a list of shares or 'a,b' (whole layers move).", LLAMACPP)
    override_tensor: tuple[tuple[str, str], ...] | None = _key(
        "overrides", "llama.cpp --override-tensor, a mapping pattern -> buffer (most specific pattern first in the flag).", LLAMACPP
    )
    projector: str | None = _key("str", "llama.cpp --mmproj: the vision projector, relative to the payload directory.", LLAMACPP)
    projector_bytes: int | None = _key("size", "Budget - the projector's size, when its GGUF is not readable where the budget runs.", LLAMACPP, group="budget")
    drafter: str | None = _key("str", "llama.cpp --model-draft: the drafter GGUF, relative to the payload directory (its own header sizes its KV).", LLAMACPP)
    drafter_geometry: Mapping[str, Any] | None = _key("mapping", "Budget - the drafter's geometry, when its header is not readable.", LLAMACPP, group="budget")
    drafter_type_k: str | None = _key("str", "Budget - the drafter's K cache type (default: type_k).", LLAMACPP, group="budget")
    drafter_type_v: str | None = _key("str", "Budget - the drafter's V cache type (default: type_v).", LLAMACPP, group="budget")
    spec_type: str | None = _key(
        "str",
        "llama.cpp --spec-type, e.g. draft-mtp,ngram-mod: at most ONE draft-* type; ngram-* are draftless.",
        LLAMACPP,
    )
    draft_max: int | None = _key("int", "llama.cpp --spec-draft-n-max (draft depth; b11030-era flag).", LLAMACPP, minimum=1, maximum=64)
    drafter_block_size: int | None = _key(
        "int",
        "The drafter's block size (DFlash2 8, DSpark 7): draft_max <= block size - 1. Not a flag.",
        LLAMACPP,
        minimum=2,
        maximum=64,
    )
    draft_device: str | None = _key("str", "llama.cpp --device-draft: the device the drafter runs on (ROCm1, CUDA0).", LLAMACPP)
    drafter_borrows_output: bool = _key(
        "bool",
        "The drafter borrows the target's output head (a shared MTP head): with override_tensor it must run on the output layer's device. Not a flag.",
        LLAMACPP,
        default=False,
    )
    cache_ram: int | None = _key("size", "llama.cpp --cache-ram: the prompt cache in host RAM, as a size.", LLAMACPP)
    host_ram: int | None = _key("size", "Budget - the host's RAM, for the prompt-cache law.", LLAMACPP, group="budget")
    jinja: bool = _key("bool", "llama.cpp --jinja (the model's chat template).", LLAMACPP, default=True)
    chat_template_file: str | None = _key("str", "llama.cpp --chat-template-file, relative to the payload directory.", LLAMACPP)
    reasoning_format: str | None = _key("str", "llama.cpp --reasoning-format (e.g. deepseek: reasoning lands in reasoning_content).", LLAMACPP)
    flash_attn: bool | None = _key("bool", "llama.cpp --flash-attn: true renders 'on', false 'off'; unset leaves the build's auto.", LLAMACPP)
    log_verbosity: int | None = _key(
        "int", "llama.cpp --log-verbosity (-lv); 4 prints the per-buffer load ledger (KV, compute, projector) a boot record needs.", LLAMACPP, maximum=10
    )
    compute_buffer: int | tuple[int, ...] | None = _key(
        "sizes", "Budget - compute buffers, one size or one per device (they scale with ubatch).", LLAMACPP, group="budget"
    )
    slot_calibration: Mapping[str, Any] | None = _key(
        "mapping", "Budget - two measured boots {boots: [{slots, used}, ...]}: the slot ceiling.", LLAMACPP, group="budget"
    )

    @property
    def slots(self) -> int:
        return self.parallel

    @property
    def cache_type_v(self) -> str:
        return self.type_v or self.type_k

    @property
    def kv_dtypes(self) -> tuple[str, ...]:
        return (self.type_k, self.cache_type_v)


@dataclass(frozen=True)
class VllmShape(Shape):
    """vLLM's OpenAI server."""

    max_model_len: int = _key("int", "vLLM --max-model-len.", VLLM, required=True, minimum=1, maximum=MAX_TOKENS)
    max_num_seqs: int = _key("int", "vLLM --max-num-seqs.", VLLM, default=1, minimum=1, maximum=MAX_SLOTS)
    kv_cache_dtype: str = _key("str", "vLLM --kv-cache-dtype (auto, bf16, fp8, ...).", VLLM, default="auto")
    kv_cache_memory_bytes: int | None = _key("size", "vLLM --kv-cache-memory-bytes, per rank, as a size.", VLLM)
    max_num_batched_tokens: int | None = _key("int", "vLLM --max-num-batched-tokens.", VLLM, minimum=1, maximum=MAX_TOKENS)
    tensor_parallel: int = _key("int", "vLLM --tensor-parallel-size (one rank per device).", VLLM, default=1, minimum=1, maximum=64)
    gpu_memory_utilization: float = _key(
        "float",
        "vLLM --gpu-memory-utilization, a fraction of the whole card, below 1.0.",
        VLLM,
        default=0.9,
        above=0.0,
        below=1.0,
        range_help="above 0 and below 1.0 (1.0 is unbootable: worker init demands free memory above the budget); use at most 0.98",
    )
    prefix_caching: bool = _key("bool", "vLLM --enable-prefix-caching.", VLLM, default=False)
    tool_parser: str | None = _key("str", "vLLM --tool-call-parser (enables auto tool choice).", VLLM)
    reasoning_parser: str | None = _key("str", "vLLM --reasoning-parser.", VLLM)
    speculative_config: Mapping[str, Any] | None = _key("mapping", "vLLM --speculative-config (a drafter: draft model, MTP or n-gram).", VLLM)
    calibration: tuple[Any, ...] = _key("list", "Budget - measured boots [{kv_dtype, max_model_len, pool_bytes, tokens}].", VLLM, default=(), group="budget")
    weights_per_rank: int | None = _key("size", "Budget - weights per rank.", VLLM, group="budget")
    weights: int | None = _key("size", "Budget - weights in total (divided over the ranks).", VLLM, group="budget")
    graph_memory: int | None = _key("size", "Budget - measured graph memory per rank.", VLLM, group="budget")
    graph_captures: int | None = _key("int", "Budget - captured graphs (the engine's estimate: 256 MiB + 52 MiB each).", VLLM, maximum=1024, group="budget")
    runtime_overhead: int = _key("size", "Budget - vLLM runtime overhead per rank.", VLLM, default=0, group="budget")
    non_torch_memory: int = _key("size", "Budget - non-torch memory per rank.", VLLM, default=0, group="budget")
    attention_backend: str | None = _key("str", "vLLM --attention-backend (e.g. TURBOQUANT; some builds ignore the VLLM_ATTENTION_BACKEND env var).", VLLM)
    expert_arena: int | None = _key("size", "Budget - the expert arena per rank, declared.", VLLM, group="budget")
    expert_offload: bool = _key(
        "bool",
        "vLLM --enable-expert-offload (tcclaviger RDNA4 fork only); the planner sizes the arena from max_model_len, never from the pool.",
        VLLM,
        default=False,
    )
    expert_precise_memory: bool = _key(
        "bool",
        "vLLM --expert-precise-memory (tcclaviger RDNA4 fork only): the planner charges precise_runtime_overhead, not the default.",
        VLLM,
        default=False,
    )
    precise_runtime_overhead: int | None = _key(
        "size", "Budget - the fitted overhead per rank that --expert-precise-memory selects (5.25 GiB on gfx1201 TP2).", VLLM, group="budget"
    )
    kv_reserve_per_token: int = _key(
        "int",
        "Budget - the expert planner's KV reserve per token of max_model_len, bytes (seeds/004: 9190).",
        VLLM,
        default=9190,
        minimum=1,
        maximum=1 << 24,
        group="budget",
    )
    expert_slot_bytes: int | None = _key(
        "size", "Budget - one expert slot's size (2.344 MiB for qwen3.8-flash-next FP8), for the slot count.", VLLM, group="budget"
    )
    expert_arena_calibration: Mapping[str, Any] | None = _key(
        "mapping", "Budget - a boot's printed arena {max_model_len, runtime_overhead, arena}: the arena law moves it.", VLLM, group="budget"
    )

    @property
    def slots(self) -> int:
        return self.max_num_seqs

    @property
    def kv_dtypes(self) -> tuple[str, ...]:
        return (self.kv_cache_dtype,)


SHAPE_CLASSES: dict[str, type[Shape]] = {"llamacpp": LlamaCppShape, "vllm": VllmShape}


@dataclass(frozen=True)
class ShapeField:
    """One declared shape key, as the generators (argument_specs, docs) and the parser see it."""

    key: str
    kind: str
    help: str
    runtimes: frozenset[str]
    group: str
    default: Any
    required: bool
    choices: tuple[str, ...] | None


def _declared() -> dict[str, ShapeField]:
    out: dict[str, ShapeField] = {}
    for cls in SHAPE_CLASSES.values():
        for item in dataclasses.fields(cls):
            meta = item.metadata
            if item.name in out:
                continue
            out[item.name] = ShapeField(
                item.name, meta["kind"], meta["help"], meta["runtimes"], meta["group"], item.default, bool(meta.get("required")), meta.get("choices")
            )
    return out


SHAPE_FIELDS: dict[str, ShapeField] = _declared()

# Keys an older inventory may still carry, and what replaced them.
RENAMED = {
    "projector_path": "projector (one key: the path relative to the payload directory)",
    "drafter_path": "drafter (one key: the path relative to the payload directory)",
    "model": "model_file (relative to endpoint_payload_dir)",
    "model_path": "model_file (relative to endpoint_payload_dir)",
    "devices": "endpoint_devices (a variable of its own, not a shape key)",
}


def parse_shape(raw: Any, name: str | None = None) -> Shape:
    """The one parser: a mapping (or a Shape) -> a typed shape. `name` is the endpoint's name, the
    default served id. Raises ShapeError naming the field and the fix."""
    if isinstance(raw, Shape):
        return raw if raw.served_id or not name else dataclasses.replace(raw, served_id=name)
    if not isinstance(raw, Mapping):
        raise ShapeError(f"shape: expected a mapping of shape keys, got {type(raw).__name__}")
    runtime = raw.get("runtime")
    if runtime not in SHAPE_CLASSES:
        raise ShapeError(f"runtime: expected one of {', '.join(RUNTIMES)}, got {runtime!r}")
    cls = SHAPE_CLASSES[runtime]
    taken = {item.name: item for item in dataclasses.fields(cls)}
    for key in raw:
        if key in taken:
            continue
        if key in RENAMED:
            raise ShapeError(f"{key}: no longer a shape key; use {RENAMED[key]}")
        if key in SHAPE_FIELDS:
            other = ", ".join(sorted(SHAPE_FIELDS[key].runtimes))
            raise ShapeError(f"{key}: not a {runtime} key (it belongs to {other}); remove it or change runtime")
        close = difflib.get_close_matches(str(key), list(taken), n=1)
        raise ShapeError(f"{key}: unknown shape key" + (f"; did you mean {close[0]}?" if close else f" for runtime {runtime}"))
    values: dict[str, Any] = {}
    for key, item in taken.items():
        value = raw.get(key)
        if value is None:
            if item.metadata.get("required"):
                raise ShapeError(f"{key}: required for {runtime} shapes ({item.metadata['help']})")
            continue
        values[key] = _coerce(item.metadata, value, key)
    if not values.get("served_id") and name:
        values["served_id"] = parse_text(name, "served_id")
    _check_speculation(values)
    _check_no_key_in_argv(values.get("extra_args") or ())
    if values.get("expert_precise_memory") and not values.get("expert_offload"):
        raise ShapeError("expert_precise_memory: sizes the expert offload arena; set expert_offload: true or remove it")
    _check_known_bad(values, taken)
    _check_reasoning_efforts(values)
    return cls(**values)


# Flags that would put a credential in argv: /proc/PID/cmdline, the unit file, the record and the
# runbooks all show argv. The key goes in endpoint_api_key, which reaches the engine by environment.
_CREDENTIAL_FLAGS = ("--api-key", "--hf-token")


def _check_no_key_in_argv(extra_args: tuple[str, ...]) -> None:
    for arg in extra_args:
        flag = str(arg).split("=", 1)[0]
        if flag in _CREDENTIAL_FLAGS:
            raise ShapeError(
                f"extra_args: {flag} would put a credential in the engine's argv (readable in /proc/PID/cmdline, the unit file and the "
                "records); set endpoint_api_key (from Ansible Vault) instead: the engine gets it by environment"
            )


# --- shapes the fleet paid for: refused before anything is priced or launched ----------------

# Efforts a chat template may accept, lowest first (the harness sends none|low|medium|high).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def spec_chain(spec_type: str | None) -> tuple[str, ...]:
    """The --spec-type chain as its parts."""
    return tuple(part.strip() for part in spec_type.split(",")) if spec_type else ()


def _check_speculation(values: dict[str, Any]) -> None:
    """llama.cpp speculation: one draft context per process, and a depth the drafter can hold."""
    chain = spec_chain(values.get("spec_type"))
    for part in chain:
        if not (part.startswith("draft-") or part.startswith("ngram-")):
            raise ShapeError(
                f"spec_type: {part!r} is not a speculative type; use draft-* (model-backed, e.g. draft-mtp) or ngram-* (draftless, e.g. ngram-mod)"
            )
    drafters = [part for part in chain if part.startswith("draft-")]
    if len(drafters) > 1:
        # 'spec-type draft-mtp,draft-dflash' dies at load: the chain has ONE draft context.
        raise ShapeError(
            f"spec_type: {','.join(drafters)} chains {len(drafters)} model-backed drafters, but a chain has ONE draft context; "
            "keep one draft-* type (ngram-* types are draftless and may chain behind it)"
        )
    depth = values.get("draft_max")
    if depth is not None and not drafters and not values.get("drafter"):
        raise ShapeError("draft_max: sets the draft depth of a model-backed drafter; add spec_type (e.g. draft-mtp) or remove draft_max")
    block = values.get("drafter_block_size")
    if block is not None and depth is not None and depth > block - 1:
        raise ShapeError(f"draft_max: {depth} exceeds drafter_block_size {block} - 1; llama.cpp asserts n_max <= block_size - 1: use at most {block - 1}")


def _check_known_bad(values: dict[str, Any], taken: Mapping[str, Any]) -> None:
    """known_bad entries name shape keys and say why; the gate (budget/rules.py) refuses a match."""
    for index, entry in enumerate(values.get("known_bad", ())):
        where = f"known_bad[{index}]"
        if not isinstance(entry, Mapping) or not entry.get("reason") or len(entry) < 2:
            raise ShapeError(f"{where}: expected {{<shape key>: <value>, ..., reason: <the seed evidence>}}, got {entry!r}")
        for key in entry:
            if key != "reason" and key not in taken:
                raise ShapeError(f"{where}.{key}: not a {values['runtime']} shape key; name keys of this shape (e.g. max_num_seqs)")
        parse_text(entry["reason"], f"{where}.reason")


def _check_reasoning_efforts(values: dict[str, Any]) -> None:
    for index, effort in enumerate(values.get("reasoning_efforts", ())):
        if effort not in REASONING_EFFORTS:
            raise ShapeError(f"reasoning_efforts[{index}]: {effort!r} is not an effort; use {', '.join(REASONING_EFFORTS)}")


def resolve_path(path: str | None, root: str | None) -> str | None:
    """A payload path as seen from `root` (the payload directory on the host, or where the engine
    sees it): absolute paths stay; relative ones are joined and may not climb out of the root."""
    if not path:
        return None
    if posixpath.isabs(path) or not root:
        return path
    joined = posixpath.normpath(posixpath.join(root, path))
    base = posixpath.normpath(root)
    if joined != base and not joined.startswith(base.rstrip("/") + "/"):
        raise ShapeError(f"{path}: a payload path must stay inside the payload directory {root}")
    return joined
