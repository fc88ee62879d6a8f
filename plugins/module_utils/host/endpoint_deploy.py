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
import time
from collections.abc import Callable
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import FileTooLarge, read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_step import ensure_engine
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.firewall import ensure_firewall, firewall_from
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.probe import run_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.retire import archive_copy, archive_dir, retire_unit, runtime_swap
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import UNIT_OPTIONS
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.step_report import StepError
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import JOURNALCTL, SYSTEMCTL
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_step import ensure_unit
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.boot_ledger import parse_boot_log
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload import generations as payload_generations
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import MAX_MANIFEST_BYTES, ManifestError, manifest_digest, parse_manifest_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import not_whole

RECORD_FILE = "last-good.json"
LEDGER_FILE = "boot-ledger.json"
# A record is a few KiB; anything near this bound is not one of ours.
MAX_RECORD_BYTES = 1 << 20
# Where each engine reads its API key from the environment (llama-server's --api-key and vLLM's
# --api-key would put it in argv, /proc/PID/cmdline and the unit file).
API_KEY_ENV = {"llamacpp": "LLAMA_API_KEY", "vllm": "VLLM_API_KEY"}
# Environment names that carry credentials: refused in the plain (recorded, 0640) environment.
_SECRET_NAME_PARTS = ("API_KEY", "TOKEN", "PASSWORD", "SECRET")
Probe = Callable[[dict[str, Any]], str]


def _without_secrets(params: dict[str, Any] | None) -> dict[str, Any]:
    """Step arguments as recorded: no secret environment, no key (health and probe carry one)."""
    kept = {k: v for k, v in (params or {}).items() if k != "secret_environment"}
    if isinstance(kept.get("health"), dict):
        kept["health"] = {k: v for k, v in kept["health"].items() if k != "api_key"}
    return kept


def _engine_secrets(params: dict[str, Any]) -> dict[str, str]:
    """The engine's secret environment: the inventory's secrets plus the endpoint's API key under
    the variable its runtime reads."""
    secrets = {str(k): str(v) for k, v in (params.get("secret_environment") or {}).items()}
    api_key = params.get("api_key") or ""
    for where in ("engine", "unit"):
        plain = ((params.get(where) or {}).get("environment")) or {}
        leaked = sorted(k for k in plain if any(part in str(k).upper() for part in _SECRET_NAME_PARTS))
        if leaked:
            raise StepError(
                f"{where}.environment: {', '.join(leaked)} look like credentials, and the plain environment is recorded and "
                "readable: give an API key as endpoint_api_key and other secrets in endpoint_secret_environment (from Ansible Vault)",
                {"changed": False},
            )
    if api_key:
        runtime = str((params.get("shape") or {}).get("runtime", ""))
        if runtime not in API_KEY_ENV:
            raise StepError(f"api_key: the shape's runtime ({runtime or 'none given'}) has no API-key variable; use llamacpp or vllm", {"changed": False})
        secrets[API_KEY_ENV[runtime]] = api_key
    return secrets


def _with_key(step: dict[str, Any] | None, api_key: str) -> dict[str, Any] | None:
    """A health or probe argument set that authenticates with the endpoint's key."""
    if not step or not api_key:
        return step
    return {**step, "api_key": api_key}


def _read_json(path: str, host: Host, warnings: list[str]) -> Any:
    """A record this module wrote, or None. One that is unreadable (damaged disk, a hand edit) is
    moved aside, named in a warning, and the deploy goes on as a first deploy."""
    try:
        text = read_text(path, MAX_RECORD_BYTES)
        value = json.loads(text) if text is not None else None
        if value is None or isinstance(value, dict):
            return value
        problem = f"holds a JSON {type(value).__name__}, not an object"
    except (FileTooLarge, ValueError) as exc:
        problem = str(exc)
    kept = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
    warnings.append(f"{path} is unreadable ({problem}); kept aside as {kept}, and this deploy runs as a first deploy")
    host.move(path, kept)
    return None


