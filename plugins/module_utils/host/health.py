# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health gate after a unit's start.

Green only when the unit is active, the listener on the port is this unit's (cgroup) or its
container's engine process, a container runs under a live conmon that is its engine's parent (a
SIGKILLed conmon leaves the engine serving for a while before it dies; the gate then waits for the
one restart that brings the unit's own engine back, which is no crash loop), it started after this start, /health answers OK and /v1/models lists
the served id. A growing NRestarts during the wait is a crash loop and fails fast, and so do a
foreign listener and a 401/403 (waiting cannot make an engine drop its key). A keyed endpoint is
green only when every path of UNKEYED_PATHS refuses a request without the key. Every failure carries
the unit's last journal lines. The clock, the sleep and the HTTP GET are parameters, so tests run
the whole wait in milliseconds.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.port_owner import judge_listener
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import CONMON_GONE, GateError, HealthSpec, UnitManager


@dataclass
class HealthReport:
    healthy: bool
    listener_pid: int | None = None
    listener_cmdline: str = ""
    ownership: str = ""
    models: list[str] = field(default_factory=list)
    main_pid: int = 0
    n_restarts: int = 0
    active_state: str = ""
    elapsed_s: float = 0.0
    # Wall-clock times (seconds since the epoch) of the gate's first look at the engine and of
    # the look that found it green: what a fault test lines up against the fault it caused.
    first_check_at: float = 0.0
    healthy_at: float = 0.0
    checks: int = 0  # how many times the gate looked
    first_reason: str = ""  # why the first look was not green ("" when it was)
    # The engine's conmon was seen dead: the unit's `podman run` exits when the orphaned engine
    # dies and systemd starts it again, one restart the gate waits for (not a crash loop).
    conmon_died: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "listener_pid": self.listener_pid,
            "listener_cmdline": self.listener_cmdline,
            "ownership": self.ownership,
            "models": self.models,
            "main_pid": self.main_pid,
            "n_restarts": self.n_restarts,
            "active_state": self.active_state,
            "elapsed_s": round(self.elapsed_s, 2),
            "first_check_at": round(self.first_check_at, 3),
            "healthy_at": round(self.healthy_at, 3),
            "checks": self.checks,
            "first_reason": self.first_reason,
            "conmon_died": self.conmon_died,
        }


def http_get(host: str, port: int, path: str, api_key: str = "", timeout: float = 5.0) -> tuple[int, bytes]:
    """GET on the engine's own loopback port, with the endpoint's key when it has one; (0, b"")
    when nothing answers."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        response = conn.getresponse()
        return response.status, response.read(1 << 20)
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        conn.close()


def http_post_unkeyed(host: str, port: int, path: str, timeout: float = 5.0) -> int:
    """POST a small JSON body with no credentials; the status, or 0 when nothing answers."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=UNKEYED_BODY, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read(1 << 16)
        return response.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


HttpGet = Callable[[str, int, str, str], tuple[int, bytes]]
HttpPost = Callable[[str, int, str], int]
# Serving paths an engine may answer outside /v1 (vLLM 0.32 serves each of these
# without its own key check): with a key set, an unkeyed request must get 401/403, or 404 where
# the engine has no such route. Anything else means the path is served keyless. No admin path
# (/pause, /sleep): on an unguarded engine the probe itself would act.
UNKEYED_PATHS = ("/invocations", "/tokenize", "/detokenize", "/pooling", "/score", "/rerank", "/classify")
UNKEYED_BODY = json.dumps({"prompt": "x", "max_tokens": 1, "input": "x", "text_1": "x", "text_2": "x", "tokens": [1]})
# Answers that say the engine wants credentials the gate does not send: no wait can change them.
_REFUSED = {401: "401 Unauthorized", 403: "403 Forbidden"}


