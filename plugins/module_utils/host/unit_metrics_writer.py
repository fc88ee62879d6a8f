#!/usr/bin/python3
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write the systemd facts of a machine's endpoint units for node_exporter's textfile collector.

  llm_fleet_unit_metrics.py DIRECTORY UNIT...

Series (the names observability.UNIT_SERIES lists, and the alert rules use), one file
DIRECTORY/llm_fleet_UNIT.prom per unit:
  llm_fleet_unit_restarts_total{unit}      systemd's NRestarts: restarts since the unit was started
  llm_fleet_unit_active{unit}              1 when ActiveState is active, else 0
  llm_fleet_unit_start_time_seconds{unit}  when the running process started (unix time)

Installed on the machine as /usr/local/lib/llm-fleet/llm_fleet_unit_metrics.py by the module
frank.llm_fleet.unit_metrics (this file is its source) and run by llm-fleet-unit-metrics.timer.
Each file is replaced atomically, so the collector never reads half of it; a llm_fleet_*.prom file
of a unit no longer listed (a retired endpoint) is removed, so its alerts stop.
Standard library only: it runs under the machine's /usr/bin/python3.
"""

import os
import subprocess
import sys
import tempfile

PREFIX = "llm_fleet_"
SUFFIX = ".prom"


def unit_facts(unit):
    proc = subprocess.run(
        ["systemctl", "show", unit, "--timestamp=unix", "--property=NRestarts,ActiveState,ExecMainStartTimestamp"],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def exposition(unit, facts):
    label = '{{unit="{}"}}'.format(unit.replace("\\", "\\\\").replace('"', '\\"'))
    lines = [
        "# HELP llm_fleet_unit_restarts_total Restarts systemd made of the endpoint's unit (NRestarts).",
        "# TYPE llm_fleet_unit_restarts_total counter",
        f"llm_fleet_unit_restarts_total{label} {int(facts.get('NRestarts') or 0)}",
        "# HELP llm_fleet_unit_active Whether the endpoint's unit is active.",
        "# TYPE llm_fleet_unit_active gauge",
        f"llm_fleet_unit_active{label} {1 if facts.get('ActiveState') == 'active' else 0}",
    ]
    started = (facts.get("ExecMainStartTimestamp") or "").lstrip("@")
    if started.isdigit():
        lines += [
            "# HELP llm_fleet_unit_start_time_seconds When the unit's running process started.",
            "# TYPE llm_fleet_unit_start_time_seconds gauge",
            f"llm_fleet_unit_start_time_seconds{label} {started}",
        ]
    return "\n".join(lines) + "\n"


def textfile_name(unit):
    return PREFIX + unit.replace("/", "_") + SUFFIX


def write_all(directory, units, facts=unit_facts):
    """One file per unit; the llm_fleet_*.prom files of units not listed are removed."""
    os.makedirs(directory, exist_ok=True)
    wanted = {textfile_name(unit) for unit in units}
    for unit in units:
        fd, tmp = tempfile.mkstemp(prefix=".llm_fleet_", suffix=".prom.tmp", dir=directory)
        with os.fdopen(fd, "w") as handle:
            handle.write(exposition(unit, facts(unit)))
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(directory, textfile_name(unit)))
    for name in os.listdir(directory):
        if name.startswith(PREFIX) and name.endswith(SUFFIX) and name not in wanted:
            os.unlink(os.path.join(directory, name))


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    write_all(argv[1], argv[2:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
