# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drain before a restart: wait, bounded, until the engine has no request in flight, so a
deploy does not cut a stream a client is reading.

In flight is read from the engine's own /metrics, the gauges each runtime's driver names (e.g.
llama-server `llamacpp:requests_processing` + `llamacpp:requests_deferred`: it needs --metrics,
which the argv always carries; vLLM `vllm:num_requests_running` + `vllm:num_requests_waiting`).
The drain authenticates with the credential the running engine holds: on a key rotation that is
the previous key (the kept last-good secrets), not the new one, which the engine gets only at its
restart; the new key is tried after it. An engine whose in-flight work cannot be read (no metrics,
or every key refused) counts as busy: it is read again until the timeout, and only then restarted
(the report says `unknown`); the operator may force a restart at once instead (`force`, the
endpoint's `endpoint_drain_force`). The caller judges the listener (host/port_owner.py) before any key is sent,
and skips the drain when nothing listens (no stream is open to cut). Neither engine can be told to refuse new work
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
    outcome: str  # idle (nothing in flight), drained (waited until idle), forced (timeout), unknown (unreadable, restart forced)
    in_flight_at_start: int | None = None
    cut: int = 0  # requests still in flight when the wait gave up
    waited_s: float = 0.0
    unread: str = ""  # why the in-flight work could not be read (outcome unknown)

    def as_dict(self) -> dict[str, Any]:
        report = {"outcome": self.outcome, "in_flight_at_start": self.in_flight_at_start, "cut": self.cut, "waited_s": round(self.waited_s, 2)}
        if self.unread:
            report["unread"] = self.unread
        return report


def _why(status: int) -> str:
    if status in (401, 403):
        return f"/metrics answered {status} to every key the deploy holds"
    return f"/metrics answered {status} without the in-flight gauges" if status else "/metrics answered nothing"


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


def read_metrics(get: Get, host: str, port: int, api_key: str) -> tuple[int, int | None]:
    """(HTTP status, requests in flight or None when /metrics does not show them)."""
    status, body = get(host, port, "/metrics", api_key)
    if status != 200:
        return status, None
    return status, in_flight(body[:MAX_METRICS_BYTES].decode("utf-8", "replace"))


def read_in_flight(get: Get, host: str, port: int, api_key: str | tuple[str, ...]) -> int | None:
    """In flight read with the first key (of those given, in order) the engine accepts."""
    return _read_any(get, host, port, _keys(api_key))[1]


def _keys(api_key: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    keys = (api_key,) if isinstance(api_key, str) else tuple(api_key)
    unique = tuple(dict.fromkeys(keys))
    return unique or ("",)


def _read_any(get: Get, host: str, port: int, keys: tuple[str, ...]) -> tuple[str, int | None, int]:
    """(the key that read it, in flight, last status): each key in turn until one reads."""
    status = 0
    for key in keys:
        status, count = read_metrics(get, host, port, key)
        if count is not None:
            return key, count, status
        if status not in (401, 403):
            break  # another key cannot change an answer that is no refusal
    return keys[0], None, status


def drain(
    get: Get,
    host: str,
    port: int,
    api_key: str | tuple[str, ...],
    timeout: float,
    interval: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    force: bool = False,
) -> DrainReport:
    """`api_key`: the key the running engine holds, or several to try in order (the previous key
    first, then the new one)."""
    begun = clock()
    keys = _keys(api_key)
    key, current, status = _read_any(get, host, port, keys)
    while current is None:
        if force or clock() - begun >= timeout:
            return DrainReport("unknown", waited_s=clock() - begun, unread=_why(status))
        sleep(interval)
        key, current, status = _read_any(get, host, port, keys)
    report = DrainReport("idle", in_flight_at_start=current)
    while current:
        if clock() - begun >= timeout:
            report.outcome, report.cut = "forced", current
            break
        sleep(interval)
        latest = read_metrics(get, host, port, key)[1]
        current = 0 if latest is None else latest  # the engine went away: nothing left to cut
        report.outcome = "drained"
    report.waited_s = clock() - begun
    return report
