# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The runtime registry: a runtime's name -> its driver, and the entry points that dispatch on it.

A new runtime is one module in runtimes/ that defines a `Runtime` subclass and a `DRIVER`
instance, named in DRIVER_MODULES below; everything else (parsing, pricing, argv, boot ledgers,
metrics, client quirks) reaches it through the functions here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget import kv_law
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.geometry import geometry_from_dict
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFHeader, read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import BudgetResult, devices_from
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.pricing import PayloadReader
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.identity import IdentityReport, PayloadName, check_identity
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import Manifest
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes import halogen, llamacpp, radiance, vllm
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.base import ArgvError, Runtime
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.boot_ledger import BootLedger
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import Shape, ShapeError, ShapeField, parse_into
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import SizeError

# Every runtime's module, in the order their names are listed to a user.
DRIVER_MODULES = (llamacpp, vllm, halogen, radiance)
DRIVERS: dict[str, Runtime] = {module.DRIVER.name: module.DRIVER for module in DRIVER_MODULES}
RUNTIMES: tuple[str, ...] = tuple(DRIVERS)
SHAPE_CLASSES: dict[str, type[Shape]] = {name: runtime.shape_class for name, runtime in DRIVERS.items()}


def driver(runtime: Any) -> Runtime:
    """The driver of a runtime name; ShapeError naming the runtimes there are."""
    if runtime not in DRIVERS:
        raise ShapeError(f"runtime: expected one of {', '.join(RUNTIMES)}, got {runtime!r}")
    return DRIVERS[runtime]


def driver_of(shape: Shape) -> Runtime:
    """The driver of a typed shape."""
    return driver(shape.runtime)


# --- the shape ---------------------------------------------------------------------------------


def _declared() -> dict[str, ShapeField]:
    """Every runtime's keys, once each: the base keys first, then each runtime's own."""
    owners: dict[str, set[str]] = {}
    fields: dict[str, dataclasses.Field[Any]] = {}
    for name, runtime in DRIVERS.items():
        for item in dataclasses.fields(runtime.shape_class):
            owners.setdefault(item.name, set()).add(name)
            fields.setdefault(item.name, item)
    out: dict[str, ShapeField] = {}
    for name, item in fields.items():
        meta = item.metadata
        choices = RUNTIMES if name == "runtime" else meta.get("choices")
        kind = "choice" if name == "runtime" else meta["kind"]
        out[name] = ShapeField(name, kind, meta["help"], frozenset(owners[name]), meta["group"], item.default, bool(meta.get("required")), choices)
    return out


SHAPE_FIELDS: dict[str, ShapeField] = _declared()


def parse_shape(raw: Any, name: str | None = None) -> Shape:
    """The one parser: a mapping (or a Shape) -> a typed shape of its runtime. `name` is the
    endpoint's name, the default served id. Raises ShapeError naming the field and the fix."""
    if isinstance(raw, Shape):
        return raw if raw.served_id or not name else dataclasses.replace(raw, served_id=name)
    if not isinstance(raw, Mapping):
        raise ShapeError(f"shape: expected a mapping of shape keys, got {type(raw).__name__}")
    return parse_into(driver(raw.get("runtime")).shape_class, raw, name, SHAPE_FIELDS)


def shape_class(runtime: str) -> type[Shape]:
    return driver(runtime).shape_class


# --- argv ----------------------------------------------------------------------------------------


def engine_argv(shape: Shape | Any, model_root: str = "", entry: list[str] | None = None, name: str | None = None, container: bool = False) -> list[str]:
    """The engine's argv for a shape (typed, or a mapping parsed here); `name` is the endpoint's,
    the default served id; `container`: the command a container of the engine's image runs."""
    try:
        typed = parse_shape(shape, name)
    except ShapeError as exc:
        raise ArgvError(str(exc)) from None
    runtime = driver_of(typed)
    argv = runtime.argv(typed, model_root, entry)
    return runtime.container_command(argv) if container else argv


def engine_environment(shape: Shape | Any, model_root: str = "", name: str | None = None) -> dict[str, str]:
    """The engine's own environment for a shape (an engine configured by variables); the role
    merges the inventory's endpoint_environment over it."""
    try:
        typed = parse_shape(shape, name)
    except ShapeError as exc:
        raise ArgvError(str(exc)) from None
    return driver_of(typed).environment(typed, model_root)


