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
from collections.abc import Callable
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.deploy_steps import StepError, ensure_engine, ensure_unit, run_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import JOURNALCTL, SYSTEMCTL
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.boot_ledger import parse_boot_log

RECORD_FILE = "last-good.json"
LEDGER_FILE = "boot-ledger.json"
Probe = Callable[[dict[str, Any]], str]


def _without_secrets(params: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (params or {}).items() if k != "secret_environment"}


def _bring_up(
    engine: dict[str, Any] | None,
    unit: dict[str, Any],
    secrets: dict[str, Any],
    host: Host,
    diff: bool,
    restart: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Engine (when podman) then unit; secrets go to the container's env file or the unit's."""
    engine_result: dict[str, Any] = {"changed": False, "skipped": "native engine: no container"}
    unit = dict(unit, restart=restart or bool(unit.get("restart")))
    if engine:
        engine_result = ensure_engine({**engine, "secret_environment": secrets}, host, diff)
        unit.update(command=engine_result["run_argv"], stop_command=engine_result["stop_argv"])
    else:
        unit["secret_environment"] = secrets
        binary = os.path.join(str((unit.get("extra_service") or {}).get("RootDirectory", "/")), str(unit["command"][0]).lstrip("/"))
        if not host.check_mode and not os.access(binary, os.X_OK):
            raise StepError(f"command: the engine binary {unit['command'][0]} is not executable on this host ({binary})", {})
    return engine_result, ensure_unit(unit, host, diff)


def deploy_endpoint(params: dict[str, Any], host: Host, diff: bool, probe: Probe = run_probe) -> dict[str, Any]:
    """Returns `steps: {engine, unit, probe, record}`, each with its own `changed` (and `diff`),
    and `actions`: every change the host got (or, in check mode, would get)."""
    record_dir = params["record_dir"]
    record_path = os.path.join(record_dir, RECORD_FILE)
    previous_text = read_text(record_path)
    previous = json.loads(previous_text) if previous_text else None
    secrets = params.get("secret_environment") or {}

    if params.get("restore"):
        if previous is None:
            raise StepError(f"restore: no last-known-good record at {record_path}", {"changed": False})
        engine_result, unit_result = _bring_up(previous.get("engine"), previous["unit"], secrets, host, diff, restart=True)
        steps = {
            "engine": engine_result,
            "unit": unit_result,
            "probe": {"changed": False, "skipped": "restore runs the health gate, not the probe"},
            "record": {"changed": False, "path": record_path},
        }
        return {"changed": True, "restored": True, "rolled_back": False, "steps": steps, "record": record_path, "actions": host.actions}

    engine, unit = params.get("engine"), params["unit"]
    record = {"shape": params.get("shape") or {}, "engine": _without_secrets(engine) or None, "unit": _without_secrets(unit)}
    try:
        engine_result, unit_result = _bring_up(engine, unit, secrets, host, diff)
        probe_result: dict[str, Any] = {"changed": False}
        if not params.get("probe"):
            probe_result["skipped"] = "no probe given"
        elif host.check_mode:
            probe_result["skipped"] = "check mode sends nothing"
        else:
            probe_result["completion"] = probe(params["probe"])
    except StepError as failure:
        if host.check_mode or not params.get("rollback", True) or previous is None or previous == record:
            failure.result.setdefault("rolled_back", False)
            failure.result.setdefault("actions", host.actions)
            raise
        # The new shape failed after the host changed: bring the last-known-good one back up.
        try:
            _bring_up(previous.get("engine"), previous["unit"], secrets, host, False, restart=True)
        except StepError as restore_failure:
            raise StepError(
                f"the new shape failed ({failure}); restoring the last-known-good shape failed too ({restore_failure}): the endpoint is down",
                {**failure.result, "rolled_back": False, "changed": True, "actions": host.actions},
            ) from None
        raise StepError(
            f"the new shape failed ({failure}). The last-known-good shape is serving again.",
            {**failure.result, "rolled_back": True, "changed": True, "actions": host.actions},
        ) from None

    ledger = None
    if unit_result.get("changed") and not host.check_mode:
        ledger = _record_boot_ledger(host, unit["name"], record_dir, record["shape"])
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    record_result: dict[str, Any] = {"changed": text != previous_text, "path": record_path}
    if record_result["changed"]:
        host.write(record_path, text, 0o600, dir_mode=0o700)
        if diff:
            record_result["diff"] = {"before": previous_text or "", "after": text, "before_header": record_path, "after_header": record_path}
    steps = {"engine": engine_result, "unit": unit_result, "probe": probe_result, "record": record_result}
    result: dict[str, Any] = {
        "changed": any(step["changed"] for step in steps.values()),
        "steps": steps,
        "record": record_path,
        "rolled_back": False,
        "actions": host.actions,
    }
    if ledger is not None:
        result["boot_ledger"] = ledger
    diffs = [step["diff"] for step in (engine_result, unit_result, record_result) if step.get("diff")]
    if diff and diffs:
        result["diff"] = diffs
    return result


def _record_boot_ledger(host: Host, unit: str, record_dir: str, shape: dict[str, Any]) -> dict[str, Any]:
    """After a (re)start: the memory facts the engine printed while booting, kept beside the
    record as calibration (measured beats any formula for this geometry)."""
    # Only this start's lines: the unit's current invocation.
    _rc, invocation, _err = host.query([SYSTEMCTL, "show", unit, "--property=InvocationID", "--value"])
    match = [f"_SYSTEMD_INVOCATION_ID={invocation.strip()}"] if invocation.strip() else ["--unit", unit]
    _rc, out, _err = host.query([JOURNALCTL, *match, "--output", "cat", "--lines", "5000", "--no-pager"])
    ledger = parse_boot_log(out).as_dict()
    host.write(os.path.join(record_dir, LEDGER_FILE), json.dumps({"shape": shape, "ledger": ledger}, indent=2, sort_keys=True) + "\n", 0o600, dir_mode=0o700)
    return ledger
