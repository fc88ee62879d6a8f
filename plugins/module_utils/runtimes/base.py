# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a runtime driver declares: the one interface the rest of the collection calls.

A runtime is one engine the fleet serves with (llama.cpp's llama-server, vLLM, ...). Its driver,
one module in runtimes/, declares in one place:
- its shape class (the runtime half of the typed shape: keys, defaults, bounds, cross-key rules);
- its argv and environment (`argv`, `environment`: the key's variable, the program an image starts
  by itself, the variables an engine configured by environment reads);
- its ledger terms and laws (`price`), its known-bad-shape rules and its boot-ledger lines
  (`parse_boot_line`, `compare_boot`: calibration);
- its metric names (drain gauges, alert rules, dashboard panels);
- its health and refusal contract (how it refuses a prompt past the window) and its client
  quirks (which field carries reasoning, whether it echoes the requested model name).
The registry (registry.py) maps a runtime name to its driver; nothing outside runtimes/ branches
on a runtime's name or its shape class.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import BudgetResult, DeviceLedger
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.pricing import PayloadReader
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.identity import FILE, PayloadName
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.boot_ledger import BootLedger
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import Shape, ShapeError, resolve_path


class ArgvError(ValueError):
    """A shape that cannot become an engine command line; names the field."""


def json_flag(value: Mapping[str, Any]) -> str:
    """A mapping as the compact JSON the engines parse (keys sorted, so the argv is stable)."""
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"))


def serving(shape: Shape, model_root: str) -> tuple[str, str, str]:
    """The model path, the served id and the port: without them there is nothing to launch."""
    for name in ("model_file", "served_id", "port"):
        if getattr(shape, name) in (None, ""):
            raise ArgvError(f"{name}: required to build the {shape.runtime} command line")
    try:
        model = resolve_path(shape.model_file, model_root)
    except ShapeError as exc:
        raise ArgvError(str(exc)) from None
    return str(model), str(shape.served_id), str(shape.port)


@dataclass(frozen=True)
class AlertRule:
    """One Prometheus alert in the runtime's own namespace. `expr` holds {sel} (the endpoint's
    job selector); `when` names a shape property the rule needs (e.g. has_drafter)."""

    alert: str
    expr: str
    duration: str
    severity: str
    summary: str
    when: str | None = None


@dataclass(frozen=True)
class Panel:
    """One Grafana panel: (expr, legend) pairs, {sel} selecting the dashboard's endpoints."""

    title: str
    queries: tuple[tuple[str, str], ...]
    unit: str = "none"


@dataclass(frozen=True)
class RefusalContract:
    """How the engine refuses a prompt past the window: the window and the prompt's tokens, as
    its error message states them (first pattern that matches wins)."""

    window: tuple[re.Pattern[str], ...]
    prompt: tuple[re.Pattern[str], ...] = ()
    # Where the engine names the overage instead of the prompt's tokens (prompt = window + overage).
    overage: tuple[re.Pattern[str], ...] = ()
    # Whether the refusal comes before any prefill (a free calibration for a probe).
    before_prefill: bool = True


class Runtime:
    """A runtime driver; each runtime module defines one subclass and registers an instance."""

    name: ClassVar[str]
    shape_class: ClassVar[type[Shape]]
    # The environment variable the engine reads its API key from (never argv).
    api_key_env: ClassVar[str]
    # The native program, and whether the engine's image starts it itself (then a container's
    # command is the argv without its first word).
    native_program: ClassVar[str]
    image_starts_program: ClassVar[bool] = False
    # /metrics: the gauges that count requests in flight (the drain waits on their sum), whether
    # the engine guards /metrics with its key, the alert rules and the dashboard panels.
    in_flight_gauges: ClassVar[tuple[str, ...]] = ()
    metrics_need_key: ClassVar[bool] = False
    alert_rules: ClassVar[tuple[AlertRule, ...]] = ()
    panels: ClassVar[tuple[Panel, ...]] = ()
    refusal: ClassVar[RefusalContract] = RefusalContract(())
    # Client contract quirks: the message field reasoning arrives in, and whether the engine
    # answers with the model name the request asked for (then a rename is judged on /v1/models,
    # never on a chat answer).
    reasoning_field: ClassVar[str] = "reasoning_content"
    echoes_requested_name: ClassVar[bool] = False

    def argv(self, shape: Any, model_root: str = "", entry: list[str] | None = None) -> list[str]:
        """The engine's command line for a shape of this runtime; `entry` overrides the program."""
        raise NotImplementedError

    def environment(self, shape: Any, model_root: str = "") -> dict[str, str]:
        """The engine's environment for a shape (an engine configured by variables, not flags);
        the role merges the inventory's endpoint_environment over it. Default: none."""
        return {}

    def container_command(self, argv: list[str]) -> list[str]:
        """The container's command for an argv: what the image does not start by itself."""
        return argv[1:] if self.image_starts_program else argv

    def price(self, shape: Any, devices: list[DeviceLedger], payload: PayloadReader, boots: list[dict[str, Any]]) -> BudgetResult:
        """Every device's terms and every rule's verdict for a shape of this runtime."""
        raise NotImplementedError

    def payload_names(self, shape: Any) -> list[PayloadName]:
        """The payload paths a shape of this runtime names, each with its shape key: what the
        payload identity check ties to the endpoint's manifest. Default: the model file."""
        return [PayloadName("model_file", shape.model_file, FILE)] if shape.model_file else []

    def prices_on_controller(self, shape: Any) -> bool:
        """Whether the controller can price the shape without the host (no payload read)."""
        return bool(shape.model_geometry)

    def controller_geometry_source(self, shape: Any) -> bool:
        """Whether pricing this shape on the controller needs a geometry from elsewhere (a stored
        boot, or the model file read where the controller holds it)."""
        return not shape.model_geometry

    def parse_boot_line(self, line: str, ledger: BootLedger) -> None:
        """Fill the ledger from one line the engine printed while booting."""

    def claims_boot(self, ledger: BootLedger) -> bool:
        """Whether the facts parsed are this engine's (the log's engine, when it is not known)."""
        return False

    def compare_boot(self, boot: dict[str, Any], boots: list[dict[str, Any]], shape: Any, geometry: Any) -> dict[str, Any]:
        """Predicted against measured for one stored boot of this runtime (calibration)."""
        return {"agree": None, "detail": f"{self.name}: no boot comparison"}

    def calibration_points(self, boots: list[dict[str, Any]], key: str) -> list[Any]:
        """Stored boots of one geometry as this runtime's calibration points."""
        return []
