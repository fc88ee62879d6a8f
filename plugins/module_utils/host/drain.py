# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drain before a restart: wait, bounded, until the engine has no request in flight, so a
deploy does not cut a stream a client is reading.

In flight is read from the engine's own /metrics, the gauges each runtime's driver names (e.g.
llama-server `llamacpp:requests_processing` + `llamacpp:requests_deferred`: it needs --metrics,
which the argv always carries; vLLM `vllm:num_requests_running` + `vllm:num_requests_waiting`).
An engine that answers no metrics (down, or an image without them) cannot be drained: the
restart goes ahead and the report says `unknown`. Neither engine can be told to refuse new work
while it drains, so a request that arrives during the wait is waited for too, up to the timeout.
The clock, the sleep and the GET are parameters, so tests run the wait in milliseconds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import DRIVERS

# Every runtime's in-flight gauges (runtimes/<name>.py `in_flight_gauges`): an engine exports only
# its own, so their sum over what /metrics shows is the engine's in-flight count.
IN_FLIGHT_GAUGES = tuple(gauge for runtime in DRIVERS.values() for gauge in runtime.in_flight_gauges)
_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*(\d+)?$")
# A /metrics page is a few KiB; read at most this much.
MAX_METRICS_BYTES = 4 << 20

Get = Callable[[str, int, str, str], tuple[int, bytes]]


@dataclass
class DrainReport:
    outcome: str  # idle (nothing in flight), drained (waited until idle), forced (timeout), unknown (no metrics)
    in_flight_at_start: int | None = None
    cut: int = 0  # requests still in flight when the wait gave up
    waited_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "in_flight_at_start": self.in_flight_at_start, "cut": self.cut, "waited_s": round(self.waited_s, 2)}


def in_flight(metrics_text: str) -> int | None:
    """Requests running or waiting, summed over the in-flight gauges (None when none is exported)."""
    total = 0.0
    seen = False
    for line in metrics_text.splitlines():
        match = _SAMPLE_RE.match(line.strip())
        if match and match.group(1) in IN_FLIGHT_GAUGES and match.group(3) != "NaN":
            total += float(match.group(3))
            seen = True
    return round(total) if seen else None


def read_in_flight(get: Get, host: str, port: int, api_key: str) -> int | None:
    status, body = get(host, port, "/metrics", api_key)
    if status != 200:
        return None
    return in_flight(body[:MAX_METRICS_BYTES].decode("utf-8", "replace"))


def drain(
    get: Get,
    host: str,
    port: int,
    api_key: str,
    timeout: float,
    interval: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainReport:
    begun = clock()
    current = read_in_flight(get, host, port, api_key)
    if current is None:
        return DrainReport("unknown")
    report = DrainReport("idle", in_flight_at_start=current)
    while current:
        if clock() - begun >= timeout:
            report.outcome, report.cut = "forced", current
            break
        sleep(interval)
        latest = read_in_flight(get, host, port, api_key)
        current = 0 if latest is None else latest  # the engine went away: nothing left to cut
        report.outcome = "drained"
    report.waited_s = clock() - begun
    return report
