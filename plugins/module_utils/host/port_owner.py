# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who is behind a port: the listening process, and whether it belongs to the unit just started.

An HTTP 200 is not proof: a stale process (or conmon holding a published port) can answer. The
listener counts as the unit's when it is in the unit's cgroup, or is the container's engine
process (`podman inspect --format {{.State.Pid}}`) or a descendant of it, and it started after
the unit did. conmon is re-parented to PID 1, so the engine is NOT a descendant of MainPID.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_USERS_RE = re.compile(r'\("([^"]*)",pid=(\d+),fd=\d+\)')


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    processes: tuple[tuple[str, int], ...]  # (name, pid)

    @property
    def pids(self) -> list[int]:
        return [pid for _name, pid in self.processes]


def parse_ss_listeners(text: str) -> list[Listener]:
    """Parse `ss -Hltnp` output (State Recv-Q Send-Q Local Peer Process)."""
    listeners = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[0] != "LISTEN":
            continue
        local = fields[3]
        address, _colon, port = local.rpartition(":")
        if not port.isdigit():
            continue
        users = _USERS_RE.findall(line)
        listeners.append(Listener(address.strip("[]"), int(port), tuple((name, int(pid)) for name, pid in users)))
    return listeners


def listeners_on(text: str, port: int) -> list[Listener]:
    return [listener for listener in parse_ss_listeners(text) if listener.port == port]


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    cmdline: str
    cgroup: str
    start_ticks: int

    def started_after(self, monotonic_s: float, ticks_per_s: int) -> bool:
        # /proc/PID/stat starttime is in clock ticks since boot: the same clock as systemd's
        # monotonic timestamps (no suspend on servers); one tick of slack for rounding.
        return self.start_ticks / ticks_per_s + 1 / ticks_per_s >= monotonic_s


def read_proc(pid: int, proc: str = "/proc") -> ProcInfo | None:
    base = os.path.join(proc, str(pid))
    try:
        with open(os.path.join(base, "stat"), encoding="utf-8", errors="replace") as handle:
            stat = handle.read()
        with open(os.path.join(base, "cmdline"), "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        with open(os.path.join(base, "cgroup"), encoding="utf-8") as handle:
            cgroup_text = handle.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may hold spaces and parentheses: fields after the last ')' are fixed.
    rest = stat[stat.rindex(")") + 2 :].split()
    ppid = int(rest[1])
    start_ticks = int(rest[19])
    return ProcInfo(pid, ppid, cmdline, unified_cgroup(cgroup_text), start_ticks)


def unified_cgroup(text: str) -> str:
    """The process's cgroup path: the v2 line (0::), else the v1 name=systemd hierarchy."""
    fallback = ""
    for line in text.splitlines():
        hierarchy, _sep, rest = line.partition(":")
        controllers, _sep, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            return path
        if controllers == "name=systemd":
            fallback = path
    return fallback


def is_descendant(pid: int, ancestor: int, proc: str = "/proc") -> bool:
    seen = 0
    current = pid
    while current > 1 and seen < 64:
        if current == ancestor:
            return True
        info = read_proc(current, proc)
        if info is None:
            return False
        current = info.ppid
        seen += 1
    return current == ancestor


@dataclass(frozen=True)
class Ownership:
    owned: bool
    pid: int
    cmdline: str
    reason: str
    foreign: bool = False  # neither the unit's nor its container's (as opposed to merely stale)


def judge_listener(pid: int, unit_cgroup: str, container_pid: int | None, started_monotonic_s: float | None, proc: str = "/proc") -> Ownership:
    """Is the process `pid` (listening on the port) this unit's fresh engine?"""
    info = read_proc(pid, proc)
    if info is None:
        return Ownership(False, pid, "", "the listener vanished while it was being checked")
    in_unit = bool(unit_cgroup) and (info.cgroup == unit_cgroup or info.cgroup.startswith(unit_cgroup.rstrip("/") + "/"))
    in_container = container_pid is not None and container_pid > 0 and (pid == container_pid or is_descendant(pid, container_pid, proc))
    if not (in_unit or in_container):
        reason = f"PID {pid} ({info.cmdline[:120]}) is not in the unit's cgroup {unit_cgroup or '?'} nor the engine container"
        return Ownership(False, pid, info.cmdline, reason, foreign=True)
    if started_monotonic_s is not None and not info.started_after(started_monotonic_s, os.sysconf("SC_CLK_TCK")):
        return Ownership(False, pid, info.cmdline, f"PID {pid} ({info.cmdline[:120]}) started before this start: a survivor of an earlier run")
    return Ownership(True, pid, info.cmdline, "in the unit's cgroup" if in_unit else "the container's engine process")
