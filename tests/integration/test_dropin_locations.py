"""Drop-ins outside NAME.service.d are refused too, for real on the lab host (systemd 252):
systemd_root_unit installs frank-dropin.service (a `python3 -m http.server` stand-in on loopback);
then `systemctl set-property` writes /etc/systemd/system.control/frank-dropin.service.d/, and a
prefix drop-in /run/systemd/system/frank-.service.d/ applies to every frank-* unit. Each fails the
next run (check mode and a real one) naming the file and the fix, and the unit keeps running
untouched; `systemctl revert` and removing the prefix file make the run pass again."""

from __future__ import annotations

import json
import subprocess

import pytest
from lab_host import BIN, HOST, LAB_INVENTORY, ROOT, env, on_host, require_lab_host, unit_property

# A fault-matrix row: `make fault-matrix` runs it, `make test` does not (pytest.ini, fault_row).
pytestmark = [pytest.mark.lab, pytest.mark.fault_row]

require_lab_host()

UNIT = "frank-dropin.service"
PORT = 7808
CONTROL = f"/etc/systemd/system.control/{UNIT}.d"
PREFIX = "/run/systemd/system/frank-.service.d"


def systemd_root_unit(args: dict, *flags: str) -> tuple[int, dict]:
    """Run the module on the lab host; (exit status, the module's result)."""
    argv = [str(BIN / "ansible"), "-i", str(LAB_INVENTORY), HOST, "-m", "frank.llm_fleet.systemd_root_unit", "-a", json.dumps(args), *flags]
    callback = {"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**env(), **callback}, check=False)
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    return proc.returncode, out["plays"][0]["tasks"][0]["hosts"][HOST]


ARGS = {"name": UNIT, "command": ["/usr/bin/python3", "-m", "http.server", "--bind", "127.0.0.1", str(PORT)], "description": "drop-in locations"}


@pytest.fixture
def stand_in():
    yield
    on_host("systemctl", "revert", UNIT, check=False)
    on_host("rm", "-rf", PREFIX, CONTROL)
    on_host("rmdir", "--ignore-fail-on-non-empty", "/etc/systemd/system.control", check=False)  # set-property made it
    on_host("systemctl", "disable", "--now", UNIT, check=False)
    on_host("rm", "-f", f"/etc/systemd/system/{UNIT}")
    on_host("systemctl", "daemon-reload")
    on_host("systemctl", "reset-failed", UNIT, check=False)


def test_a_set_property_and_a_prefix_drop_in_are_refused_by_name_and_the_unit_is_left_alone(stand_in):
    rc, result = systemd_root_unit(ARGS)
    assert rc == 0 and unit_property(UNIT, "ActiveState") == "active", result
    pid = unit_property(UNIT, "MainPID")

    # `systemctl set-property` (persistent) writes a drop-in under /etc/systemd/system.control.
    on_host("systemctl", "set-property", UNIT, "MemoryMax=1G")
    written = on_host("sh", "-c", f"ls {CONTROL}/*.conf")
    assert written == f"{CONTROL}/50-MemoryMax.conf", written
    for flags in (("--check",), ()):
        rc, result = systemd_root_unit({**ARGS, "description": "drop-in locations, edited"}, *flags)
        assert rc != 0 and result["foreign_dropins"] == [written], (flags, result)
        assert f"{written} (written by `systemctl set-property`: `systemctl revert {UNIT}` removes it)" in result["msg"], result["msg"]
    assert unit_property(UNIT, "MainPID") == pid and "edited" not in unit_property(UNIT, "Description")

    # The fix the message names.
    on_host("systemctl", "revert", UNIT)
    # A runtime drop-in for every frank-* unit (a dash-prefix directory).
    on_host("sh", "-c", f"mkdir -p {PREFIX} && printf '[Service]\\nEnvironment=BENCH=1\\n' > {PREFIX}/bench.conf && systemctl daemon-reload")
    assert f"{PREFIX}/bench.conf" in unit_property(UNIT, "DropInPaths")
    rc, result = systemd_root_unit({**ARGS, "description": "drop-in locations, edited"})
    assert rc != 0 and result["foreign_dropins"] == [f"{PREFIX}/bench.conf"], result
    assert "a runtime drop-in" in result["msg"]
    assert unit_property(UNIT, "MainPID") == pid

    # Listed by its file name, it is kept; removed, nothing is left to refuse.
    rc, result = systemd_root_unit({**ARGS, "dropins": ["bench.conf"]})
    assert rc == 0, result
    on_host("sh", "-c", f"rm -rf {PREFIX} && systemctl daemon-reload")
    rc, result = systemd_root_unit({**ARGS, "description": "drop-in locations, edited"})
    assert rc == 0 and unit_property(UNIT, "Description") == "drop-in locations, edited", result
