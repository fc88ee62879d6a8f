# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drive a root unit through a (re)start and its gates, with systemctl, ss and podman.

Sequence: stop the unit's own previous instance -> clear the engine container's own stale name
-> port gate (a foreign listener fails, named by PID and command line) -> start -> health gate:
green only when the unit is active, the listener on the port is this unit's (cgroup) or its
container's engine process, it started after this start, /health answers OK and /v1/models lists
the served id. A growing NRestarts during the wait is a crash loop and fails fast. Every failure
carries the unit's last journal lines.

Commands run through one `runner(argv) -> (rc, stdout, stderr)`, so tests can drive the logic.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.port_owner import judge_listener, listeners_on, read_proc

Runner = Callable[[list[str]], tuple[int, str, str]]

SYSTEMCTL = "/usr/bin/systemctl"
JOURNALCTL = "/usr/bin/journalctl"
SS = "/usr/bin/ss"
PODMAN = "/usr/bin/podman"
SHOW_PROPS = ("ActiveState", "SubState", "MainPID", "NRestarts", "ControlGroup", "LoadState", "UnitFileState")


class GateError(RuntimeError):
    """A gate refused; `details` says what was seen (journal lines included)."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


@dataclass
class HealthSpec:
    port: int
    host: str = "127.0.0.1"
    served_id: str = ""
    container: str = ""  # the engine container's name when the unit runs podman
    timeout: float = 300.0
    health_path: str = "/health"
    models_path: str = "/v1/models"
    interval: float = 0.5
    allowed_restarts: int = 0


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
        }


def boottime() -> float:
    """Seconds since boot on the clock /proc/PID/stat start times use."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def http_get(host: str, port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET on the engine's own loopback port; (0, b"") when nothing answers."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read(1 << 20)
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        conn.close()


class UnitManager:
    def __init__(self, runner: Runner, proc: str = "/proc") -> None:
        self.run = runner
        self.proc = proc

    def _check(self, argv: list[str]) -> str:
        rc, out, err = self.run(argv)
        if rc != 0:
            raise GateError(f"{' '.join(argv)} failed ({rc}): {err.strip() or out.strip()}")
        return out

    def show(self, unit: str) -> dict[str, str]:
        argv = [SYSTEMCTL, "show", unit] + [f"--property={p}" for p in SHOW_PROPS]
        out = self._check(argv)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str, lines: int = 40) -> list[str]:
        _rc, out, _err = self.run([JOURNALCTL, "--unit", unit, "--lines", str(lines), "--no-pager", "--output", "cat"])
        return out.splitlines()[-lines:]

    def daemon_reload(self) -> None:
        self._check([SYSTEMCTL, "daemon-reload"])

    def systemctl(self, verb: str, unit: str) -> None:
        self._check([SYSTEMCTL, verb, unit])

    def container_pid(self, name: str) -> int | None:
        if not name:
            return None
        rc, out, _err = self.run([PODMAN, "inspect", "--format", "{{.State.Pid}}", name])
        if rc != 0:
            return None
        try:
            pid = int(out.strip().splitlines()[0])
        except (ValueError, IndexError):
            return None
        return pid or None

    def remove_container(self, name: str) -> bool:
        """Remove exactly the engine's own container name (a stale registration or survivor)."""
        rc, _out, _err = self.run([PODMAN, "container", "exists", name])
        if rc != 0:
            return False
        self._check([PODMAN, "rm", "--force", "--ignore", "--time", "5", name])
        return True

    def listeners(self, port: int) -> list[tuple[int, str]]:
        out = self._check([SS, "-Hltnp", f"sport = :{port}"])
        pids = []
        for listener in listeners_on(out, port):
            for pid in listener.pids:
                info = read_proc(pid, self.proc)
                pids.append((pid, info.cmdline if info else "?"))
        return pids

    # --- gates -----------------------------------------------------------------------------

    def port_gate(self, unit: str, health: HealthSpec) -> None:
        """Before start: nothing foreign may hold the port."""
        props = self.show(unit)
        cgroup = props.get("ControlGroup", "")
        container_pid = self.container_pid(health.container)
        for pid, cmdline in self.listeners(health.port):
            verdict = judge_listener(pid, cgroup, container_pid, None, self.proc)
            if not verdict.owned:
                raise GateError(
                    f"port {health.port} is held by PID {pid} ({cmdline[:200]}), which is not {unit}'s; stop it or change the port",
                    {"foreign_pid": pid, "foreign_cmdline": cmdline},
                )

    def stop_previous(self, unit: str, health: HealthSpec | None) -> None:
        props = self.show(unit)
        if props.get("LoadState") == "loaded" and props.get("ActiveState") not in ("inactive", "failed"):
            self.systemctl("stop", unit)
        if health and health.container:
            self.remove_container(health.container)

    def wait_healthy(self, unit: str, health: HealthSpec, started_at: float, restarts_before: int) -> HealthReport:
        deadline = time.monotonic() + health.timeout
        begun = time.monotonic()
        last_reason = "not checked yet"
        report = HealthReport(False)
        while True:
            props = self.show(unit)
            report.main_pid = int(props.get("MainPID", "0") or 0)
            report.n_restarts = int(props.get("NRestarts", "0") or 0)
            report.active_state = props.get("ActiveState", "")
            report.elapsed_s = time.monotonic() - begun
            if report.n_restarts > restarts_before + health.allowed_restarts:
                raise self._fail(unit, f"{unit} is crash-looping: NRestarts went {restarts_before} -> {report.n_restarts} during the health wait", report)
            if report.active_state == "failed":
                raise self._fail(unit, f"{unit} failed to start", report)
            if report.active_state == "active":
                reason = self._probe(unit, props.get("ControlGroup", ""), health, started_at, report)
                if reason is None:
                    report.healthy = True
                    return report
                last_reason = reason
            else:
                last_reason = f"unit is {report.active_state}/{props.get('SubState', '')}"
            if time.monotonic() > deadline:
                raise self._fail(unit, f"{unit} not healthy after {health.timeout:.0f} s: {last_reason}", report)
            time.sleep(health.interval)

    def _probe(self, unit: str, cgroup: str, health: HealthSpec, started_at: float, report: HealthReport) -> str | None:
        """None when green; else why not yet. A foreign listener fails at once."""
        listeners = self.listeners(health.port)
        if not listeners:
            return f"nothing listens on port {health.port} yet"
        container_pid = self.container_pid(health.container)
        owned = None
        waiting = ""
        for pid, _cmdline in listeners:
            verdict = judge_listener(pid, cgroup, container_pid, started_at, self.proc)
            if verdict.owned:
                owned = verdict
                break
            if verdict.foreign:
                raise self._fail(unit, f"port {health.port}: {verdict.reason}; a foreign process answers there", report)
            waiting = verdict.reason
        if owned is None:
            return waiting
        report.listener_pid, report.listener_cmdline, report.ownership = owned.pid, owned.cmdline, owned.reason
        status, _body = http_get(health.host, health.port, health.health_path)
        if status != 200:
            return f"{health.health_path} answered {status or 'nothing'}"
        status, body = http_get(health.host, health.port, health.models_path)
        if status != 200:
            return f"{health.models_path} answered {status or 'nothing'}"
        try:
            report.models = [str(m.get("id")) for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            return f"{health.models_path} did not answer JSON"
        if health.served_id and health.served_id not in report.models:
            return f"{health.models_path} lists {report.models}, not {health.served_id!r}"
        return None

    def _fail(self, unit: str, message: str, report: HealthReport) -> GateError:
        return GateError(message, {"health": report.as_dict(), "journal": self.journal(unit)})
