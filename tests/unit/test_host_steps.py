"""The host steps on a fake host (fake_host.py): ensure_unit's enable/stop/start paths, the health
wait's fail-fast branches, and endpoint_deploy's rollback branches. No systemd, no sleeps."""

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from fake_host import SYSTEMCTL, FakeClock, FakeRunner, fake_process, show, ss_listening
from generation_payloads import ready, snapshot, write_manifest

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.health import wait_healthy
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.records import RECORD_FILE
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import GateError, HealthSpec, UnitManager
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_step import ensure_unit
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.generations import prepare, retain
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

UNIT = "lab.service"
CGROUP = f"/system.slice/{UNIT}"
PORT = 7771


@pytest.fixture
def dirs(tmp_path):
    return {"unit_dir": str(tmp_path / "units"), "env_dir": str(tmp_path / "env")}


def unit_params(dirs, **overrides):
    # The interpreter stands in for the engine binary: endpoint_deploy checks it is executable.
    return {"name": UNIT, "command": [sys.executable, "-m", "http.server"], **dirs, **overrides}


# --- ensure_unit -----------------------------------------------------------------------------

START = [f"{SYSTEMCTL} start {UNIT}"]
STOP = [f"{SYSTEMCTL} stop {UNIT}"]
NEW = {"LoadState": "not-found", "ActiveState": "inactive"}
RUNNING = {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled"}
FAILED = {"LoadState": "loaded", "ActiveState": "failed", "UnitFileState": "enabled"}


@pytest.mark.parametrize(
    ("case", "props", "overrides", "installed", "expected"),
    [
        ("fresh unit: install, reload, enable, start", NEW, {}, False, ["write", "daemon-reload", "enable", *START]),
        ("installed, enabled, running: nothing to do", RUNNING, {}, True, []),
        ("installed but dead: start only", FAILED, {}, True, START),
        ("enabled: false disables", RUNNING, {"enabled": False}, True, [f"{SYSTEMCTL} disable {UNIT}"]),
        ("state stopped stops a running unit", RUNNING, {"state": "stopped"}, True, STOP),
        ("state stopped leaves a failed unit alone", FAILED, {"state": "stopped"}, True, []),
        ("restart: true stops the old instance, then starts", RUNNING, {"restart": True}, True, [*STOP, *START]),
    ],
)
def test_ensure_unit_paths(dirs, case, props, overrides, installed, expected):
    params = unit_params(dirs, **overrides)
    if installed:
        ensure_unit(params, Host(FakeRunner({(SYSTEMCTL, "show"): [show(**props)]})), diff=False)
    runner = FakeRunner({(SYSTEMCTL, "show"): [show(**props)]})
    host = Host(runner)
    result = ensure_unit(params, host, diff=False)
    actions = [action.split()[0] if action.startswith("write") else action for action in host.actions]
    actions = [action.replace(f"{SYSTEMCTL} daemon-reload", "daemon-reload").replace(f"{SYSTEMCTL} enable {UNIT}", "enable") for action in actions]
    assert actions == expected, case
    assert result["changed"] is bool(expected), case


def test_ensure_unit_in_check_mode_reports_and_mutates_nothing(dirs, tmp_path):
    runner = FakeRunner({(SYSTEMCTL, "show"): [show(LoadState="not-found", ActiveState="inactive")]})
    host = Host(runner, check_mode=True)
    result = ensure_unit(unit_params(dirs), host, diff=True)
    assert result["changed"] and "ExecStart=" in result["diff"]["after"]
    assert host.actions == [f"write {tmp_path}/units/{UNIT} (mode 0644)"]
    assert not (tmp_path / "units").exists()
    # Only reads: systemd's own view of the unit's drop-ins (DropInPaths, FragmentPath).
    assert all(argv[:2] == [SYSTEMCTL, "show"] for argv in runner.calls), runner.calls


def test_a_failing_start_carries_the_journal(dirs):
    runner = FakeRunner(
        {
            (SYSTEMCTL, "show"): [show(LoadState="not-found", ActiveState="inactive")],
            (SYSTEMCTL, "start"): [(1, "", "Job for lab.service failed")],
            ("/usr/bin/journalctl",): [(0, "boom: bad flag\n", "")],
        }
    )
    with pytest.raises(StepError, match="Job for lab.service failed") as failure:
        ensure_unit(unit_params(dirs), Host(runner), diff=False)
    assert failure.value.result["journal"] == ["boom: bad flag"]


# --- wait_healthy ----------------------------------------------------------------------------


def health_wait(tmp_path, script, get, timeout=30.0):
    clock = FakeClock()
    manager = UnitManager(Host(FakeRunner(script)), proc=str(tmp_path / "proc"))
    health = HealthSpec(port=PORT, served_id="lab", timeout=timeout)
    return clock, lambda: wait_healthy(manager, UNIT, health, started_at=100.0, restarts_before=0, clock=clock, sleep=clock.sleep, get=get)


def engine_answers(health_status=200, models=("lab",)):
    def get(_host, _port, path, _api_key=""):
        if path == "/health":
            return health_status, b""
        return 200, json.dumps({"data": [{"id": m} for m in models]}).encode()

    return get


def models_forbidden(_host, _port, path, _api_key=""):
    return (200, b"") if path == "/health" else (403, b"")


ACTIVE = show(ActiveState="active", SubState="running", MainPID=4242, NRestarts=0, ControlGroup=CGROUP)


def test_green_when_the_units_fresh_listener_answers(tmp_path):
    fake_process(tmp_path / "proc", 4242, CGROUP, "llama-server --port 7771", started_s=200)
    clock, wait = health_wait(tmp_path, {(SYSTEMCTL, "show"): [ACTIVE], ("/usr/bin/ss",): [ss_listening(PORT, 4242)]}, engine_answers())
    report = wait()
    assert report.healthy and report.listener_pid == 4242 and report.models == ["lab"]
    assert clock.sleeps == []


@pytest.mark.parametrize(
    ("case", "show_answers", "listener", "get", "message"),
    [
        (
            "crash loop: NRestarts grows during the wait",
            [show(ActiveState="activating", NRestarts=0), show(ActiveState="activating", NRestarts=2)],
            None,
            engine_answers(),
            "crash-looping: NRestarts went 0 -> 2",
        ),
        ("a foreign listener on the port", [ACTIVE], ("/system.slice/other.service", "python3 -m http.server"), engine_answers(), "a foreign process answers"),
        ("401 from /health", [ACTIVE], (CGROUP, "llama-server"), engine_answers(health_status=401), "/health on port 7771 answered 401 Unauthorized"),
        ("403 from /v1/models", [ACTIVE], (CGROUP, "vllm serve"), models_forbidden, "/v1/models on port 7771 answered 403 Forbidden"),
    ],
)
def test_health_wait_fails_fast(tmp_path, case, show_answers, listener, get, message):
    script = {(SYSTEMCTL, "show"): show_answers}
    if listener:
        fake_process(tmp_path / "proc", 4242, listener[0], listener[1], started_s=200)
        script[("/usr/bin/ss",)] = [ss_listening(PORT, 4242)]
    clock, wait = health_wait(tmp_path, script, get)
    with pytest.raises(GateError, match=message) as failure:
        wait()
    assert clock.now < 30.0, f"{case}: waited {clock.now} s of a 30 s timeout"
    assert "journal" in failure.value.details and failure.value.details["health"]["healthy"] is False


def test_a_survivor_of_an_earlier_run_is_waited_for_then_times_out(tmp_path):
    # In the unit's cgroup but started before this start (100 s): not fresh yet, so the gate waits.
    fake_process(tmp_path / "proc", 4242, CGROUP, "llama-server --port 7771", started_s=50)
    clock, wait = health_wait(tmp_path, {(SYSTEMCTL, "show"): [ACTIVE], ("/usr/bin/ss",): [ss_listening(PORT, 4242)]}, engine_answers(), timeout=5)
    with pytest.raises(GateError, match="not healthy after 5 s: PID 4242 .* started before this start"):
        wait()
    assert clock.now > 5 and len(clock.sleeps) == 11


# --- endpoint_deploy's rollback branches -------------------------------------------------------

DEAD = show(LoadState="loaded", ActiveState="inactive", UnitFileState="enabled", NRestarts=0)


def deploy(tmp_path, dirs, description, start_answers, probe=None):
    runner = FakeRunner({(SYSTEMCTL, "show"): [DEAD], (SYSTEMCTL, "start"): start_answers})
    params = {"unit": unit_params(dirs, description=description), "record_dir": str(tmp_path / "record"), "rollback": True}
    if probe:
        params["probe"] = {"port": PORT, "served_id": "lab"}
    result = deploy_endpoint(params, Host(runner), diff=False, probe=probe or (lambda _p: "hello"))
    return runner, result


def installed_description(dirs):
    with open(f"{dirs['unit_dir']}/{UNIT}", encoding="utf-8") as handle:
        return next(line for line in handle if line.startswith("Description="))


OK, FAIL = (0, "", ""), (1, "", "start refused")


def failing_probe(_probe):
    raise StepError("smoke probe: the completion is empty (0 completion tokens)", {})


@pytest.mark.parametrize(
    ("case", "previous", "start_answers", "probe", "message", "rolled_back", "serving", "starts"),
    [
        ("no record: nothing to go back to", None, [FAIL], None, "start refused", False, "new", 1),
        ("the record is this very shape", "new", [FAIL], None, "start refused", False, "new", 1),
        ("new shape fails, the old one comes back", "old", [FAIL, OK], None, "The last-known-good shape is serving again", True, "old", 2),
        ("the probe fails, the old one comes back", "old", [OK], failing_probe, "0 completion tokens.*serving again", True, "old", 2),
        ("restoring fails too", "old", [FAIL], None, "restoring the last-known-good shape failed too .*the endpoint is down", False, "old", 2),
    ],
)
def test_rollback_branches(tmp_path, dirs, case, previous, start_answers, probe, message, rolled_back, serving, starts):
    if previous:
        deploy(tmp_path, dirs, previous, [OK])
    record_before = (tmp_path / "record" / RECORD_FILE).read_text() if previous else None
    with pytest.raises(StepError, match=message) as failure:
        deploy(tmp_path, dirs, "new", start_answers, probe)
    assert failure.value.result["rolled_back"] is rolled_back, case
    assert installed_description(dirs) == f"Description={serving}\n", case
    # The failed shape never becomes the last-known-good record.
    record_after = (tmp_path / "record" / RECORD_FILE).read_text() if previous else None
    assert record_after == record_before, case
    assert sum(1 for action in failure.value.result["actions"] if action == f"{SYSTEMCTL} start {UNIT}") == starts, case


def test_a_new_shape_refused_before_the_host_changed_leaves_the_serving_engine_alone(tmp_path, dirs):
    # A value refused by its own check (here a control character in the unit's description) fails
    # before anything is written or run: no rollback restart cuts the engine that serves.
    deploy(tmp_path, dirs, "old", [OK])
    with pytest.raises(StepError, match=r"description: control characters .* \(nothing on the host changed: the last-known-good shape serves on") as failure:
        deploy(tmp_path, dirs, "new\nExecStartPre=/bin/true", [OK])
    assert failure.value.result["rolled_back"] is False and failure.value.result["changed"] is False
    assert failure.value.result["actions"] == []
    assert installed_description(dirs) == "Description=old\n"


def test_a_green_deploy_reports_each_step_and_every_action(tmp_path, dirs):
    _runner, first = deploy(tmp_path, dirs, "new", [OK], probe=lambda _p: "hello there")
    steps = first["steps"]
    changed = {name: step["changed"] for name, step in steps.items()}
    assert changed == {"retire": False, "firewall": False, "engine": False, "unit": True, "probe": False, "record": True}
    assert steps["probe"]["completion"] == "hello there"
    # A start was issued: the boot ledger carries what the restart cost (no drain: nothing was serving).
    assert steps["unit"]["restarted"] and first["boot_ledger"]["restart"]["drain"] is None
    assert first["boot_ledger"]["restart"]["start_to_healthy_s"] >= 0
    assert [action.split()[0] for action in first["actions"]] == ["write", f"{SYSTEMCTL}", f"{SYSTEMCTL}", "write", "write"]
    assert first["actions"][-1].startswith(f"write {tmp_path}/record/{RECORD_FILE}")
    runner = FakeRunner({(SYSTEMCTL, "show"): [show(LoadState="loaded", ActiveState="active", UnitFileState="enabled")]})
    again = deploy_endpoint({"unit": unit_params(dirs, description="new"), "record_dir": str(tmp_path / "record")}, Host(runner, check_mode=True), diff=True)
    assert not again["changed"] and again["actions"] == []


# --- known-good generations --------------------------------------------------------------------


def test_generations_keep_the_last_k_records_and_restore_any_of_them(tmp_path, dirs):
    record_dir = tmp_path / "record"
    for description in ("one", "two", "three", "four"):
        runner = FakeRunner({(SYSTEMCTL, "show"): [DEAD]})
        params = {"unit": unit_params(dirs, description=description), "record_dir": str(record_dir), "keep_generations": 3}
        result = deploy_endpoint(params, Host(runner), diff=False)
    # Three kept: the last-known-good (four) and the two before it; "one" is gone.
    assert [(g["generation"]) for g in result["generations"]] == [0, 1, 2]
    kept = [json.loads(p.read_text())["unit"]["description"] for p in sorted((record_dir / "generations").iterdir(), reverse=True)]
    assert kept == ["three", "two"]
    # A no-op redeploy keeps the generations as they are.
    deploy_endpoint({**params, "unit": unit_params(dirs, description="four")}, Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False)
    assert len(list((record_dir / "generations").iterdir())) == 2

    # Restore generation 2 ("two"): it serves and becomes the last-known-good; "four" becomes generation 1.
    restore = {"unit": {"name": UNIT, **dirs}, "record_dir": str(record_dir), "restore": True, "generation": 2, "keep_generations": 3}
    restored = deploy_endpoint(restore, Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False)
    assert restored["restored"] and installed_description(dirs) == "Description=two\n"
    assert json.loads((record_dir / RECORD_FILE).read_text())["unit"]["description"] == "two"
    kept = [json.loads(p.read_text())["unit"]["description"] for p in sorted((record_dir / "generations").iterdir(), reverse=True)]
    assert kept == ["four", "three"]

    with pytest.raises(StepError, match="generation: 5 is not kept; .* holds generations 0 \\(last-known-good\\) to 2"):
        deploy_endpoint({**restore, "generation": 5}, Host(FakeRunner()), diff=False)


# --- the payload a known-good shape ran --------------------------------------------------------


def _payload(tmp_path, content: bytes):
    payload = tmp_path / "payload"
    payload.mkdir(exist_ok=True)
    (payload / "model.gguf").write_bytes(content)
    manifest = tmp_path / "manifest.json"
    entry = {"path": "model.gguf", "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    manifest.write_text(json.dumps({"repo_id": "lab/tiny", "revision": "a" * 40, "files": [entry]}))
    return {"dir": str(payload), "manifest": str(manifest)}


def test_a_rollback_refuses_a_payload_that_moved_on_and_restores_one_that_did_not(tmp_path, dirs):
    old = _payload(tmp_path, b"old weights")
    first = {"unit": unit_params(dirs, description="old"), "record_dir": str(tmp_path / "record"), "payload": old}
    deploy_endpoint(first, Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False)
    record = json.loads((tmp_path / "record" / RECORD_FILE).read_text())
    assert record["payload"]["manifest_sha256"] == hashlib.sha256((tmp_path / "manifest.json").read_bytes()).hexdigest()

    # Same payload: the restore brings the old shape back.
    restore = {"unit": {"name": UNIT, **dirs}, "record_dir": str(tmp_path / "record"), "restore": True}
    assert deploy_endpoint(restore, Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False)["restored"]

    # A new revision fetched into the same directory: the old shape must not boot on it.
    new = _payload(tmp_path, b"new weights, longer")
    with pytest.raises(StepError, match=r"payload: the known-good shape ran .* which now reads sha256 .*Put that payload back"):
        deploy_endpoint(restore, Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False)
    # And a failed deploy of a new shape does not bring the old one up on the new weights either.
    runner = FakeRunner({(SYSTEMCTL, "show"): [DEAD], (SYSTEMCTL, "start"): [(1, "", "start refused")]})
    with pytest.raises(StepError, match="restoring the last-known-good shape failed too .*payload: the known-good shape ran") as failure:
        deploy_endpoint({**first, "unit": unit_params(dirs, description="new"), "payload": new}, Host(runner), diff=False)
    assert failure.value.result["rolled_back"] is False
    assert len(runner.ran(SYSTEMCTL, "start")) == 1  # the old shape was never started on the new weights


def test_a_restore_refuses_a_payload_file_that_is_gone(tmp_path, dirs):
    payload = _payload(tmp_path, b"weights")
    first = {"unit": unit_params(dirs), "record_dir": str(tmp_path / "record"), "payload": payload}
    deploy_endpoint(first, Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False)
    (tmp_path / "payload" / "model.gguf").unlink()
    restore = {"unit": {"name": UNIT, **dirs}, "record_dir": str(tmp_path / "record"), "restore": True}
    with pytest.raises(StepError, match=r"payload: the known-good shape's payload in .* is not whole: model.gguf \(missing\)"):
        deploy_endpoint(restore, Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False)


# --- payload generations: a rollback boots the payload its record names ---------------------------


def _generation_deploy(tmp_path, dirs, description, generation, start_answers=(OK,), probe=None, state=DEAD, keep=2):
    runner = FakeRunner({(SYSTEMCTL, "show"): [state], (SYSTEMCTL, "start"): list(start_answers)})
    payload = {"dir": str(tmp_path / "models" / "tiny"), "manifest": generation["manifest"], "generations": keep}
    params = {"unit": unit_params(dirs, description=description), "record_dir": str(tmp_path / "record"), "payload": payload}
    return runner, deploy_endpoint(params, Host(runner), diff=False, probe=probe or (lambda _p: "hello"))


def test_a_failed_deploy_of_a_new_payload_rolls_back_to_the_old_payloads_bytes(tmp_path, dirs):
    # The gap: with one payload directory, a rollback after a payload change booted the new weights.
    served = tmp_path / "models" / "tiny" / "model.gguf"
    a = ready(tmp_path / "models" / "tiny", "a", {"model.gguf": b"payload A"})
    _runner, first = _generation_deploy(tmp_path, dirs, "shape on A", a)
    assert first["steps"]["payload"]["generation"] == a["generation"] and served.read_bytes() == b"payload A"
    record = json.loads((tmp_path / "record" / RECORD_FILE).read_text())
    assert record["payload"]["generation"] == record["payload"]["manifest_sha256"] == a["generation"]

    b = ready(tmp_path / "models" / "tiny", "b", {"model.gguf": b"payload B, bigger"})
    runner, green = _generation_deploy(tmp_path, dirs, "shape on B", b)
    # The payload moved: the unit restarts, A stays on disk.
    assert green["steps"]["payload"]["previous"] == a["generation"] and green["steps"]["unit"]["restarted"]
    assert served.read_bytes() == b"payload B, bigger" and Path(a["dir"], "model.gguf").read_bytes() == b"payload A"
    listed = [g["payload"] for g in green["generations"]]
    assert listed == [{"generation": b["generation"], "on_disk": "kept"}, {"generation": a["generation"], "on_disk": "kept"}]
    assert green["steps"]["payload_retention"]["kept"] == [b["generation"], a["generation"]] and green["steps"]["payload_retention"]["staged"] == []

    c = ready(tmp_path / "models" / "tiny", "c", {"model.gguf": b"payload C that crashes"})
    running = show(LoadState="loaded", ActiveState="active", UnitFileState="enabled")
    runner = _generation_deploy(tmp_path, dirs, "shape on B", b, state=running)[0]  # no-op: nothing moves, no restart
    assert runner.ran(SYSTEMCTL, "start") == [] and runner.ran(SYSTEMCTL, "stop") == []
    with pytest.raises(StepError, match="The last-known-good shape is serving again") as failure:
        _generation_deploy(tmp_path, dirs, "shape on C", c, start_answers=[FAIL, OK])
    assert failure.value.result["rolled_back"] is True
    assert served.read_bytes() == b"payload B, bigger" and installed_description(dirs) == "Description=shape on B\n"

    # rollback.yml -e generation=1: the shape on A comes back on A's bytes.
    restore = {"unit": {"name": UNIT, **dirs}, "record_dir": str(tmp_path / "record"), "restore": True, "generation": 1}
    restored = deploy_endpoint(restore, Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False)
    assert restored["steps"]["payload"]["generation"] == a["generation"]
    assert served.read_bytes() == b"payload A" and installed_description(dirs) == "Description=shape on A\n"


def test_a_restore_of_a_purged_payload_generation_is_refused_before_any_start(tmp_path, dirs):
    payload = tmp_path / "models" / "tiny"
    a = ready(payload, "a", {"model.gguf": b"payload A"})
    _generation_deploy(tmp_path, dirs, "shape on A", a)
    b = ready(payload, "b", {"model.gguf": b"payload B"})
    # K=1 in the same call: A is staged after the green deploy of B, then purged with approval.
    _runner, green = _generation_deploy(tmp_path, dirs, "shape on B", b, keep=1)
    assert [s["name"] for s in green["steps"]["payload_retention"]["staged"]] == [a["generation"]]
    assert "1 staged entries" in green["steps"]["payload_retention"]["msg"] and "await purge_approved" in green["steps"]["payload_retention"]["msg"]
    retain(str(payload), keep=1, keep_rejected=2, approved=True, host=Host(FakeRunner()))
    runner = FakeRunner({(SYSTEMCTL, "show"): [DEAD]})
    restore = {"unit": {"name": UNIT, **dirs}, "record_dir": str(tmp_path / "record"), "restore": True, "generation": 1}
    with pytest.raises(StepError, match=rf"generation {a['generation']} is not in .*: it was purged"):
        deploy_endpoint(restore, Host(runner), diff=False)
    assert runner.ran(SYSTEMCTL, "start") == [] and (payload / "model.gguf").read_bytes() == b"payload B"


def test_a_payload_only_change_restarts_the_unit(tmp_path, dirs):
    # The unit file names the same path before and after: only the restart makes the engine read B.
    running = show(LoadState="loaded", ActiveState="active", UnitFileState="enabled")
    a = ready(tmp_path / "models" / "tiny", "a", {"model.gguf": b"payload A"})
    _generation_deploy(tmp_path, dirs, "same shape", a)
    b = ready(tmp_path / "models" / "tiny", "b", {"model.gguf": b"payload B"})
    runner, result = _generation_deploy(tmp_path, dirs, "same shape", b, state=running)
    assert result["steps"]["payload"]["changed"] and result["steps"]["unit"]["restarted"]
    assert len(runner.ran(SYSTEMCTL, "stop")) == 1 and len(runner.ran(SYSTEMCTL, "start")) == 1


def test_a_record_from_before_generations_rolls_back_to_the_directory_adopted_for_its_manifest(tmp_path, dirs):
    # Migration: the manifest copied unchanged beside the directory, generations turned on. The old
    # record names the manifest's sha256, which is the adopted generation's name.
    payload = tmp_path / "models" / "tiny"
    payload.mkdir(parents=True)
    (payload / "model.gguf").write_bytes(b"payload A")
    inside = write_manifest(payload / "manifest.json", {"model.gguf": b"payload A"})
    legacy = {"unit": unit_params(dirs, description="shape on A"), "record_dir": str(tmp_path / "record"), "payload": {"dir": str(payload), "manifest": inside}}
    deploy_endpoint(legacy, Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False)
    beside = tmp_path / "models" / "a.manifest.json"
    beside.write_text(Path(inside).read_text())
    adopted = prepare(str(payload), str(beside), Host(FakeRunner()))
    c = ready(payload, "c", {"model.gguf": b"payload C that crashes"})
    with pytest.raises(StepError, match="The last-known-good shape is serving again"):
        _generation_deploy(tmp_path, dirs, "shape on C", c, start_answers=[FAIL, OK])
    assert os.readlink(payload).endswith(adopted["generation"]) and (payload / "model.gguf").read_bytes() == b"payload A"


def test_check_mode_with_diff_shows_the_payload_switch_and_the_staging_and_touches_nothing(tmp_path, dirs):
    payload = tmp_path / "models" / "tiny"
    a = ready(payload, "a", {"model.gguf": b"payload A"})
    _generation_deploy(tmp_path, dirs, "shape", a)
    b = ready(payload, "b", {"model.gguf": b"payload B"})
    before = snapshot(tmp_path)
    params = {
        "unit": unit_params(dirs, description="shape"),
        "record_dir": str(tmp_path / "record"),
        "payload": {"dir": str(payload), "manifest": b["manifest"], "generations": 1},
    }
    runner = FakeRunner({(SYSTEMCTL, "show"): [show(LoadState="loaded", ActiveState="active", UnitFileState="enabled")]})
    result = deploy_endpoint(params, Host(runner, check_mode=True), diff=True)
    assert snapshot(tmp_path) == before and runner.ran(SYSTEMCTL, "stop") == [] and runner.ran(SYSTEMCTL, "start") == []
    link_diff = next(d for d in result["diff"] if d.get("after_header") == str(payload))
    assert link_diff["before"] == f"{payload} -> {a['generation']}\n" and link_diff["after"] == f"{payload} -> {b['generation']}\n"
    # As the real run would: B serves, so A is the one staged past K=1 (check mode moved no link).
    staging = next(d for d in result["diff"] if d.get("after_header") == "payload retention")
    staged = f"{payload}.generations/.purge-staged"
    assert staging["after"] == f"mkdir {staged}\nmove {payload}.generations/{a['generation']} {staged}/{a['generation']}\n"
    assert result["steps"]["payload_retention"]["kept"] == [b["generation"]]


# --- a container is healthy only under a live conmon that is its engine's parent ---------------

CONMON_PID, ENGINE_PID = 5305, 5307


def container_wait(tmp_path, conmon_alive):
    """The unit runs podman; its engine listens on the port, a child of conmon (or an orphan)."""
    proc = tmp_path / "proc"
    fake_process(proc, ENGINE_PID, CGROUP, "/usr/bin/llama-server --port 7771", started_s=200, ppid=CONMON_PID if conmon_alive else 1)
    if conmon_alive:
        fake_process(proc, CONMON_PID, CGROUP, "/usr/bin/conmon --api-version 1 -n lab", started_s=199)
    script = {
        (SYSTEMCTL, "show"): [ACTIVE],
        ("/usr/bin/ss",): [ss_listening(PORT, ENGINE_PID)],
        ("/usr/bin/podman", "inspect"): [(0, f"{ENGINE_PID} {CONMON_PID} running\n", "")],
    }
    clock = FakeClock()
    manager = UnitManager(Host(FakeRunner(script)), proc=str(proc))
    health = HealthSpec(port=PORT, served_id="lab", timeout=10, container="lab")
    return lambda: wait_healthy(manager, UNIT, health, started_at=100.0, restarts_before=0, clock=clock, sleep=clock.sleep, get=engine_answers())


def test_a_container_whose_conmon_died_is_never_green(tmp_path):
    # SIGKILL of conmon: the engine serves on, re-parented, for ~20 s, then dies.
    with pytest.raises(GateError, match=r"not healthy after 10 s: the engine container lab's conmon \(PID 5305\) is gone"):
        container_wait(tmp_path, conmon_alive=False)()


def test_a_container_under_its_live_conmon_is_green(tmp_path):
    assert container_wait(tmp_path, conmon_alive=True)().healthy


def test_the_health_report_says_when_the_gate_first_looked_and_when_it_went_green(tmp_path):
    # A fault test lines the gate's looks up against the fault it caused (the dead-conmon window):
    # the wall-clock time of the first look, why it was not green, and the time it went green.
    proc = tmp_path / "proc"
    fake_process(proc, ENGINE_PID, CGROUP, "/usr/bin/llama-server --port 7771", started_s=200, ppid=CONMON_PID)
    fake_process(proc, CONMON_PID, CGROUP, "/usr/bin/conmon --api-version 1 -n lab", started_s=199)
    script = {
        (SYSTEMCTL, "show"): [ACTIVE],
        ("/usr/bin/ss",): [(0, "", ""), (0, "", ""), ss_listening(PORT, ENGINE_PID)],
        ("/usr/bin/podman", "inspect"): [(0, f"{ENGINE_PID} {CONMON_PID} running\n", "")],
    }
    clock = FakeClock()
    walls = iter([1000.25, 1001.5])
    manager = UnitManager(Host(FakeRunner(script)), proc=str(proc))
    health = HealthSpec(port=PORT, served_id="lab", timeout=10, container="lab")
    report = wait_healthy(manager, UNIT, health, 100.0, 0, clock=clock, sleep=clock.sleep, get=engine_answers(), wall=lambda: next(walls)).as_dict()
    assert (report["first_check_at"], report["healthy_at"], report["checks"]) == (1000.25, 1001.5, 3)
    assert report["first_reason"] == f"nothing listens on port {PORT} yet"


def test_a_deploy_inside_the_dead_conmon_window_waits_for_the_units_own_restart(tmp_path):
    # conmon SIGKILLed: the orphaned engine serves on (never green), dies, `podman run` exits and
    # systemd starts the unit again (NRestarts 0 -> 1). That one restart is the unit's own recovery,
    # not a crash loop: the gate waits for it and goes green on the new engine, never the orphan.
    proc = tmp_path / "proc"
    fake_process(proc, ENGINE_PID, CGROUP, "/usr/bin/llama-server --port 7771", started_s=200, ppid=1)  # the orphan
    fake_process(proc, 6307, CGROUP, "/usr/bin/llama-server --port 7771", started_s=300, ppid=6305)
    fake_process(proc, 6305, CGROUP, "/usr/bin/conmon --api-version 1 -n lab", started_s=299)
    restarted = show(ActiveState="active", SubState="running", MainPID=6300, NRestarts=1, ControlGroup=CGROUP)
    script = {
        (SYSTEMCTL, "show"): [ACTIVE, ACTIVE, restarted],
        ("/usr/bin/ss",): [ss_listening(PORT, ENGINE_PID), ss_listening(PORT, ENGINE_PID), ss_listening(PORT, 6307)],
        ("/usr/bin/podman", "inspect"): [(0, f"{ENGINE_PID} {CONMON_PID} running\n", "")] * 4 + [(0, "6307 6305 running\n", "")],
    }
    clock = FakeClock()
    manager = UnitManager(Host(FakeRunner(script)), proc=str(proc))
    health = HealthSpec(port=PORT, served_id="lab", timeout=30, container="lab", allowed_restarts=0)
    report = wait_healthy(manager, UNIT, health, started_at=100.0, restarts_before=0, clock=clock, sleep=clock.sleep, get=engine_answers())
    assert report.healthy and report.listener_pid == 6307 and report.n_restarts == 1 and report.conmon_died
    assert "conmon (PID 5305) is gone" in report.first_reason
