"""The no-op fast path's proof (noop_check.py) on a fake host (fake_host.py): after a real deploy
into temporary directories, a redeploy of the same arguments proves a no-op, and each thing the
full path would have to do - a new record, other gate inputs, a unit down, a payload changed on
disk, a foreign listener, a failing probe, a MainPID that moved - is named as the reason, with the
host left as it was."""

import hashlib
import json
import re
import sys

import pytest
from fake_host import SYSTEMCTL, FakeRunner, fake_process, show, ss_listening

from ansible_collections.frank.llm_fleet.plugins.module_utils.host import unit_step
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.health import HealthReport
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.noop_check import CHECKS, check_noop
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.records import RECORD_FILE
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import STAMP_FILE
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

UNIT = "lab.service"
CGROUP = f"/system.slice/{UNIT}"
PORT = 7771
PID = 4242
GATES = {"budget": {"devices": [{"name": "lab-cpu", "memory": "2 GiB"}], "report_only": False}, "payload": {"check_hash": True}}
DEAD = show(LoadState="loaded", ActiveState="inactive", UnitFileState="enabled", NRestarts=0)
RESTARTED = show(ActiveState="active", MainPID=5151, NRestarts=1)
SERVING = show(LoadState="loaded", ActiveState="active", SubState="running", UnitFileState="enabled", MainPID=PID, NRestarts=0, ControlGroup=CGROUP)


def engine(_host, _port, path, _api_key=""):
    return (200, b"") if path == "/health" else (200, json.dumps({"data": [{"id": "lab"}]}).encode())


@pytest.fixture
def deployed(tmp_path):
    """A green deploy of a unit with a payload, its gate inputs recorded; the params of a redeploy."""
    (tmp_path / "payload").mkdir()
    weights = b"tiny weights"
    (tmp_path / "payload" / "model.gguf").write_bytes(weights)
    entry = {"path": "model.gguf", "size": len(weights), "sha256": hashlib.sha256(weights).hexdigest()}
    (tmp_path / "manifest.json").write_text(json.dumps({"repo_id": "lab/tiny", "revision": "a" * 40, "files": [entry]}))
    params = {
        "unit": {
            "name": UNIT,
            # The interpreter stands in for the engine binary: endpoint_deploy checks it is executable.
            "command": [sys.executable, "-m", "http.server"],
            "unit_dir": str(tmp_path / "units"),
            "env_dir": str(tmp_path / "env"),
            "health": {"port": PORT, "served_id": "lab", "timeout": 5},
        },
        "record_dir": str(tmp_path / "record"),
        "payload": {"dir": str(tmp_path / "payload"), "manifest": str(tmp_path / "manifest.json"), "check_hash": True},
        "probe": {"port": PORT, "served_id": "lab"},
        "gates": GATES,
    }
    fake_process(tmp_path / "proc", PID, CGROUP, f"llama-server --port {PORT}", started_s=200)
    return tmp_path, params


def green_deploy(tmp_path, params):
    """A deploy that starts the unit and writes the record (its health gate is unit_step's, tested
    in test_host_steps.py: here it passes, as the engine started green)."""
    runner = FakeRunner({(SYSTEMCTL, "show"): [DEAD, SERVING]})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit_step, "wait_healthy", lambda *_args: HealthReport(True, main_pid=PID))
        result = deploy_endpoint(params, Host(runner), diff=False, probe=lambda _p: "hello")
    assert result["steps"]["record"]["changed"] or result["steps"]["unit"]["changed"]


def prove(tmp_path, params, show_answers=(SERVING,), listener=(PID, "llama-server"), probe=lambda _p: "hello there", check_mode=False):
    runner = FakeRunner({(SYSTEMCTL, "show"): list(show_answers), ("/usr/bin/ss",): [ss_listening(PORT, *listener)]})
    before = snapshot(tmp_path)
    verdict = check_noop(params, Host(runner, check_mode=check_mode), probe=probe, get=engine, proc=str(tmp_path / "proc"))
    # The proof changes nothing, whatever it finds: no systemctl verb but show, no file touched.
    assert snapshot(tmp_path) == before
    assert [argv[1] for argv in runner.ran(SYSTEMCTL)] == ["show"] * len(runner.ran(SYSTEMCTL))
    return verdict


