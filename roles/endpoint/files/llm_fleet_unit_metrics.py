#!/usr/bin/python3
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write one endpoint unit's systemd facts for node_exporter's textfile collector.

  llm_fleet_unit_metrics.py UNIT DIRECTORY

Series (the names observability.UNIT_SERIES lists, and the alert rules use):
  llm_fleet_unit_restarts_total{unit}      systemd's NRestarts: restarts since the unit was started
  llm_fleet_unit_active{unit}              1 when ActiveState is active, else 0
  llm_fleet_unit_start_time_seconds{unit}  when the running process started (unix time)

Run by llm-fleet-unit-metrics@ENDPOINT.timer. The file is replaced atomically, so the collector
never reads half of it.
"""

import os
import subprocess
import sys
import tempfile


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


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    unit, directory = argv[1], argv[2]
    text = exposition(unit, unit_facts(unit))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".llm_fleet_", suffix=".prom.tmp", dir=directory)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(directory, "llm_fleet_{}.prom".format(unit.replace("/", "_"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