def _bring_up(
    engine: dict[str, Any] | None,
    unit: dict[str, Any],
    secrets: dict[str, Any],
    host: Host,
    diff: bool,
    restart: bool = False,
    api_key: str = "",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Engine (when podman) then unit; secrets go to the container's env file or the unit's.
    A changed container env file restarts the unit: a secrets-only change is a real change."""
    engine_result: dict[str, Any] = {"changed": False, "skipped": "native engine: no container"}
    unit = dict(unit, restart=restart or bool(unit.get("restart")))
    if unit.get("health"):
        unit["health"] = _with_key(unit["health"], api_key)
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


def _retire(params: dict[str, Any], previous: dict[str, Any] | None, record: dict[str, Any], host: Host) -> dict[str, Any]:
    """Before the new unit starts (its port may still be held): the units the inventory retires,
    and, on a runtime or launch swap, a copy of the unit file about to be replaced, both into one
    dated archive directory beside the records."""
    unit = params["unit"]
    unit_dir = str(unit.get("unit_dir") or UNIT_OPTIONS["unit_dir"]["default"])
    archive = archive_dir(os.path.dirname(os.path.normpath(params["record_dir"])))
    units = [retire_unit(str(name), host, unit_dir, archive) for name in params.get("retire_units") or []]
    result: dict[str, Any] = {"changed": any(u["changed"] for u in units), "units": units, "swap": runtime_swap(previous, record["shape"])}
    if result["swap"]:
        result["archived_to"] = archive_copy(host, os.path.join(unit_dir, str(unit["name"])), archive)
        result["changed"] = result["changed"] or bool(result["archived_to"])
    return result


def _secrets_path(unit: dict[str, Any]) -> str:
    """The last-known-good secrets: beside the env files (root-only), never in the record."""
    env_dir = str(unit.get("env_dir") or UNIT_OPTIONS["env_dir"]["default"])
    return os.path.join(env_dir, str(unit["name"]).rsplit(".", 1)[0] + ".last-good-secrets.json")


def deploy_endpoint(params: dict[str, Any], host: Host, diff: bool, probe: Probe = run_probe) -> dict[str, Any]:
    """Returns `steps: {engine, unit, probe, record}`, each with its own `changed` (and `diff`),
    and `actions`: every change the host got (or, in check mode, would get)."""
    record_dir = params["record_dir"]
    record_path = os.path.join(record_dir, RECORD_FILE)
    warnings: list[str] = []
    previous = _read_json(record_path, host, warnings)
    previous_text = None if previous is None else read_text(record_path, MAX_RECORD_BYTES)
    secrets = _engine_secrets(params)
    api_key = str(params.get("api_key") or "")
    secrets_path = _secrets_path(params["unit"])
    previous_secrets = _read_json(secrets_path, host, warnings)

    if params.get("restore"):
        return _restore(params, host, diff, previous, previous_text, previous_secrets, secrets, api_key, warnings)

    engine, unit = params.get("engine"), params["unit"]
    # The firewall goes in before the engine listens; the unit reloads it before every start, with
    # full privileges (`+`): a sandboxed native engine's unit has no CAP_NET_ADMIN to load it.
    endpoint = str(unit["name"]).rsplit(".", 1)[0]
    firewall_result = ensure_firewall(endpoint, firewall_from(endpoint, params.get("firewall")), host, diff)
    unit = unit_with_firewall(unit, firewall_result.pop("pre_start", None))
    record = {"shape": params.get("shape") or {}, "engine": _without_secrets(engine) or None, "unit": _without_secrets(unit)}
    if params.get("payload"):
        record["payload"] = payload_identity(params["payload"])
    retire_result = _retire(params, previous, record, host)
    payload_result: dict[str, Any] | None = None
    try:
        if (record.get("payload") or {}).get("generation"):
            # Just before the restart: the engine's next start reads the new generation.
            payload_result = _switch_payload(record["payload"], host, bring_back=False)
        restart = bool(payload_result and payload_result["changed"])
        engine_result, unit_result = _bring_up(engine, unit, secrets, host, diff, restart=restart, api_key=api_key)
        probe_result: dict[str, Any] = {"changed": False}
        if not params.get("probe"):
            probe_result["skipped"] = "no probe given"
        elif host.check_mode:
            probe_result["skipped"] = "check mode sends nothing"
        else:
            probe_result["completion"] = probe(_with_key(params["probe"], api_key) or {})
    except StepError as failure:
        failure.result.setdefault("warnings", warnings)
        same_as_last_good = previous == record and previous_secrets in (None, secrets)
        if host.check_mode or not params.get("rollback", True) or previous is None or same_as_last_good:
            failure.result.setdefault("rolled_back", False)
            failure.result.setdefault("actions", host.actions)
            raise
        # The new shape (or the new secrets) failed after the host changed: bring the last-known-good one back up.
        restored = previous_secrets if previous_secrets is not None else secrets
        try:
            restore_payload(previous, host)
            _bring_up(previous.get("engine"), previous["unit"], restored, host, False, restart=True, api_key=_restored_key(previous, restored, api_key))
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
        ledger = _record_boot_ledger(host, unit["name"], record_dir, record["shape"])
        # What this restart cost clients, kept with the boot so the runbook shows it.
        ledger["restart"] = {"drain": unit_result.get("drain"), "start_to_healthy_s": unit_result.get("start_to_healthy_s")}
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    record_result: dict[str, Any] = {"changed": text != previous_text, "path": record_path}
    if record_result["changed"]:
        if previous_text is not None:
            _push_generation(host, record_dir, previous_text, int(params.get("keep_generations") or 3))
        host.write(record_path, text, 0o600, dir_mode=0o700)
        if diff:
            record_result["diff"] = {"before": previous_text or "", "after": text, "before_header": record_path, "after_header": record_path}
    if previous_secrets != secrets:
        # Kept for the next rollback; the step reports the file, never its content.
        if secrets:
            host.write(secrets_path, json.dumps(secrets, sort_keys=True) + "\n", 0o600, dir_mode=0o700)
        elif previous_secrets is not None:
            host.remove(secrets_path)
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
        _payload_diffs(payload_result, retention)
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
    older = _generation_files(record_dir)
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
        target = _read_json(older[generation - 1], host, warnings)
        if target is None or "unit" not in target:
            raise StepError(f"generation: {older[generation - 1]} is not a record", {"changed": False, "warnings": warnings})
        restored = secrets
    key = _restored_key(target, restored, api_key)
    payload_result = restore_payload(target, host)
    engine_result, unit_result = _bring_up(target.get("engine"), target["unit"], restored, host, diff, restart=True, api_key=key)
    record_result: dict[str, Any] = {"changed": False, "path": record_path}
    if generation:
        _push_generation(host, record_dir, previous_text or "", int(params.get("keep_generations") or 3), replacing=older[generation - 1])
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


def payload_identity(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload a shape runs: its directory, its manifest and the manifest's sha256 (which pins
    every file's size and digest), kept in the record so a rollback can tell the same payload."""
    identity: dict[str, Any] = {"dir": str(payload.get("dir") or ""), "manifest": str(payload.get("manifest") or "")}
    if identity["manifest"]:
        text = read_text(identity["manifest"], MAX_MANIFEST_BYTES)
        if text is None:
            raise StepError(f"payload.manifest: {identity['manifest']} does not exist", {"changed": False})
        identity["manifest_sha256"] = manifest_digest(text)
        if int(payload.get("generations") or 0) > 0:
            # The generation directory holding this payload is named by the same digest.
            identity["generation"] = identity["manifest_sha256"]
    return identity


def _retain_payloads(payload: dict[str, Any], serving: str | None, host: Host) -> dict[str, Any]:
    """After a green deploy, in the same call (no extra round trip): payload generations past K and
    old rejected copies go to the purge staging, deleted only when approved."""
    keep, keep_rejected = int(payload.get("generations") or 0), int(payload.get("keep_rejected", 2))
    try:
        return payload_generations.retain(str(payload.get("dir") or ""), keep, keep_rejected, bool(payload.get("purge_approved")), host, serving)
    except (payload_generations.GenerationError, OSError) as exc:
        raise StepError(
            f"the deploy is green and recorded, but keeping its payload generations failed: {exc}",
            {"changed": True, "rolled_back": False, "actions": host.actions},
        ) from None


def _payload_diffs(switched: dict[str, Any] | None, retention: dict[str, Any] | None) -> None:
    """--diff shows where the payload link goes and what retention moves or deletes."""
    if switched and switched["changed"]:
        link = switched["link"]
        before = f"{link} -> {switched.get('previous') or '(a directory, or nothing)'}\n"
        switched["diff"] = {"before": before, "after": f"{link} -> {switched['generation']}\n", "before_header": link, "after_header": link}
    if retention and retention["actions"]:
        retention["diff"] = {"before": "", "after": "".join(f"{action}\n" for action in retention["actions"]), "after_header": "payload retention"}


def _switch_payload(payload: dict[str, Any], host: Host, bring_back: bool) -> dict[str, Any]:
    try:
        return payload_generations.switch(str(payload.get("dir") or ""), payload["generation"], host, bring_back=bring_back)
    except (payload_generations.GenerationError, OSError) as exc:
        raise StepError(str(exc), {"changed": False}) from None


def restore_payload(record: dict[str, Any], host: Host) -> dict[str, Any] | None:
    """Before a known-good shape comes back: with payload generations, point the payload
    directory at the generation its record names (brought back from the purge staging if it is
    there, refused if it was purged); without, check that the payload it ran is still on disk."""
    payload = record.get("payload") or {}
    if not payload.get("generation") and payload.get("manifest_sha256") and _is_generation_link(str(payload.get("dir") or "")):
        # A record from before generations, its directory adopted since: the adopted generation
        # carries the digest of the same manifest when it was adopted with that manifest.
        payload = {**payload, "generation": payload["manifest_sha256"]}
    if payload.get("generation"):
        return _switch_payload(payload, host, bring_back=True)
    check_payload(record)
    return None


def _is_generation_link(payload_dir: str) -> bool:
    try:
        return payload_generations.link_state(payload_generations.Layout(payload_dir))[0] == "generation"
    except payload_generations.GenerationError:
        return False


def check_payload(record: dict[str, Any]) -> None:
    """Before a known-good shape comes back: the payload it ran must still be on disk, as it was.
    Its manifest must read the same, and each file it lists must be there at its size (metadata
    only; the payload gate verified the bytes when the shape was deployed). A payload that moved
    on (a new revision fetched into the same directory) would boot the old shape on new weights."""
    payload = record.get("payload") or {}
    manifest_path = payload.get("manifest")
    if not manifest_path or not payload.get("manifest_sha256"):
        return
    text = read_text(manifest_path, MAX_MANIFEST_BYTES)
    now = manifest_digest(text) if text is not None else None
    if now != payload["manifest_sha256"]:
        raise StepError(
            f"payload: the known-good shape ran {payload.get('dir')} with manifest {manifest_path} (sha256 {payload['manifest_sha256'][:12]}), "
            f"which now {'is gone' if now is None else f'reads sha256 {now[:12]}'}: its payload is not on disk as it was. Put that "
            "payload back (hf_payload_gate state=fetch with its manifest), or deploy a shape for the payload there now",
            {"changed": False},
        )
    try:
        manifest = parse_manifest_text(text, manifest_path)  # the text just pinned by its digest
    except ManifestError as exc:
        raise StepError(f"payload: {manifest_path}: {exc}", {"changed": False}) from None
    listed = not_whole(manifest, str(payload.get("dir") or ""))
    if listed:
        raise StepError(f"payload: the known-good shape's payload in {payload.get('dir')} is not whole: {listed}", {"changed": False})


GENERATIONS_DIR = "generations"


def _generation_files(record_dir: str) -> list[str]:
    """The kept generations before the last-known-good record, newest first (generation 1 first)."""
    directory = os.path.join(record_dir, GENERATIONS_DIR)
    try:
        names = [n for n in os.listdir(directory) if n.startswith("gen-") and n.endswith(".json")]
    except FileNotFoundError:
        return []
    return [os.path.join(directory, n) for n in sorted(names, reverse=True)]


def _push_generation(host: Host, record_dir: str, text: str, keep: int, replacing: str = "") -> None:
    """The record being replaced becomes generation 1; at most keep - 1 older ones stay (keep counts
    the last-known-good record too)."""
    if replacing:
        host.remove(replacing)
    path = os.path.join(record_dir, GENERATIONS_DIR, f"gen-{time.time_ns():020d}.json")
    host.write(path, text, 0o600, dir_mode=0o700)
    kept = [p for p in _generation_files(record_dir) if p != replacing]
    if path not in kept:  # check mode wrote nothing
        kept.insert(0, path)
    for stale in kept[max(keep - 1, 0) :]:
        host.remove(stale)


def list_generations(record_dir: str) -> list[dict[str, Any]]:
    """Generation 0 (the last-known-good record) and the kept ones before it: when each was
    replaced and what it served, for the rollback playbook to show."""
    listed = []
    for number, path in enumerate([os.path.join(record_dir, RECORD_FILE), *_generation_files(record_dir)]):
        try:
            record = json.loads(read_text(path, MAX_RECORD_BYTES) or "null")
            shape = record.get("shape") or {}
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.stat(path).st_mtime))
        except (OSError, ValueError, AttributeError):
            continue
        entry = {"generation": number, "written": stamp, "runtime": shape.get("runtime"), "served_id": shape.get("served_id"), "port": shape.get("port")}
        payload = record.get("payload") or {}
        if payload.get("generation"):
            # What a rollback to this record would find of its payload: kept, staged or purged.
            entry["payload"] = {"generation": payload["generation"], "on_disk": payload_generations.where(str(payload.get("dir") or ""), payload["generation"])}
        listed.append(entry)
    return listed


def _restored_key(previous: dict[str, Any], secrets: dict[str, str], api_key: str) -> str:
    """The key the restored engine holds: the one in its secrets, whichever runtime it runs."""
    runtime = str((previous.get("shape") or {}).get("runtime", ""))
    return secrets.get(API_KEY_ENV.get(runtime, ""), "") if runtime in API_KEY_ENV else api_key


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
