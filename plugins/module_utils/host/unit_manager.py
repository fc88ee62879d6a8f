# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drive a root unit through a (re)start, with systemctl, ss and podman.

Sequence: stop the unit's own previous instance -> clear the engine container's own stale name
-> port gate (a foreign listener fails, named by PID and command line) -> start -> health gate
(health.py). Every failure carries the unit's last journal lines.

Commands run through a Host (host_runner.py): queries always, changes only outside check mode,
so tests drive the logic with a fake runner.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.port_owner import judge_listener, listeners_on, read_proc
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import HEALTH_OPTIONS, default
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host

SYSTEMCTL = "/usr/bin/systemctl"
JOURNALCTL = "/usr/bin/journalctl"
SS = "/usr/bin/ss"
PODMAN = "/usr/bin/podman"
# How container_alive says the container's conmon died: the unit's `podman run` exits and systemd
# starts it again once the orphaned engine dies (the health gate waits for that one restart).
CONMON_GONE = "is gone: the engine dies within seconds"
SHOW_PROPS = ("ActiveState", "SubState", "MainPID", "NRestarts", "ControlGroup", "LoadState", "UnitFileState")


class GateError(RuntimeError):
    """A gate refused; `details` says what was seen (journal lines included)."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


@dataclass
class HealthSpec:
    """What the unit serves: the port gate reads the port and container, the health gate (health.py) all of it."""

    port: int
    host: str = default(HEALTH_OPTIONS, "host")
    served_id: str = default(HEALTH_OPTIONS, "served_id")
    container: str = default(HEALTH_OPTIONS, "container")  # the engine container's name when the unit runs podman
    timeout: float = default(HEALTH_OPTIONS, "timeout")
    health_path: str = "/health"
    models_path: str = "/v1/models"
    interval: float = 0.5
    allowed_restarts: int = default(HEALTH_OPTIONS, "allowed_restarts")
    api_key: str = field(default="", repr=False)  # sent as a bearer token; never printed
    drain_timeout: float = default(HEALTH_OPTIONS, "drain_timeout")  # seconds a restart waits for in-flight requests
    # The key the running engine holds (the previous one during a rotation); never printed.
    drain_api_key: str = field(default="", repr=False)
    drain_force: bool = default(HEALTH_OPTIONS, "drain_force")  # restart even when in-flight work cannot be read


@dataclass(frozen=True)
class ContainerState:
    pid: int  # the engine process (the container's init)
    conmon_pid: int
    status: str  # running, exited, ...


def boottime() -> float:
    """Seconds since boot on the clock /proc/PID/stat start times use."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class UnitManager:
    def __init__(self, host: Host, proc: str = "/proc") -> None:
        self.host = host
        self.proc = proc

    def _check(self, argv: list[str], change: bool = False) -> str:
        rc, out, err = (self.host.change if change else self.host.query)(argv)
        if rc != 0:
            raise GateError(f"{' '.join(argv)} failed ({rc}): {err.strip() or out.strip()}")
        return out

    def show(self, unit: str) -> dict[str, str]:
        argv = [SYSTEMCTL, "show", unit] + [f"--property={p}" for p in SHOW_PROPS]
        out = self._check(argv)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str, lines: int = 40) -> list[str]:
        _rc, out, _err = self.host.query([JOURNALCTL, "--unit", unit, "--lines", str(lines), "--no-pager", "--output", "cat"])
        return out.splitlines()[-lines:]

    def daemon_reload(self) -> None:
        self._check([SYSTEMCTL, "daemon-reload"], change=True)

    def systemctl(self, verb: str, unit: str) -> None:
        self._check([SYSTEMCTL, verb, unit], change=True)

    def container_pid(self, name: str) -> int | None:
        state = self.container_state(name)
        return state.pid if state else None

    def container_state(self, name: str) -> ContainerState | None:
        """The engine container's process, its conmon and its status (`podman inspect`)."""
        if not name:
            return None
        rc, out, _err = self.host.query([PODMAN, "inspect", "--format", "{{.State.Pid}} {{.State.ConmonPid}} {{.State.Status}}", name])
        if rc != 0:
            return None
        fields = (out.strip().splitlines() or [""])[0].split()
        try:
            pid = int(fields[0])
            conmon = int(fields[1]) if len(fields) > 1 else 0
        except (ValueError, IndexError):
            return None
        if not pid:
            return None
        return ContainerState(pid, conmon, fields[2] if len(fields) > 2 else "")

    def container_alive(self, name: str) -> str | None:
        """None when the engine container runs under a live conmon that is its engine's parent;
        else why not. A SIGKILLed conmon leaves the engine serving for some seconds, re-parented,
        and then it dies: a listener then is no proof of a healthy container."""
        state = self.container_state(name)
        if state is None:
            return f"the engine container {name} is not running"
        if state.status != "running":
            return f"the engine container {name} is {state.status or 'in no known state'}"
        conmon = read_proc(state.conmon_pid, self.proc) if state.conmon_pid > 0 else None
        if conmon is None or os.path.basename(conmon.cmdline.split(" ", 1)[0]) != "conmon":
            return f"the engine container {name}'s conmon (PID {state.conmon_pid}) {CONMON_GONE}"
        engine = read_proc(state.pid, self.proc)
        if engine is None or engine.ppid != state.conmon_pid:
            return f"the engine process (PID {state.pid}) is not conmon {state.conmon_pid}'s: the container is not the one podman manages"
        return None

    def remove_container(self, name: str) -> bool:
        """Remove exactly the engine's own container name (a stale registration or survivor)."""
        rc, _out, _err = self.host.query([PODMAN, "container", "exists", name])
        if rc != 0:
            return False
        self._check([PODMAN, "rm", "--force", "--ignore", "--time", "5", name], change=True)
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

    def port_owned(self, unit: str, health: HealthSpec) -> bool:
        """Whether the unit's own engine listens on the port (False: nothing listens). A foreign
        listener fails: judged before any credential is sent to the port (the drain, the port gate)."""
        props = self.show(unit)
        cgroup = props.get("ControlGroup", "")
        container_pid = self.container_pid(health.container)
        listeners = self.listeners(health.port)
        for pid, cmdline in listeners:
            verdict = judge_listener(pid, cgroup, container_pid, None, self.proc)
            if not verdict.owned:
                raise GateError(
                    f"port {health.port} is held by PID {pid} ({cmdline[:200]}), which is not {unit}'s; stop it or change the port (no key was sent to it)",
                    {"foreign_pid": pid, "foreign_cmdline": cmdline},
                )
        return bool(listeners)

    def port_gate(self, unit: str, health: HealthSpec) -> None:
        """Before start: nothing foreign may hold the port."""
        self.port_owned(unit, health)

    def stop_previous(self, unit: str, health: HealthSpec | None) -> None:
        props = self.show(unit)
        if props.get("LoadState") == "loaded" and props.get("ActiveState") not in ("inactive", "failed"):
            self.systemctl("stop", unit)
        if health and health.container:
            self.remove_container(health.container)
