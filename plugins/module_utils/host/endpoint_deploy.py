# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One endpoint's host-side deploy in a single call: engine -> unit + health gate -> smoke probe
-> last-known-good record, and on failure the automatic restore of the last-known-good shape.

One module call instead of a dozen tasks matters: over a podman or SSH connection every task
costs a round trip, and a no-op redeploy must not be slower than a plain playbook that checks far
less.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text, write_atomically
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.deploy_steps import StepError, ensure_engine, ensure_unit, run_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import JOURNALCTL, SYSTEMCTL, Runner
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.boot_ledger import parse_boot_log

RECORD_FILE = "last-good.json"
LEDGER_FILE = "boot-ledger.json"


def _without_secrets(params: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (params or {}).items() if k != "secret_environment"}


def _bring_up(
    engine: dict[str, Any] | None,
    unit: dict[str, Any],
    secrets: dict[str, Any],
    run: Runner,
    check_mode: bool,
    diff: bool,
    restart: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Engine (when podman) then unit; secrets go to the container's env file or the unit's."""
    engine_result: dict[str, Any] = {}
    unit = dict(unit, restart=restart or bool(unit.get("restart")))
    if engine:
        engine_result = ensure_engine({**engine, "secret_environment": secrets}, run, check_mode, diff)
        unit.update(command=engine_result["run_argv"], stop_command=engine_result["stop_argv"])
    else:
        unit["secret_environment"] = secrets
        binary = os.path.join(str((unit.get("extra_service") or {}).get("RootDirectory", "/")), str(unit["command"][0]).lstrip("/"))
        if not check_mode and not os.access(binary, os.X_OK):
            raise StepError(f"command: the engine binary {unit['command'][0]} is not executable on this host ({binary})", {})
    return engine_result, ensure_unit(unit, run, check_mode, diff)


def deploy_endpoint(params: dict[str, Any], run: Runner, check_mode: bool, diff: bool) -> dict[str, Any]:
    record_dir = params["record_dir"]
    record_path = os.path.join(record_dir, RECORD_FILE)
    previous_text = read_text(record_path)
    previous = json.loads(previous_text) if previous_text else None
    secrets = params.get("secret_environment") or {}

    if params.get("restore"):
        if previous is None:
            raise StepError(f"restore: no last-known-good record at {record_path}", {"changed": False})
        engine_result, unit_result = _bring_up(previous.get("engine"), previous["unit"], secrets, run, check_mode, diff, restart=True)
        return {"changed": True, "restored": True, "engine": engine_result, "unit": unit_result, "record": record_path}

    engine, unit = params.get("engine"), params["unit"]
    record = {"shape": params.get("shape") or {}, "engine": _without_secrets(engine) or None, "unit": _without_secrets(unit)}
    try:
        engine_result, unit_result = _bring_up(engine, unit, secrets, run, check_mode, diff)
        probe = params.get("probe")
        completion = None
        if probe and not check_mode:
            completion = run_probe(probe)
    except StepError as failure:
        if check_mode or not params.get("rollback", True) or previous is None or previous == record:
            failure.result.setdefault("rolled_back", False)
            raise
        # The new shape failed after the host changed: bring the last-known-good one back up.
        try:
            _bring_up(previous.get("engine"), previous["unit"], secrets, run, False, False, restart=True)
        except StepError as restore_failure:
            raise StepError(
                f"the new shape failed ({failure}); restoring the last-known-good shape failed too ({restore_failure}): the endpoint is down",
                {**failure.result, "rolled_back": False, "changed": True},
            ) from None
        raise StepError(
            f"the new shape failed ({failure}). The last-known-good shape is serving again.",
            {**failure.result, "rolled_back": True, "changed": True},
        ) from None

    changed = bool(engine_result.get("changed") or unit_result.get("changed"))
    ledger = None
    if unit_result.get("changed") and not check_mode:
        ledger = _record_boot_ledger(run, unit["name"], record_dir, record["shape"])
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    if text != previous_text:
        changed = True
        if not check_mode:
            os.makedirs(record_dir, mode=0o700, exist_ok=True)
            write_atomically(record_path, text, 0o600)
    result: dict[str, Any] = {"changed": changed, "engine": engine_result, "unit": unit_result, "record": record_path, "rolled_back": False}
    if completion is not None:
        result["completion"] = completion
    if ledger is not None:
        result["boot_ledger"] = ledger
    if diff and unit_result.get("diff"):
        result["diff"] = unit_result["diff"]
    return result


def _record_boot_ledger(run: Runner, unit: str, record_dir: str, shape: dict[str, Any]) -> dict[str, Any]:
    """After a (re)start: the memory facts the engine printed while booting, kept beside the
    record as calibration (measured beats any formula for this geometry)."""
    # Only this start's lines: the unit's current invocation.
    _rc, invocation, _err = run([SYSTEMCTL, "show", unit, "--property=InvocationID", "--value"])
    match = [f"_SYSTEMD_INVOCATION_ID={invocation.strip()}"] if invocation.strip() else ["--unit", unit]
    _rc, out, _err = run([JOURNALCTL, *match, "--output", "cat", "--lines", "5000", "--no-pager"])
    ledger = parse_boot_log(out).as_dict()
    os.makedirs(record_dir, mode=0o700, exist_ok=True)
    write_atomically(os.path.join(record_dir, LEDGER_FILE), json.dumps({"shape": shape, "ledger": ledger}, indent=2, sort_keys=True) + "\n", 0o600)
    return ledger
