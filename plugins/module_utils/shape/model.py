# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The endpoint's shape, typed: the keys every runtime takes, and the one way a key is parsed.

An inventory holds a shape as a plain mapping (`endpoint_shape`). The runtime registry
(runtimes/registry.py `parse_shape()`) picks the runtime's shape class, a subclass of `Shape`
declared in that runtime's driver (runtimes/<name>.py), and `parse_into()` here turns the mapping
into it: it owns every default, every required key, every range and every error, and each error
names the field and the fix. Everything that reads a shape (the budget, the engine argv, the
calibration store, the client contract, observability, the CLI) takes the typed shape, so the gate
prices exactly the shape that launches.

Each key is declared once, as a dataclass field whose metadata carries its kind, its help text
and its bounds; the role's argument_specs and the docs' shape table are generated from that
metadata (the registry's `SHAPE_FIELDS`), and a test proves they agree with the parser.

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
from typing import Any, ClassVar

from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, SizeError, parse_size

# Upper bounds on every count an inventory (or a stored record) can carry: a typo such as
# `ctx_size: 4000000000` fails here with the bound named, never as a runaway allocation later.
MAX_TOKENS = 1 << 24  # 16,777,216 positions: far beyond any trained window
MAX_SLOTS = 4096
MAX_BYTES = 1 << 50  # 1 PiB
MAX_LAYERS = 100_000

# Flags that would put a credential in argv: /proc/PID/cmdline, the unit file, the record and the
# runbooks all show argv. The key goes in endpoint_api_key, which reaches the engine by environment.
# Each runtime's shape class adds the spellings its engine also parses (Shape.CREDENTIAL_FLAGS).
CREDENTIAL_FLAGS = ("--api-key", "--hf-token")
# Flags the argv sets from the shape alone (bind, port): the engine takes the last value, so one in
# extra_args would undo the bind policy and the firewall (e.g. `--host 0.0.0.0` on a loopback shape).
ADDRESS_FLAGS = ("--host", "--port")


class ShapeError(ValueError):
    """A shape field that is missing, unknown, of the wrong kind or out of range; names the field."""


def key(kind: str, help_text: str, *, default: Any = None, group: str = "engine", **rules: Any) -> Any:
    """A shape key: its kind (int, size, float, bool, str, choice, args, split, overrides, sizes,
    mapping, list), help text, its default and its bounds. Which runtimes take it follows from the
    shape classes that declare it."""
    meta = {"kind": kind, "help": help_text, "group": group, **rules}
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

    # Its choices are the registered runtimes: the registry checks it before a class is chosen.
    runtime: str = key("str", "The engine, one of the registered runtimes (runtimes/).", required=True, group="identity")
    launch: str = key(
        "choice",
        "native (a binary under the root unit) or podman (a container under the root unit).",
        default="native",
        choices=("native", "podman"),
        group="identity",
    )
    served_id: str | None = key(
        "str", "The model id clients ask for (llama.cpp --alias, vLLM --served-model-name); default the endpoint's name.", group="identity"
    )
    port: int | None = key("int", "The endpoint's port (required to serve).", minimum=1, maximum=65535, group="identity")
    bind: str = key("str", "Address the engine listens on: loopback unless the inventory declares the LAN.", default="127.0.0.1", group="identity")
    probe_host: str = key("str", "Address the health gate and the probes use.", default="127.0.0.1", group="identity")
    model_file: str | None = key(
        "str", "The model's path relative to the payload directory (the first part of a split GGUF, or '.' for a Hugging Face directory)."
    )
    restart_sec: int = key("int", "The unit's RestartSec.", default=5, minimum=0, maximum=3600, group="unit")
    extra_args: tuple[str, ...] = key("args", "Further engine arguments, as a list.", default=())
    chat_template_kwargs: Mapping[str, Any] | None = key(
        "mapping",
        "Chat-template kwargs as JSON: llama.cpp --chat-template-kwargs, vLLM --default-chat-template-kwargs.",
    )
    known_bad: tuple[Any, ...] = key(
        "list",
        "Budget - shapes this model cannot run [{<key>: <value>, ..., reason}]: a shape matching an entry is refused.",
        default=(),
        group="budget",
    )
    # The budget's own knobs.
    free_floor: int = key("size", "Budget - the free memory each device must keep.", default=parse_size("1.5 GiB"), group="budget")
    max_device_gap: int = key("size", "Budget - the most two devices' use may differ.", default=parse_size("0.5 GiB"), group="budget")
    extra_terms: tuple[Any, ...] = key("list", "Budget - declared extra terms [{name, size, device}].", default=(), group="budget")
    model_geometry: Mapping[str, Any] | None = key("mapping", "Budget - the model geometry, where its header or config is not readable.", group="budget")
    # The client contract.
    reasoning_control: str | None = key(
        "choice", "Client contract - how the chat template switches reasoning.", choices=("enable_thinking", "reasoning_effort", "none"), group="client"
    )
    client_base_url: str | None = key("str", "Client contract - the URL clients use (default http://HOST:PORT/v1).", group="client")
    client_gap: int | None = key("int", "Client contract - the gap between the engine ceiling and the advertised window.", maximum=MAX_TOKENS, group="client")
    client_max_tokens: int | None = key("int", "Client contract - maxTokens.", minimum=1, maximum=MAX_TOKENS, group="client")
    client_sampler: Mapping[str, Any] | None = key(
        "mapping",
        "Client contract - the sampler recipe the harness sends (e.g. temperature, top_p, top_k, min_p), as models.yml compat.extraBody.",
        group="client",
    )
    reasoning_efforts: tuple[str, ...] = key(
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

    # What each runtime's shape says of itself (its class in runtimes/<name>.py answers), so the
    # budget, the calibration store and the client contract never ask which runtime it is.
    RUNTIME: ClassVar[str] = ""  # the runtime name its class serves
    CREDENTIAL_FLAGS: ClassVar[tuple[str, ...]] = CREDENTIAL_FLAGS  # extra_args flags that would carry a key
    ADDRESS_FLAGS: ClassVar[tuple[str, ...]] = ADDRESS_FLAGS  # flags only the shape's bind and port set
    # How the engine's parser reads a long flag, so every spelling of the flags above is refused:
    # `_` read as `-` (llama.cpp, vLLM), and any unambiguous prefix taken for the flag (argparse).
    FLAG_UNDERSCORES: ClassVar[bool] = True
    FLAG_PREFIXES: ClassVar[bool] = False
    KV_DTYPE_FIELD: ClassVar[str] = "kv_dtype"  # the key (or keys) a KV dtype verdict names
    LAYOUT_KEYS: ClassVar[tuple[str, ...]] = ()  # the keys that lay the cache out within one geometry

    @property
    def request_ceiling(self) -> int:
        """The most tokens one request may hold, as the engine will enforce it."""
        raise NotImplementedError

    @property
    def request_window(self) -> int:
        """The window one request is given, before the engine's padding (the trained-window note)."""
        return self.request_ceiling

    @property
    def kv_identity(self) -> tuple[list[str], int]:
        """(KV dtypes as the engine stores them, ranks the cache is split over): with the model's
        geometry, what the per-token KV price depends on (the calibration store's key)."""
        return list(self.kv_dtypes), 1

    def layout(self) -> dict[str, Any]:
        """The keys that lay the cache out, and their values (what a stored boot was measured at)."""
        return {name: getattr(self, name) for name in self.LAYOUT_KEYS}

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        """The runtime's rules across keys, on the coerced values; raises ShapeError."""

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
        return parse_into(type(self), {**self.as_dict(), **changes})


# Keys an older inventory may still carry, and what replaced them.
RENAMED = {
    "projector_path": "projector (one key: the path relative to the payload directory)",
    "drafter_path": "drafter (one key: the path relative to the payload directory)",
    "model": "model_file (relative to endpoint_payload_dir)",
    "model_path": "model_file (relative to endpoint_payload_dir)",
    "devices": "endpoint_devices (a variable of its own, not a shape key)",
}


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


def parse_into(cls: type[Shape], raw: Mapping[str, Any], name: str | None = None, declared: Mapping[str, ShapeField] | None = None) -> Shape:
    """A mapping -> an instance of one runtime's shape class. `name` is the endpoint's name, the
    default served id; `declared` (every runtime's keys) lets a key of another runtime be named as
    such. Raises ShapeError naming the field and the fix."""
    runtime = str(raw.get("runtime"))
    taken = {item.name: item for item in dataclasses.fields(cls)}
    for key_name in raw:
        if key_name in taken:
            continue
        if key_name in RENAMED:
            raise ShapeError(f"{key_name}: no longer a shape key; use {RENAMED[key_name]}")
        if declared and key_name in declared:
            other = ", ".join(sorted(declared[key_name].runtimes))
            raise ShapeError(f"{key_name}: not a {runtime} key (it belongs to {other}); remove it or change runtime")
        close = difflib.get_close_matches(str(key_name), list(taken), n=1)
        raise ShapeError(f"{key_name}: unknown shape key" + (f"; did you mean {close[0]}?" if close else f" for runtime {runtime}"))
    values: dict[str, Any] = {}
    for key_name, item in taken.items():
        value = raw.get(key_name)
        if value is None:
            if item.metadata.get("required"):
                raise ShapeError(f"{key_name}: required for {runtime} shapes ({item.metadata['help']})")
            continue
        values[key_name] = _coerce(item.metadata, value, key_name)
    if not values.get("served_id") and name:
        values["served_id"] = parse_text(name, "served_id")
    check_no_key_in_argv(values.get("extra_args") or (), cls.CREDENTIAL_FLAGS, cls.FLAG_UNDERSCORES, cls.FLAG_PREFIXES)
    check_no_address_in_argv(values.get("extra_args") or (), cls.ADDRESS_FLAGS, cls.FLAG_UNDERSCORES, cls.FLAG_PREFIXES)
    cls.check_values(values)
    _check_known_bad(values, taken)
    _check_reasoning_efforts(values)
    return cls(**values)


def flag_named(arg: Any, flags: tuple[str, ...], underscores: bool = True, prefixes: bool = False) -> str | None:
    """The flag of `flags` that `arg` spells as the engine's parser reads it (`--api_key=x`, and with
    `prefixes` an abbreviation such as `--hos`), or None."""
    text = str(arg)
    name = text.split("=", 1)[0] if text.startswith("--") else text
    if underscores and name.startswith("--"):
        name = name.replace("_", "-")
    for flag in flags:
        spelled = flag.replace("_", "-") if underscores and flag.startswith("--") else flag
        if name == spelled or (prefixes and name.startswith("--") and len(name) > 3 and spelled.startswith(name)):
            return flag
    return None


def check_no_address_in_argv(extra_args: tuple[str, ...], flags: tuple[str, ...] = ADDRESS_FLAGS, underscores: bool = True, prefixes: bool = False) -> None:
    for arg in extra_args:
        flag = flag_named(arg, flags, underscores, prefixes)
        if flag:
            field = "bind" if "host" in flag else "port"
            raise ShapeError(
                f"extra_args: {arg} sets {flag}, which the argv takes from the shape's {field} only (the engine keeps the last value, "
                f"so it would undo the bind policy and the firewall); remove it and set endpoint_shape.{field}"
                + (" (a LAN bind also needs endpoint_allowed_networks and endpoint_api_key)" if field == "bind" else "")
            )


def check_no_key_in_argv(extra_args: tuple[str, ...], flags: tuple[str, ...] = CREDENTIAL_FLAGS, underscores: bool = True, prefixes: bool = False) -> None:
    for arg in extra_args:
        flag = flag_named(arg, flags, underscores, prefixes)
        if flag:
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