def wait_healthy(
    manager: UnitManager,
    unit: str,
    health: HealthSpec,
    started_at: float,
    restarts_before: int,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    get: HttpGet = http_get,
    post: HttpPost = http_post_unkeyed,
    wall: Callable[[], float] = time.time,
) -> HealthReport:
    deadline = clock() + health.timeout
    begun = clock()
    last_reason = "not checked yet"
    report = HealthReport(False)
    while True:
        report.checks += 1
        if report.checks == 1:
            report.first_check_at = wall()
        props = manager.show(unit)
        report.main_pid = int(props.get("MainPID", "0") or 0)
        report.n_restarts = int(props.get("NRestarts", "0") or 0)
        report.active_state = props.get("ActiveState", "")
        report.elapsed_s = clock() - begun
        # A dead conmon seen earlier in this wait brings exactly one restart of the unit: its own.
        if report.n_restarts > restarts_before + health.allowed_restarts + int(report.conmon_died):
            raise _fail(manager, unit, f"{unit} is crash-looping: NRestarts went {restarts_before} -> {report.n_restarts} during the health wait", report)
        if report.active_state == "failed":
            raise _fail(manager, unit, f"{unit} failed to start", report)
        if report.active_state == "active":
            reason = _probe(manager, unit, props.get("ControlGroup", ""), health, started_at, report, get)
            if reason is None:
                _refuse_keyless_paths(manager, unit, health, report, post)
                report.healthy = True
                report.healthy_at = wall()
                return report
            last_reason = reason
        else:
            last_reason = f"unit is {report.active_state}/{props.get('SubState', '')}"
        if report.checks == 1:
            report.first_reason = last_reason
        if clock() > deadline:
            raise _fail(manager, unit, f"{unit} not healthy after {health.timeout:.0f} s: {last_reason}", report)
        sleep(health.interval)


def _probe(manager: UnitManager, unit: str, cgroup: str, health: HealthSpec, started_at: float, report: HealthReport, get: HttpGet) -> str | None:
    """None when green; else why not yet. A foreign listener and a 401/403 fail at once."""
    listeners = manager.listeners(health.port)
    if not listeners:
        return f"nothing listens on port {health.port} yet"
    container_pid = manager.container_pid(health.container)
    owned = None
    waiting = ""
    for pid, _cmdline in listeners:
        verdict = judge_listener(pid, cgroup, container_pid, started_at, manager.proc)
        if verdict.owned:
            owned = verdict
            break
        if verdict.foreign:
            raise _fail(manager, unit, f"port {health.port}: {verdict.reason}; a foreign process answers there", report)
        waiting = verdict.reason
    if owned is None:
        return waiting
    if health.container:
        # The listener is the container's, and the container must live under its conmon.
        dead = manager.container_alive(health.container)
        if dead:
            report.conmon_died = report.conmon_died or dead.endswith(CONMON_GONE)
            return dead
    report.listener_pid, report.listener_cmdline, report.ownership = owned.pid, owned.cmdline, owned.reason
    status, _body = get(health.host, health.port, health.health_path, health.api_key)
    _refuse_credentials(manager, unit, health, health.health_path, status, report)
    if status != 200:
        return f"{health.health_path} answered {status or 'nothing'}"
    status, body = get(health.host, health.port, health.models_path, health.api_key)
    _refuse_credentials(manager, unit, health, health.models_path, status, report)
    if status != 200:
        return f"{health.models_path} answered {status or 'nothing'}"
    try:
        report.models = [str(m.get("id")) for m in json.loads(body).get("data", [])]
    except (ValueError, AttributeError):
        return f"{health.models_path} did not answer JSON"
    if health.served_id and health.served_id not in report.models:
        return f"{health.models_path} lists {report.models}, not {health.served_id!r}"
    return None


def _refuse_keyless_paths(manager: UnitManager, unit: str, health: HealthSpec, report: HealthReport, post: HttpPost) -> None:
    """A keyed endpoint answers no serving path without its key (checked once it is green)."""
    if not health.api_key:
        return
    served = [f"{path} answered {status}" for path in UNKEYED_PATHS if (status := post(health.host, health.port, path)) not in (401, 403, 404)]
    if served:
        raise _fail(
            manager,
            unit,
            f"{unit}: port {health.port} serves without the API key ({', '.join(served)} to an unkeyed POST); the engine's key "
            "check does not cover every route - for vLLM the collection's key guard (--middleware) must be loaded",
            report,
        )


def _refuse_credentials(manager: UnitManager, unit: str, health: HealthSpec, path: str, status: int, report: HealthReport) -> None:
    if status not in _REFUSED:
        return
    if health.api_key:
        why = (
            "the engine refused the endpoint's API key, and waiting will not change that: the engine holds another key "
            "(a stale env file, or a key set in extra_args) - set the key only in endpoint_api_key"
        )
    else:
        why = (
            "the engine wants an API key the health gate was not given, and waiting will not change that: set the key in "
            "endpoint_api_key (from Ansible Vault), which gives it to the engine and to every gate and probe"
        )
    raise _fail(manager, unit, f"{unit}: {path} on port {health.port} answered {_REFUSED[status]}: {why}", report)


def _fail(manager: UnitManager, unit: str, message: str, report: HealthReport) -> GateError:
    return GateError(message, {"health": report.as_dict(), "journal": manager.journal(unit)})
