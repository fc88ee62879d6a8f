# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The no-op fast path's proof, in one module call: a redeploy of what already serves changes
nothing, so when this proves that, the endpoint's gates (budget, payload, deploy) need not run.

It holds only when every check passes, in this order (cheapest first; the first that fails is the
reason the full path runs):
- record: a last-known-good record exists;
- gates: the inputs the controller-side gates judged at the last green deploy (the budget's
  devices, the payload gate's settings) are the ones given now;
- rendered: the full path's own steps, run in check mode, would change nothing: the record (shape,
  engine and unit arguments, payload identity), the image digest, the container's env file and
  the kept secrets, the unit file and its env file, the firewall, retired units, payload links;
- payload: the payload gate's own verification passes: every file of the manifest at its size,
  and, when the gate checks sha256, its digest (a stamp from an earlier verification when the file
  has not changed since, else hashed now);
- running: the unit is loaded, enabled and active with a MainPID;
- health: the health gate passes at once - the port's listener is this unit's engine (its cgroup,
  or its container's engine under a live conmon), /health answers, /v1/models lists the served id;
- probe: the smoke probe answers (not in check mode);
- stable: MainPID and NRestarts are the same at the end as at the start.
Nothing here changes the host: every step runs through a check-mode Host. The one file it may
write is the payload gate's own cache, a stamp after it hashed a file (as the gate's verify does).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import read_header
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_secrets import with_key
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.health import HttpGet, http_get, wait_healthy
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.probe import run_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.records import RECORD_FILE, read_record
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import GateError, UnitManager
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_step import _health_spec
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import ManifestError, load_manifest
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import verify_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

Probe = Callable[[dict[str, Any]], str]
# A reason names at most this many actions or files: enough to act on, short enough to read.
SHOWN = 3


class FullPath(Exception):
    """A check failed: the deploy must take the full path; the message says which and why."""


@dataclass
class NoopProof:
    checks: list[dict[str, Any]] = field(default_factory=list)
    main_pid: int = 0
    n_restarts: int = 0
    health: dict[str, Any] = field(default_factory=dict)
    completion: str = ""
    record: dict[str, Any] = field(default_factory=dict)
    proc: str = "/proc"  # where the listener's process is judged (a test's made-up tree)

    def passed(self, check: str, detail: str) -> None:
        self.checks.append({"check": check, "ok": True, "detail": detail})

    def timed(self, seconds: float) -> None:
        """The last check's cost: the proof's profile, check by check."""
        self.checks[-1]["seconds"] = round(seconds, 3)


def check_noop(params: dict[str, Any], host: Host, probe: Probe = run_probe, get: HttpGet = http_get, proc: str = "/proc") -> dict[str, Any]:
    """The verdict: `noop` (bool), `full_path_reason` (empty when it holds: `check: why`),
    `checks` (each passed check with what it saw, then the failed one), `main_pid`, `health`."""
    # Every step of the proof reads only: a forgotten branch cannot change the host.
    dry = Host(host.query, check_mode=True)
    proof = NoopProof(proc=proc)
    for check, step in CHECKS:
        begun = time.monotonic()
        try:
            step(params, dry, proof, probe if not host.check_mode else None, get)
        # Any failure of the proof sends the deploy down the full path, which reports it in its own words.
        except Exception as reason:
            detail = str(reason) if isinstance(reason, FullPath) else f"the check could not run: {type(reason).__name__}: {reason}"
            proof.checks.append({"check": check, "ok": False, "detail": detail})
            proof.timed(time.monotonic() - begun)
            return _verdict(proof, f"{check}: {detail}")
        proof.timed(time.monotonic() - begun)
    return _verdict(proof, "")


def _verdict(proof: NoopProof, reason: str) -> dict[str, Any]:
    return {
        "changed": False,
        "noop": not reason,
        "full_path_reason": reason,
        "checks": proof.checks,
        "main_pid": proof.main_pid,
        "n_restarts": proof.n_restarts,
        "health": proof.health,
        "completion": proof.completion,
    }


