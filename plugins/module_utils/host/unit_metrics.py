# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The machine's unit-metrics writer, installed in one host call: the writer script, one
oneshot service naming every endpoint unit of the machine, and its timer (enabled, running).

One call per machine, not per endpoint deploy, so a no-op redeploy pays one remote execution
for it (it paid about seven as per-endpoint file, copy and systemd tasks). The per-endpoint
template timers of earlier versions (llm-fleet-unit-metrics@ENDPOINT.timer) are retired here,
so two writers never race on one file.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host import unit_metrics_writer
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import GateError, UnitManager
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

UNIT_DIR = "/etc/systemd/system"
LIB_DIR = "/usr/local/lib/llm-fleet"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
SERVICE = "llm-fleet-unit-metrics.service"
TIMER = "llm-fleet-unit-metrics.timer"
WRITER_NAME = "llm_fleet_unit_metrics.py"
LEGACY_TEMPLATES = ("llm-fleet-unit-metrics@.service", "llm-fleet-unit-metrics@.timer")
LEGACY_ENV = "/etc/llm-fleet/unit-metrics.env"
PYTHON = "/usr/bin/python3"
# Unit names and the directory go into ExecStart unquoted: only characters that need no quoting.
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.@-]+\.service$")
PLAIN_PATH = re.compile(r"^/[A-Za-z0-9/_.-]*$")

TIMER_TEXT = """\
# Managed by frank.llm_fleet.unit_metrics: refresh the endpoint units' facts every 30 s (first run at once).
[Unit]
Description=llm-fleet unit metrics

[Timer]
OnActiveSec=0
OnUnitActiveSec=30s
AccuracySec=1s

[Install]
WantedBy=timers.target
"""


def writer_source() -> str:
    """The writer's own source: the module carries it as a module_utils file, so what the host
    runs is what the unit tests import (the loader reads it from AnsiballZ's zip as well)."""
    loader = unit_metrics_writer.__loader__
    source = loader.get_source(unit_metrics_writer.__name__) if loader is not None else None
    if source is None:
        source = read_text(unit_metrics_writer.__file__) or ""
    # The controller's collection loader answers bytes (the unit_metrics_probe filter runs there).
    return source.decode("utf-8") if isinstance(source, bytes) else source


def service_text(writer_path: str, textfile_dir: str, units: list[str]) -> str:
    argv = " ".join([PYTHON, writer_path, textfile_dir, *units])
    return (
        "# Managed by frank.llm_fleet.unit_metrics: the endpoint units' facts for node_exporter's textfile collector.\n"
        "[Unit]\n"
        "Description=llm-fleet unit metrics\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"ExecStart={argv}\n"
    )


def _validate(units: list[str], textfile_dir: str, unit_dir: str, lib_dir: str) -> None:
    for unit in units:
        if not UNIT_NAME.match(unit):
            raise StepError(f"units: {unit!r} is not a unit name; give each endpoint's unit as NAME.service (letters, digits, :_.@-)", {})
    for field, path in (("textfile_dir", textfile_dir), ("unit_dir", unit_dir), ("lib_dir", lib_dir)):
        if not PLAIN_PATH.match(path):
            raise StepError(f"{field}: {path!r} must be an absolute path of letters, digits and /_.- (it is written into ExecStart unquoted)", {})


def wanted_files(units: list[str], textfile_dir: str, unit_dir: str, lib_dir: str) -> list[tuple[str, str, int]]:
    """(path, content, mode) of the writer, the service and the timer; refuses a name that would need quoting."""
    _validate(units, textfile_dir, unit_dir, lib_dir)
    writer_path = os.path.join(lib_dir, WRITER_NAME)
    return [
        (writer_path, writer_source(), 0o755),
        (os.path.join(unit_dir, SERVICE), service_text(writer_path, textfile_dir, sorted(set(units))), 0o644),
        (os.path.join(unit_dir, TIMER), TIMER_TEXT, 0o644),
    ]


def current_probe(units: list[str], textfile_dir: str = TEXTFILE_DIR, unit_dir: str = UNIT_DIR, lib_dir: str = LIB_DIR) -> dict[str, Any]:
    """A read-only shell command (one remote execution, no module transfer) and the lines it prints
    when the machine has exactly what ensure_unit_metrics installs: each file's sha256, the timer
    enabled and active, no per-endpoint template left. A no-op deploy runs only this; any other
    output runs the module. Every path in it passed _validate, so none needs quoting."""
    files = wanted_files(units, textfile_dir, unit_dir, lib_dir)
    legacy = [os.path.join(unit_dir, name) for name in LEGACY_TEMPLATES]
    legacy.append(os.path.join(unit_dir, "timers.target.wants", "llm-fleet-unit-metrics@*.timer"))
    command = (
        f"sha256sum {' '.join(path for path, _text, _mode in files)} 2>&1; "
        f"systemctl is-enabled {TIMER} 2>&1; systemctl is-active {TIMER} 2>&1; "
        f"ls -d {' '.join(legacy)} {LEGACY_ENV} 2>/dev/null; true"
    )
    expected = [f"{hashlib.sha256(text.encode()).hexdigest()}  {path}" for path, text, _mode in files] + ["enabled", "active"]
    return {"command": command, "expected": expected}


def ensure_unit_metrics(params: dict[str, Any], host: Host, diff: bool) -> dict[str, Any]:
    """Install (or, in check mode, report) the writer, its service and timer; start the timer."""
    units = sorted(set(params["units"]))
    unit_dir = params["unit_dir"]
    wanted = wanted_files(units, params["textfile_dir"], unit_dir, params["lib_dir"])
    result: dict[str, Any] = {"changed": False, "units": units, "files": []}
    diffs = []
    units_changed = False
    for path, text, mode in wanted:
        before = read_text(path)
        if before == text:
            continue
        host.write(path, text, mode)
        result["files"].append(path)
        units_changed = units_changed or path.startswith(unit_dir)
        if diff:
            diffs.append({"before": before or "", "after": text, "before_header": path, "after_header": path})
    manager = UnitManager(host)
    try:
        legacy = _retire_legacy(host, manager, unit_dir)
        if units_changed or legacy:
            manager.daemon_reload()
        timer = manager.show(TIMER)
        if timer.get("UnitFileState") != "enabled" or timer.get("ActiveState") != "active":
            host.change(["/usr/bin/systemctl", "enable", "--now", TIMER])
        elif units_changed:
            # A new endpoint list shows at once, not after the timer's next tick.
            host.change(["/usr/bin/systemctl", "start", "--no-block", SERVICE])
    except GateError as exc:
        raise StepError(str(exc), {**result, "actions": host.actions}) from None
    result["retired"] = legacy
    result["actions"] = host.actions
    result["changed"] = bool(host.actions)
    if diff and diffs:
        result["diff"] = diffs
    return result


def _retire_legacy(host: Host, manager: UnitManager, unit_dir: str) -> list[str]:
    """Disable and stop the per-endpoint template timers; remove their template files."""
    wants = sorted(glob.glob(os.path.join(unit_dir, "timers.target.wants", "llm-fleet-unit-metrics@*.timer")))
    retired = [os.path.basename(link) for link in wants]
    for timer in retired:
        manager.systemctl("disable", timer)
        manager.systemctl("stop", timer)
    for path in [os.path.join(unit_dir, name) for name in LEGACY_TEMPLATES] + [LEGACY_ENV]:
        if os.path.exists(path):
            host.remove(path)
            retired.append(path)
    return retired
