# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""This boot's ledger, kept beside the last-known-good record after every (re)start: the memory
facts the engine printed while booting (this start's journal lines only), for calibration."""

from __future__ import annotations

import json
import os
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import JOURNALCTL, SYSTEMCTL
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_boot_log

LEDGER_FILE = "boot-ledger.json"


def record_boot_ledger(host: Host, unit: str, record_dir: str, shape: dict[str, Any]) -> dict[str, Any]:
    """After a (re)start: the memory facts the engine printed while booting, kept beside the
    record as calibration (measured beats any formula for this geometry)."""
    # Only this start's lines: the unit's current invocation.
    _rc, invocation, _err = host.query([SYSTEMCTL, "show", unit, "--property=InvocationID", "--value"])
    match = [f"_SYSTEMD_INVOCATION_ID={invocation.strip()}"] if invocation.strip() else ["--unit", unit]
    _rc, out, _err = host.query([JOURNALCTL, *match, "--output", "cat", "--lines", "5000", "--no-pager"])
    ledger = parse_boot_log(out).as_dict()
    host.write(os.path.join(record_dir, LEDGER_FILE), json.dumps({"shape": shape, "ledger": ledger}, indent=2, sort_keys=True) + "\n", 0o600, dir_mode=0o700)
    return ledger