def _record(params: dict[str, Any], dry: Host, proof: NoopProof, _probe: Probe | None, _get: HttpGet) -> None:
    path = f"{params['record_dir'].rstrip('/')}/{RECORD_FILE}"
    warnings: list[str] = []
    proof.record = read_record(path, dry, warnings) or {}
    if not proof.record:
        raise FullPath(f"no last-known-good record at {path}" + (f" ({warnings[0]})" if warnings else " (a first deploy)"))
    proof.passed("record", path)


def _gates(params: dict[str, Any], _dry: Host, proof: NoopProof, _probe: Probe | None, _get: HttpGet) -> None:
    # As JSON reads it back, so a tuple and a list, or an int key and a str one, compare equal.
    given = json.loads(json.dumps(params.get("gates") or {}, sort_keys=True))
    recorded = proof.record.get("gates")
    if recorded is None:
        raise FullPath("the record names no gate inputs (written before the fast path existed); the full path records them")
    if recorded != given:
        changed = sorted(k for k in set(recorded) | set(given) if recorded.get(k) != given.get(k))
        raise FullPath(f"the inputs of the gates {', '.join(changed)} differ from the last green deploy's: those gates must judge them")
    proof.passed("gates", f"{', '.join(sorted(given)) or 'none'} as at the last green deploy")


def _rendered(params: dict[str, Any], dry: Host, proof: NoopProof, _probe: Probe | None, _get: HttpGet) -> None:
    try:
        result = deploy_endpoint({**params, "noop_check": False}, dry, diff=True)
    except StepError as exc:
        raise FullPath(f"the full path's steps refuse, in check mode: {exc}") from None
    steps = result.get("steps") or {}
    changed = [name for name, step in steps.items() if isinstance(step, dict) and step.get("changed")]
    if changed or dry.actions:
        detail = f"would change {', '.join(changed) or 'nothing by step'}"
        record_keys = _record_keys_changed(steps.get("record") or {})
        if record_keys:
            detail += f" (the record's {', '.join(record_keys)})"
        if (steps.get("record") or {}).get("secrets_changed"):
            detail += " (the secrets differ from the last green deploy's)"
        shown = ", ".join(dry.actions[:SHOWN]) + (f", and {len(dry.actions) - SHOWN} more" if len(dry.actions) > SHOWN else "")
        raise FullPath(f"the full path {detail}: {shown or 'no action'}")
    image = (steps.get("engine") or {}).get("image", "")
    proof.passed("rendered", f"unit, env files, secrets, firewall and record as rendered{'; ' + image if image else ''}")


def _record_keys_changed(record_step: dict[str, Any]) -> list[str]:
    diff = record_step.get("diff") or {}
    try:
        before, after = json.loads(diff.get("before") or "{}"), json.loads(diff.get("after") or "{}")
    except ValueError:
        return []
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def _payload(params: dict[str, Any], _dry: Host, proof: NoopProof, _probe: Probe | None, _get: HttpGet) -> None:
    """The payload gate's own verification (what tasks/payload.yml runs), in this call: sizes, and
    with check_hash the sha256 of each file - the stamp a verification left, when the file has not
    changed since (size, mtime, ctime, inode), else hashed now (a read-only payload keeps no stamps)."""
    payload = params.get("payload") or {}
    if not payload.get("manifest"):
        raise FullPath("no payload manifest given: the payload gate decides")
    try:
        manifest = load_manifest(str(payload["manifest"]))
    except (ManifestError, OSError) as exc:
        raise FullPath(f"the manifest {payload['manifest']} does not load: {exc}") from None
    dest, by_hash = str(payload["dir"]), bool(payload.get("check_hash"))
    verdicts = verify_payload(manifest, dest, check_hash=by_hash, trust_stamps=True, split_count=_gguf_split_count)
    wrong = [f"{v.path} ({v.status})" for v in verdicts if not v.ok]
    if wrong:
        raise FullPath(f"{dest} does not pass the payload gate: {', '.join(wrong[:SHOWN])}")
    proof.passed("payload", f"{len(verdicts)} files at their sizes" + (", each with the manifest's sha256" if by_hash else ""))


