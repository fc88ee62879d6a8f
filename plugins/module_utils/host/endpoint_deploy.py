# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One endpoint's host-side deploy in a single call: engine -> unit + health gate -> smoke probe
-> last-known-good record, and on failure the automatic restore of the last-known-good shape.

One module call instead of a dozen tasks matters: over a podman or SSH connection every task
costs a round trip, and a no-op redeploy must not be slower than a plain playbook that checks far
less.

Each concern it composes lives in its own file: the engine and unit steps (engine_step.py,
unit_step.py), the probe (probe.py), the secrets (endpoint_secrets.py), the record and its
generations (records.py), the boot ledger (boot_ledger_record.py), the payload a shape runs
(payload/deployed.py).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.boot_ledger_record import record_boot_ledger
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_secrets import (
    engine_secrets,
    keep_secrets,
    restored_key,
    secrets_path,
    with_key,
    without_secrets,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_step import ensure_engine
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.firewall import check_published, ensure_firewall, firewall_from
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.podman_engine import engine_uid_of, free_engine_uid
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.probe import run_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.records import (
    MAX_RECORD_BYTES,
    RECORD_FILE,
    generation_files,
    kept_records,
    list_generations,
    push_generation,
    read_record,
    write_record,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.retire import archive_copy, archive_dir, renamed_units, retire_unit, runtime_swap
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import UNIT_OPTIONS
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_step import as_flag, ensure_unit
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload import deployed as payload_deployed
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload import generations as payload_generations
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

Probe = Callable[[dict[str, Any]], str]


def _bring_up(
    engine: dict[str, Any] | None,
    unit: dict[str, Any],
    secrets: dict[str, Any],
    host: Host,
    diff: bool,
    restart: bool = False,
    api_key: str = "",
    running_key: str = "",
    force_drain: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Engine (when podman) then unit; secrets go to the container's env file or the unit's.
    A changed container env file restarts the unit: a secrets-only change is a real change.
    `running_key`: the key the engine now serving holds, for the drain (the previous one during a
    rotation); `force_drain`: a rollback replaces an engine that failed, with nothing to wait for."""
    engine_result: dict[str, Any] = {"changed": False, "skipped": "native engine: no container"}
    unit = dict(unit, restart=restart or bool(unit.get("restart")))
    if unit.get("health"):
        unit["health"] = with_key(unit["health"], api_key)
        if running_key:
            unit["health"] = {**unit["health"], "drain_api_key": running_key}
        if force_drain:
            unit["health"] = {**unit["health"], "drain_force": True}
    if engine:
        engine_result = ensure_engine({**engine, "secret_environment": secrets}, host, diff)
        unit.update(command=engine_result["run_argv"], stop_command=engine_result["stop_argv"])
        unit["restart"] = unit["restart"] or bool(engine_result.get("env_changed"))
    else:
        unit["secret_environment"] = secrets
        binary = os.path.join(str((unit.get("extra_service") or {}).get("RootDirectory", "/")), str(unit["command"][0]).lstrip("/"))
        if not host.check_mode and not os.access(binary, os.X_OK):
            raise StepError(f"command: the engine binary {unit['command'][0]} is not executable on this host ({binary})", {})
    return engine_result, ensure_unit(unit, host, diff)


class RetirePlan(NamedTuple):
    """The units a deploy retires, read once from the inventory and the kept records: those
    `retire_units` lists, and a renamed endpoint's old unit found by its port (`renamed`, with why);
    `orphans` are only reported."""

    unit_dir: str
    listed: list[str]
    renamed: list[dict[str, Any]]
    orphans: list[dict[str, Any]]

    @property
    def units(self) -> set[str]:
        return set(self.listed) | {found["unit"] for found in self.renamed}


def plan_retirement(params: dict[str, Any]) -> RetirePlan:
    """The deploy's RetirePlan: read before anything on the host changes (the UID check needs it)."""
    unit_dir = str(params["unit"].get("unit_dir") or UNIT_OPTIONS["unit_dir"]["default"])
    listed = [str(name) for name in params.get("retire_units") or []]
    return RetirePlan(unit_dir, listed, *_renamed(params, unit_dir, listed))


def _retire(params: dict[str, Any], previous: dict[str, Any] | None, record: dict[str, Any], host: Host, plan: RetirePlan) -> dict[str, Any]:
    """Before the new unit starts (its port may still be held): the units the plan retires, and,
    on a runtime or launch swap, a copy of the unit file about to be replaced, both into one dated
    archive directory beside the records."""
    unit = params["unit"]
    unit_dir, listed, renamed, orphans = plan
    archive = archive_dir(os.path.dirname(os.path.normpath(params["record_dir"])))
    if str(unit["name"]) in listed:
        raise StepError(f"retire_units: {unit['name']} is this endpoint's own unit; list only the units it replaces", {"changed": False})
    units = [retire_unit(name, host, unit_dir, archive) for name in listed + [found["unit"] for found in renamed]]
    for retired, found in zip(units[len(listed) :], renamed):
        retired["found"] = found["why"]
    result: dict[str, Any] = {"changed": any(u["changed"] for u in units), "units": units, "swap": runtime_swap(previous, record["shape"])}
    if orphans:
        result["orphans"] = orphans
    if result["swap"]:
        result["archived_to"] = archive_copy(host, os.path.join(unit_dir, str(unit["name"])), archive)
        result["changed"] = result["changed"] or bool(result["archived_to"])
    return result


def run_as(engine: dict[str, Any] | None, unit: dict[str, Any]) -> tuple[int | str | None, str, str]:
    """(who an endpoint's engine runs as, the inventory key that decides it, how it was decided);
    None first when systemd gives the unit a UID of its own (DynamicUser=). A container: its numeric
    UID (engine_uid_of). A native engine: its unit's User= (endpoint_unit_extra's over
    endpoint_user, as systemd reads the later line; root when none), a number as it is, a name as
    this host's user database resolves it, or by name for a user the host lacks."""
    if engine and engine.get("name"):
        user = str(engine.get("user") or "")
        how = "the user it is given (endpoint_container.user)" if user else "the UID its name hashes to (engine_uid)"
        return engine_uid_of(str(engine["name"]), user), "endpoint_container.user", how
    extra = unit.get("extra_service") if isinstance(unit.get("extra_service"), dict) else {}
    if as_flag(extra.get("DynamicUser", "")):
        return None, "endpoint_unit_extra.DynamicUser", "a UID systemd allocates for the unit alone"
    key = "endpoint_unit_extra.User" if extra.get("User") else "endpoint_user"
    user = str(extra.get("User") or unit.get("user") or "")
    how = f"its unit's User={user} ({key})" if user else "root, its unit having no User= (endpoint_user empty)"
    if user.isdigit():
        return int(user), key, how
    try:
        return pwd.getpwnam(user or "root").pw_uid, key, how
    except (KeyError, ValueError):  # no such user here, or a name no user can have (a NUL)
        return f"user {user}", key, how


def check_engine_uid(params: dict[str, Any], engine: dict[str, Any] | None, plan: RetirePlan | None = None) -> None:
    """An engine may not run as the UID of another engine installed on this host (by the other
    endpoints' kept records, whose units are still installed), unless this deploy retires that
    unit (listed, or found renamed): engines sharing a UID could read each other's
    /proc/PID/environ (the API key) and caches. For containers engine_uid hashes names into
    20,000 UIDs, so two can draw one; native engines share one whenever their units name one user
    (or none: root). Refused naming both and what to give one of them."""
    unit = params["unit"]
    mine, key, how = run_as(engine, unit)
    if mine is None:
        return
    if plan is None:
        plan = plan_retirement(params)
    unit_dir, retiring = plan.unit_dir, plan.units
    record_dir = os.path.normpath(params["record_dir"])
    others: dict[str, tuple[int | str | None, str]] = {}
    for path, kept in kept_records(os.path.dirname(record_dir), record_dir):
        their_unit = str(kept["unit"].get("name") or "")
        unit_path = os.path.join(unit_dir, their_unit)
        if their_unit and their_unit != unit.get("name") and their_unit not in retiring and os.path.isfile(unit_path) and not os.path.islink(unit_path):
            other = kept.get("engine") if isinstance(kept.get("engine"), dict) else None
            others[their_unit.rsplit(".", 1)[0]] = (run_as(other, kept["unit"])[0], path)
    clash = next((other for other, (uid, _path) in others.items() if uid is not None and uid == mine), None)
    if clash is None:
        return
    name = str(engine["name"]) if key == "endpoint_container.user" and engine else str(unit["name"]).rsplit(".", 1)[0]
    shown = f"UID {mine}" if isinstance(mine, int) else str(mine)
    if key == "endpoint_container.user":
        free = free_engine_uid({uid for uid, _path in others.values() if isinstance(uid, int)} | {mine}, name)
        fix = f"e.g. endpoint_container.user: '{free}:{free}'"
    else:
        fix = f"e.g. {key}: a system user only {name} runs as (its payload readable by it)"
    raise StepError(
        f"{key}: {name} would run as {shown}, {how}, which {clash} (kept record {others[clash][1]}) "
        f"already runs as on this host: engines sharing a UID can read each other's /proc/PID/environ (the API key) and caches; "
        f"give one of them a UID of its own, {fix}; or, if {clash} is retired, list {clash}.service in endpoint_retired_units",
        {"changed": False},
    )


def _renamed(params: dict[str, Any], unit_dir: str, listed: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A renamed endpoint's old unit, found from the kept records (retire.renamed_units) unless
    `retire_renamed` is off; units the inventory already lists are retired as listed."""
    if params.get("retire_renamed") is False:
        return [], []
    unit = params["unit"]
    port = (params.get("shape") or {}).get("port") or (unit.get("health") or {}).get("port")
    record_dir = os.path.normpath(params["record_dir"])
    renamed, orphans = renamed_units(
        os.path.dirname(record_dir), record_dir, str(unit["name"]), int(port) if port else None, unit_dir, params.get("host_units")
    )
    return [found for found in renamed if found["unit"] not in listed], [found for found in orphans if found["unit"] not in listed]


def deploy_endpoint(params: dict[str, Any], host: Host, diff: bool, probe: Probe = run_probe) -> dict[str, Any]:
    """Returns `steps: {engine, unit, probe, record}`, each with its own `changed` (and `diff`),
    and `actions`: every change the host got (or, in check mode, would get)."""
    record_dir = params["record_dir"]
    record_path = os.path.join(record_dir, RECORD_FILE)
    warnings: list[str] = []
    previous = read_record(record_path, host, warnings)
    previous_text = None if previous is None else read_text(record_path, MAX_RECORD_BYTES)
    secrets = engine_secrets(params)
    api_key = str(params.get("api_key") or "")
    kept_secrets = secrets_path(params["unit"])
    previous_secrets = read_record(kept_secrets, host, warnings)

    if params.get("restore"):
        return _restore(params, host, diff, previous, previous_text, previous_secrets, secrets, api_key, warnings)

    engine, unit = params.get("engine"), params["unit"]
    # The firewall goes in before the engine listens; the unit reloads it before every start, with
    # full privileges (`+`): a sandboxed native engine's unit has no CAP_NET_ADMIN to load it.
    endpoint = str(unit["name"]).rsplit(".", 1)[0]
    firewall = firewall_from(endpoint, params.get("firewall"))
    check_published(firewall, engine)  # before anything on the host changes
    retirement = plan_retirement(params)
    check_engine_uid(params, engine, retirement)
    firewall_result = ensure_firewall(endpoint, firewall, host, diff)
    unit = unit_with_firewall(unit, firewall_result.pop("pre_start", None))
    record = {"shape": params.get("shape") or {}, "engine": without_secrets(engine) or None, "unit": without_secrets(unit)}
    if params.get("gates"):
        # What the controller-side gates judged before this call: the no-op check (noop_check.py)
        # compares the next deploy's with these before it lets those gates be skipped.
        record["gates"] = params["gates"]
    if params.get("payload"):
        with _payload_refusals():
            record["payload"] = payload_deployed.payload_identity(params["payload"])
    retire_result = _retire(params, previous, record, host, retirement)
    warnings += [f"{orphan['unit']}: {orphan['why']}; list it in endpoint_retired_units to retire it" for orphan in retire_result.get("orphans", [])]
    payload_result: dict[str, Any] | None = None
    # What the host had been given before the new shape's steps: a step that fails having changed
    # nothing (a value refused by its own check) leaves the serving engine as it was.
    changes_before = len(host.actions)
    try:
        if (record.get("payload") or {}).get("generation"):
            # Just before the restart: the engine's next start reads the new generation.
            with _payload_refusals():
                payload_result = payload_deployed.switch_payload(record["payload"], host, bring_back=False)
        restart = bool(payload_result and payload_result["changed"])
        # The engine now serving holds the last green deploy's key until its restart: the drain reads with it.
        running_key = restored_key(previous, previous_secrets, api_key) if previous and previous_secrets is not None else ""
        engine_result, unit_result = _bring_up(engine, unit, secrets, host, diff, restart=restart, api_key=api_key, running_key=running_key)
        probe_result: dict[str, Any] = {"changed": False}
        if not params.get("probe"):
            probe_result["skipped"] = "no probe given"
        elif host.check_mode:
            probe_result["skipped"] = "check mode sends nothing"
        else:
            probe_result["completion"] = probe(with_key(params["probe"], api_key) or {})
    except StepError as failure:
        failure.result.setdefault("warnings", warnings)
        same_as_last_good = previous == record and previous_secrets in (None, secrets)
        if host.check_mode or not params.get("rollback", True) or previous is None or same_as_last_good:
            failure.result.setdefault("rolled_back", False)
            failure.result.setdefault("actions", host.actions)
            raise
        if len(host.actions) == changes_before:
            # Refused before it changed anything: the last-known-good engine still serves, untouched;
            # a rollback would only restart it.
            raise StepError(
                f"{failure} (nothing on the host changed: the last-known-good shape serves on, not restarted)",
                {**failure.result, "rolled_back": False, "changed": False, "actions": host.actions},
            ) from None
        # The new shape (or the new secrets) failed after the host changed: bring the last-known-good one back up.
        restored = previous_secrets if previous_secrets is not None else secrets
        try:
            restore_payload(previous, host)
            _bring_up(
                previous.get("engine"),
                previous["unit"],
                restored,
                host,
                False,
                restart=True,
                api_key=restored_key(previous, restored, api_key),
                running_key=api_key,
                force_drain=True,
            )
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
    if unit_result.get("restarted") and not host.check_mode:
        ledger = record_boot_ledger(host, unit["name"], record_dir, record["shape"])
        # What this restart cost clients, kept with the boot so the runbook shows it.
        ledger["restart"] = {"drain": unit_result.get("drain"), "start_to_healthy_s": unit_result.get("start_to_healthy_s")}
    record_result = write_record(host, record_dir, record, previous_text, int(params.get("keep_generations") or 3), diff)
    if keep_secrets(host, kept_secrets, secrets, previous_secrets):
        # Kept for the next rollback; the step reports the file, never its content.
        record_result["secrets_changed"] = True
    # Last: the deploy is recorded whatever retention finds.
    retention = _retain_payloads(params["payload"], record["payload"].get("generation"), host) if params.get("payload") else None
    steps = {
        "retire": retire_result,
        "firewall": firewall_result,
        "engine": engine_result,
        "unit": unit_result,
        "probe": probe_result,
        "record": record_result,
    }
    if payload_result is not None:
        steps["payload"] = payload_result
    if retention is not None:
        steps["payload_retention"] = retention
    result: dict[str, Any] = {
        "changed": any(step["changed"] for step in steps.values()),
        "steps": steps,
        "record": record_path,
        "rolled_back": False,
        "actions": host.actions,
        "warnings": warnings,
        "generations": list_generations(record_dir),
    }
    if ledger is not None:
        result["boot_ledger"] = ledger
    if diff:
        payload_deployed.payload_diffs(payload_result, retention)
    diffs = [step["diff"] for step in (firewall_result, engine_result, unit_result, record_result, payload_result or {}, retention or {}) if step.get("diff")]
    if diff and diffs:
        result["diff"] = diffs
    return result


def _restore(
    params: dict[str, Any],
    host: Host,
    diff: bool,
    previous: dict[str, Any] | None,
    previous_text: str | None,
    previous_secrets: dict[str, Any] | None,
    secrets: dict[str, str],
    api_key: str,
    warnings: list[str],
) -> dict[str, Any]:
    """Bring a known-good shape up again: generation 0 is the last-known-good record, N the Nth
    before it. An older generation that comes up green becomes the last-known-good record (the
    one it replaces is kept as generation 1); it runs with the current secrets, as only the last
    green deploy's secrets are kept."""
    record_dir = params["record_dir"]
    record_path = os.path.join(record_dir, RECORD_FILE)
    generation = int(params.get("generation") or 0)
    older = generation_files(record_dir)
    if previous is None:
        raise StepError(f"restore: no last-known-good record at {record_path}", {"changed": False, "warnings": warnings})
    if generation < 0 or generation > len(older):
        raise StepError(
            f"generation: {generation} is not kept; {record_dir} holds generations 0 (last-known-good) to {len(older)}",
            {"changed": False, "warnings": warnings, "generations": list_generations(record_dir)},
        )
    target, target_text, restored = previous, previous_text, previous_secrets if previous_secrets is not None else secrets
    if generation:
        target_text = read_text(older[generation - 1], MAX_RECORD_BYTES) or ""
        target = read_record(older[generation - 1], host, warnings)
        if target is None or "unit" not in target:
            raise StepError(f"generation: {older[generation - 1]} is not a record", {"changed": False, "warnings": warnings})
        restored = secrets
    key = restored_key(target, restored, api_key)
    payload_result = restore_payload(target, host)
    # The engine now serving holds the kept last-good key (or the current one when none is kept).
    running = restored_key(previous, previous_secrets, api_key) if previous_secrets is not None else api_key
    engine_result, unit_result = _bring_up(target.get("engine"), target["unit"], restored, host, diff, restart=True, api_key=key, running_key=running)
    record_result: dict[str, Any] = {"changed": False, "path": record_path}
    if generation:
        push_generation(host, record_dir, previous_text or "", int(params.get("keep_generations") or 3), replacing=older[generation - 1])
        host.write(record_path, target_text or "", 0o600, dir_mode=0o700)
        record_result.update(changed=True, generation=generation)
    steps = {
        "engine": engine_result,
        "unit": unit_result,
        "probe": {"changed": False, "skipped": "restore runs the health gate, not the probe"},
        "record": record_result,
    }
    if payload_result is not None:
        steps["payload"] = payload_result
    return {
        "changed": True,
        "restored": True,
        "rolled_back": False,
        "steps": steps,
        "record": record_path,
        "actions": host.actions,
        "warnings": warnings,
        "generations": list_generations(record_dir),
    }


def unit_with_firewall(unit: dict[str, Any], firewall_pre_start: list[list[str]] | None) -> dict[str, Any]:
    """The unit loads the endpoint's nftables table before every start with full privileges
    (systemd's `+`): a sandboxed native engine's unit (its own user, no capabilities) cannot."""
    return {**unit, "privileged_pre_start": firewall_pre_start} if firewall_pre_start else unit


@contextmanager
def _payload_refusals() -> Iterator[None]:
    """The payload a shape runs cannot be named, switched to or brought back: the step refuses."""
    try:
        yield
    except payload_deployed.SwitchError as exc:
        raise StepError(str(exc), {"changed": False}) from None


def restore_payload(record: dict[str, Any], host: Host) -> dict[str, Any] | None:
    """Before a known-good shape comes back, its payload (payload/deployed.py restore_payload);
    a payload that cannot come back refuses the step."""
    with _payload_refusals():
        return payload_deployed.restore_payload(record, host)


def _retain_payloads(payload: dict[str, Any], serving: str | None, host: Host) -> dict[str, Any]:
    """Retention after a green deploy (payload/deployed.py retain_payloads): a failure there
    leaves the deploy green and recorded, and says so."""
    try:
        return payload_deployed.retain_payloads(payload, serving, host)
    except (payload_generations.GenerationError, OSError) as exc:
        raise StepError(
            f"the deploy is green and recorded, but keeping its payload generations failed: {exc}",
            {"changed": True, "rolled_back": False, "actions": host.actions},
        ) from None
