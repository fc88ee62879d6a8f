# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A third runtime, to show what adding one takes: this file, one line in registry.py, its tests.

`sketch-server` is no real engine: it serves a model with one window per slot and prices as
declared weights plus a per-token KV price over every slot's window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import BudgetResult, DeviceLedger, _capacity_verdicts
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.pricing import PayloadReader, add_extra_terms, client_verdicts
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.base import RefusalContract, Runtime, serving
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import MAX_SLOTS, MAX_TOKENS, Shape, key

NAME = "sketch"


@dataclass(frozen=True)
class SketchShape(Shape):
    """sketch-server."""

    RUNTIME: ClassVar[str] = NAME
    LAYOUT_KEYS: ClassVar[tuple[str, ...]] = ("context", "slots_n")

    context: int = key("int", "sketch-server --context: each slot's window.", required=True, minimum=1, maximum=MAX_TOKENS)
    slots_n: int = key("int", "sketch-server --slots.", default=1, minimum=1, maximum=MAX_SLOTS)
    weight_bytes: int = key("size", "Budget - the weights.", default=0, group="budget")
    kv_bytes_per_token: int = key("int", "Budget - KV bytes per token.", default=0, maximum=1 << 24, group="budget")

    @property
    def slots(self) -> int:
        return self.slots_n

    @property
    def kv_dtypes(self) -> tuple[str, ...]:
        return ("f16",)

    @property
    def request_ceiling(self) -> int:
        return self.context


class Sketch(Runtime):
    name = NAME
    shape_class = SketchShape
    api_key_env = "SKETCH_API_KEY"
    native_program = "/usr/bin/sketch-server"
    in_flight_gauges = ("sketch:requests_active",)
    refusal = RefusalContract((re.compile(r"window is (\d+) tokens"),))

    def argv(self, shape: Any, model_root: str = "", entry: list[str] | None = None) -> list[str]:
        model, served_id, port = serving(shape, model_root)
        program = (entry or [self.native_program])[0]
        argv = [program, "--model", model, "--name", served_id, "--host", shape.bind, "--port", port]
        return argv + ["--context", str(shape.context), "--slots", str(shape.slots_n), *shape.extra_args]

    def price(self, shape: Any, devices: list[DeviceLedger], payload: PayloadReader, boots: list[dict[str, Any]]) -> BudgetResult:
        for device in devices:
            device.add("weights", shape.weight_bytes // len(devices))
            device.add("kv", shape.kv_bytes_per_token * shape.context * shape.slots_n // len(devices), f"{shape.slots_n} x {shape.context}")
        add_extra_terms(devices, shape.extra_terms)
        verdicts = _capacity_verdicts(devices, shape.free_floor, shape.max_device_gap)
        client, judged = client_verdicts(shape)
        return BudgetResult(NAME, devices, {"tokens": shape.context * shape.slots_n}, client, verdicts + judged, [], [], "", None)


DRIVER = Sketch()