def snapshot(root):
    """Every file but the payload gate's stamps, which a verification writes after it hashed a file
    (the gate's own cache: the full path's verify writes the same)."""
    return {
        str(path): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
        if path.is_file() and "proc" not in path.parts and path.name != STAMP_FILE
    }


def test_a_redeploy_of_what_serves_is_a_noop_in_every_check(deployed):
    tmp_path, params = deployed
    green_deploy(tmp_path, params)
    verdict = prove(tmp_path, params)
    assert verdict["noop"] is True and verdict["full_path_reason"] == ""
    assert [c["check"] for c in verdict["checks"]] == [name for name, _step in CHECKS]
    assert all(c["ok"] for c in verdict["checks"])
    assert verdict["main_pid"] == PID and verdict["health"]["listener_pid"] == PID and verdict["completion"] == "hello there"
    assert not verdict["changed"]


def _edit_unit(params):
    params["unit"] = {**params["unit"], "description": "a new description"}


def _edit_gates(params):
    params["gates"] = {**GATES, "budget": {**GATES["budget"], "devices": [{"name": "lab-cpu", "memory": "1 GiB"}]}}


def _rewrite_weights(params):
    path = f"{params['payload']['dir']}/model.gguf"
    with open(path, "r+b") as handle:  # same size, other bytes: only the sha256 tells
        handle.write(b"X")


def _failing_probe(_probe):
    raise StepError("smoke probe: the completion is empty (0 completion tokens)", {})


@pytest.mark.parametrize(
    ("case", "edit", "answers", "reason"),
    [
        ("a unit argument changed", _edit_unit, {}, r"^rendered: the full path would change unit, record \(the record's unit\)"),
        ("the budget's devices changed", _edit_gates, {}, r"^gates: the inputs of the gates budget differ"),
        ("the payload's bytes changed", _rewrite_weights, {}, r"^payload: .* does not pass the payload gate: model.gguf \(hash_mismatch\)"),
        ("the unit is down", None, {"show_answers": [DEAD]}, r"^running: lab.service is loaded, enabled, inactive"),
        ("a foreign process holds the port", None, {"listener": (999, "nc")}, r"^health: port 7771: .*foreign"),
        ("the probe fails", None, {"probe": _failing_probe}, r"^probe: the smoke probe failed: .*0 completion tokens"),
        (
            "the engine restarted during the check",
            None,
            {"show_answers": [SERVING, SERVING, show(ActiveState="active", MainPID=5151, NRestarts=1)]},
            r"^stable: .*MainPID 4242 -> 5151",
        ),
    ],
)
def test_each_check_names_why_the_full_path_runs(deployed, case, edit, answers, reason):
    tmp_path, params = deployed
    green_deploy(tmp_path, params)
    if case == "a foreign process holds the port":
        fake_process(tmp_path / "proc", 999, "/user.slice/other.scope", "nc -l 7771", started_s=100)
    if edit:
        edit(params)
    verdict = prove(tmp_path, params, **answers)
    assert verdict["noop"] is False, case
    assert verdict["full_path_reason"], case
    assert re.search(reason, verdict["full_path_reason"]), (case, verdict["full_path_reason"])
    assert verdict["checks"][-1]["ok"] is False and all(c["ok"] for c in verdict["checks"][:-1]), case


def test_no_record_and_a_record_without_gate_inputs_take_the_full_path(deployed):
    tmp_path, params = deployed
    assert prove(tmp_path, params)["full_path_reason"].startswith("record: no last-known-good record")
    green_deploy(tmp_path, {**params, "gates": {}})  # a deploy by a version that kept no gate inputs
    assert "gates: the record names no gate inputs" in prove(tmp_path, params)["full_path_reason"]
    green_deploy(tmp_path, params)  # the full path records them: the next redeploy is a no-op
    assert prove(tmp_path, params)["noop"] is True
    assert json.loads((tmp_path / "record" / RECORD_FILE).read_text())["gates"] == GATES


def test_check_mode_proves_without_a_probe(deployed):
    tmp_path, params = deployed
    green_deploy(tmp_path, params)
    verdict = prove(tmp_path, params, probe=_failing_probe, check_mode=True)
    assert verdict["noop"] is True
    assert next(c for c in verdict["checks"] if c["check"] == "probe")["detail"] == "check mode sends nothing"