# --- the ledger ----------------------------------------------------------------------------------


def price_shape(
    shape: Shape | Any,
    devices: Any,
    payload_dir: str | None = None,
    loader: Callable[[str], GGUFHeader] = read_model,
    boots: list[dict[str, Any]] | None = None,
) -> BudgetResult:
    """Price a shape (typed, or a mapping parsed here) on every device and judge it. Raises
    ShapeError on malformed input.

    devices: [{name, memory}], one per GPU rank or the host. payload_dir: where the payload is
    readable on this machine (the model's header or config, the projector, the drafter); without
    it the shape's explicit geometries and sizes stand in. boots: stored boot ledgers
    (calibration.load_boots); those of this shape's geometry are what the KV figure rests on."""
    typed = parse_shape(shape)
    ledgers = devices_from(devices)
    payload = PayloadReader(payload_dir, loader)
    try:
        return driver_of(typed).price(typed, ledgers, payload, list(boots or []))
    except (SizeError, kv_law.KvLawError) as exc:
        raise ShapeError(str(exc)) from None


def payload_names(shape: Shape | Any) -> list[PayloadName]:
    """The payload paths a shape (typed, or a mapping parsed here) names, by its runtime's driver."""
    typed = parse_shape(shape)
    return driver_of(typed).payload_names(typed)


def payload_identity(shape: Shape | Any, manifest: Manifest) -> IdentityReport:
    """Every payload path the shape names against the endpoint's pinned manifest."""
    return check_identity(payload_names(shape), manifest)


def prices_on_controller(raw: Any) -> bool:
    """Whether the controller can price a shape without reading anything on the host."""
    try:
        typed = parse_shape(raw)
    except ShapeError:
        return False  # the shape gate on the host names the error
    return driver_of(typed).prices_on_controller(typed)


# --- boot ledgers and calibration ------------------------------------------------------------------


def parse_boot_log(text: str, runtime: str | None = None) -> BootLedger:
    """Collect every memory fact an engine printed; later lines win (the engine may reboot).
    With `runtime` only that engine's lines are read; without, every driver reads and the engine
    is the first whose facts were found."""
    ledger = BootLedger()
    readers = [driver(runtime)] if runtime else list(DRIVERS.values())
    for line in text.splitlines():
        for reader in readers:
            reader.parse_boot_line(line, ledger)
    # The later driver's claim wins, as the engine detection did before drivers (a vLLM log's
    # token lines decide even where a llama.cpp-looking buffer line appears).
    claimed = [reader.name for reader in readers if reader.claims_boot(ledger)]
    ledger.engine = claimed[-1] if claimed else ""
    return ledger


def stored_shape(boot: dict[str, Any]) -> Shape | None:
    """A stored boot's shape, typed; None for a record this version cannot read (it is skipped,
    never trusted)."""
    try:
        return parse_shape(boot.get("shape") or {})
    except ShapeError:
        return None


def compare_boot(boot: dict[str, Any], boots: list[dict[str, Any]]) -> dict[str, Any]:
    """Predicted vs measured for one stored boot. The prediction never uses the boot itself:
    llama.cpp by the exact law from the stored geometry, vLLM from the other boots of the
    geometry (or the formula when there are none)."""
    ledger = boot.get("ledger") or {}
    row: dict[str, Any] = {
        "endpoint": boot.get("endpoint"),
        "host": boot.get("host"),
        "recorded_at": boot.get("recorded_at"),
        "geometry_key": boot.get("geometry_key"),
        "runtime": str((boot.get("shape") or {}).get("runtime", ledger.get("engine", ""))),
        "layout": {},
    }
    try:
        shape = parse_shape(boot.get("shape") or {})
        row["layout"] = shape.layout()
        geometry = geometry_from_dict(shape.model_geometry, "model_geometry") if shape.model_geometry else None
        row.update(driver_of(shape).compare_boot(boot, boots, shape, geometry))
    except (kv_law.KvLawError, ValueError, KeyError, TypeError) as exc:
        row.update(agree=None, detail=f"cannot predict: {exc}")
    return row


def calibration_points(boots: list[dict[str, Any]], key: str, runtime: str) -> list[Any]:
    return driver(runtime).calibration_points(boots, key)