def _gguf_split_count(path: str) -> int:
    """The split.count of a GGUF header (0 without one), as hf_payload_gate's verify reads it."""
    return int(read_header(path).get("split.count", 0) or 0)


def _running(params: dict[str, Any], dry: Host, proof: NoopProof, _probe: Probe | None, _get: HttpGet) -> None:
    unit = str(params["unit"]["name"])
    try:
        props = UnitManager(dry, proc=proof.proc).show(unit)
    except GateError as exc:
        raise FullPath(str(exc)) from None
    proof.main_pid = int(props.get("MainPID", "0") or 0)
    proof.n_restarts = int(props.get("NRestarts", "0") or 0)
    state = f"{props.get('LoadState')}, {props.get('UnitFileState')}, {props.get('ActiveState')}/{props.get('SubState')}"
    enabled_wanted = params["unit"].get("enabled", True) is not False
    if props.get("ActiveState") != "active" or not proof.main_pid or (enabled_wanted and props.get("UnitFileState") != "enabled"):
        raise FullPath(f"{unit} is {state}, MainPID {proof.main_pid}: the full path starts or enables it")
    proof.passed("running", f"{unit} {state}, MainPID {proof.main_pid}")


def _health(params: dict[str, Any], dry: Host, proof: NoopProof, _probe: Probe | None, get: HttpGet) -> None:
    health = params["unit"].get("health")
    if not health:
        raise FullPath("the unit has no health gate: nothing proves what serves")
    try:
        spec = _health_spec(with_key(health, str(params.get("api_key") or "")) or {})
    except StepError as exc:
        raise FullPath(str(exc)) from None
    unit = str(params["unit"]["name"])
    try:
        # Once, no wait: an engine not healthy now takes the full path, whose gate waits for it.
        report = wait_healthy(UnitManager(dry, proc=proof.proc), unit, replace(spec, timeout=0.0), 0.0, proof.n_restarts, get=get)
    except GateError as exc:
        raise FullPath(str(exc)) from None
    proof.health = report.as_dict()
    if report.main_pid != proof.main_pid:
        raise FullPath(f"MainPID moved from {proof.main_pid} to {report.main_pid} during the check")
    proof.passed("health", f"port {spec.port} held by PID {report.listener_pid} ({report.ownership}); serves {report.models}")


def _probe(params: dict[str, Any], _dry: Host, proof: NoopProof, probe: Probe | None, _get: HttpGet) -> None:
    if not params.get("probe"):
        proof.passed("probe", "no probe given")
        return
    if probe is None:
        proof.passed("probe", "check mode sends nothing")
        return
    try:
        proof.completion = probe(with_key(params["probe"], str(params.get("api_key") or "")) or {})
    except StepError as exc:
        raise FullPath(f"the smoke probe failed: {exc}") from None
    proof.passed("probe", f"answered {len(proof.completion)} characters")


def _stable(params: dict[str, Any], dry: Host, proof: NoopProof, _probe: Probe | None, _get: HttpGet) -> None:
    unit = str(params["unit"]["name"])
    try:
        props = UnitManager(dry, proc=proof.proc).show(unit)
    except GateError as exc:
        raise FullPath(str(exc)) from None
    now = (int(props.get("MainPID", "0") or 0), int(props.get("NRestarts", "0") or 0))
    if now != (proof.main_pid, proof.n_restarts):
        raise FullPath(f"{unit} moved during the check: MainPID {proof.main_pid} -> {now[0]}, NRestarts {proof.n_restarts} -> {now[1]}")
    proof.passed("stable", f"MainPID {now[0]} and NRestarts {now[1]} unchanged")


# In order, cheapest first: the first that fails is the reason (module docs, endpoint_deploy noop_check).
CHECKS: tuple[tuple[str, Callable[[dict[str, Any], Host, NoopProof, Probe | None, HttpGet], None]], ...] = (
    ("record", _record),
    ("gates", _gates),
    ("rendered", _rendered),
    ("payload", _payload),
    ("running", _running),
    ("health", _health),
    ("probe", _probe),
    ("stable", _stable),
)
