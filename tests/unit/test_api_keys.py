"""An endpoint's API key end to end on a fake host: the engine gets it by environment only, the
health gate and the probes authenticate with it, it never reaches argv, the unit file, the record,
the result or the actions; a key-only change restarts and rolls back to the previous key; a
dropped secret leaves no env file behind; a damaged record is kept aside."""

import json
import sys

import pytest
from fake_host import SYSTEMCTL, FakeClock, FakeRunner, fake_process, show, ss_listening

from ansible_collections.frank.llm_fleet.plugins.module_utils.host import endpoint_deploy as deploy_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_secrets import engine_secrets
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.health import wait_healthy
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.records import RECORD_FILE
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import GateError, HealthSpec, UnitManager
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

UNIT = "keyed.service"
CGROUP = f"/system.slice/{UNIT}"
PORT = 7775
KEY_A = "sk-lab-first-key-0123456789"
KEY_B = "sk-lab-rotated-key-9876543210"
OK, FAIL = (0, "", ""), (1, "", "start refused")
DEAD = show(LoadState="loaded", ActiveState="inactive", UnitFileState="enabled", NRestarts=0)


@pytest.fixture
def dirs(tmp_path):
    return {"unit_dir": str(tmp_path / "units"), "env_dir": str(tmp_path / "env")}


def params(tmp_path, dirs, api_key="", runtime="llamacpp", **extra):
    unit = {"name": UNIT, "command": [sys.executable, "-m", "http.server"], **dirs, **extra.pop("unit", {})}
    given = {
        "unit": unit,
        "record_dir": str(tmp_path / "record"),
        "shape": {"runtime": runtime, "port": PORT},
        "api_key": api_key,
        "probe": {"port": PORT, "served_id": "keyed"},
        "rollback": True,
    }
    given.update(extra)
    return given


def everything_written(tmp_path):
    """Every file under the test's directories but the env files (the engine must read the key
    from one of them): units, records, ledgers."""
    return "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file() and p.parent.name != "env")


def test_the_key_reaches_the_engine_by_environment_and_the_probe_by_header_only(tmp_path, dirs):
    probed = []
    runner = FakeRunner({(SYSTEMCTL, "show"): [DEAD]})
    result = deploy_endpoint(params(tmp_path, dirs, KEY_A), Host(runner), diff=True, probe=lambda p: probed.append(p) or "hi")
    env = (tmp_path / "env" / "keyed.env").read_text()
    assert 'LLAMA_API_KEY="sk-lab-first-key-0123456789"' in env
    assert oct((tmp_path / "env" / "keyed.env").stat().st_mode & 0o777) == "0o600"
    assert probed[0]["api_key"] == KEY_A
    # Never in argv, the unit file, the record, the result or the actions.
    assert KEY_A not in json.dumps(runner.calls)
    assert KEY_A not in everything_written(tmp_path)
    assert KEY_A not in json.dumps(result, default=str)


def test_vllm_reads_its_own_variable(tmp_path, dirs):
    deploy_endpoint(params(tmp_path, dirs, KEY_A, runtime="vllm"), Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False, probe=lambda _p: "hi")
    assert 'VLLM_API_KEY="sk-lab-first-key-0123456789"' in (tmp_path / "env" / "keyed.env").read_text()


def test_a_credential_in_the_plain_environment_is_refused_naming_it(tmp_path, dirs):
    given = params(tmp_path, dirs, unit={"environment": {"LLAMA_API_KEY": KEY_A, "OMP_NUM_THREADS": "2"}})
    with pytest.raises(StepError, match=r"unit.environment: LLAMA_API_KEY look like credentials.*endpoint_api_key") as refused:
        deploy_endpoint(given, Host(FakeRunner()), diff=False)
    assert KEY_A not in str(refused.value)


def test_a_key_only_change_restarts_and_a_failing_one_rolls_back_to_the_previous_key(tmp_path, dirs):
    deploy_endpoint(params(tmp_path, dirs, KEY_A), Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False, probe=lambda _p: "hi")
    record = (tmp_path / "record" / RECORD_FILE).read_text()
    # Rotation whose start fails: the record is the same, the secrets are not, so it rolls back.
    runner = FakeRunner({(SYSTEMCTL, "show"): [DEAD], (SYSTEMCTL, "start"): [FAIL, OK]})
    with pytest.raises(StepError, match="serving again") as failure:
        deploy_endpoint(params(tmp_path, dirs, KEY_B), Host(runner), diff=False, probe=lambda _p: "hi")
    assert failure.value.result["rolled_back"] is True
    assert len(runner.ran(SYSTEMCTL, "start")) == 2
    assert KEY_A in (tmp_path / "env" / "keyed.env").read_text()
    assert (tmp_path / "record" / RECORD_FILE).read_text() == record
    # A rotation that comes up green is a change: restarted, and kept as the new last-known-good key.
    runner = FakeRunner({(SYSTEMCTL, "show"): [show(LoadState="loaded", ActiveState="active", UnitFileState="enabled")]})
    result = deploy_endpoint(params(tmp_path, dirs, KEY_B), Host(runner), diff=False, probe=lambda _p: "hi")
    assert result["changed"] and result["steps"]["record"]["secrets_changed"]
    assert runner.ran(SYSTEMCTL, "start")
    assert KEY_B in (tmp_path / "env" / "keyed.last-good-secrets.json").read_text()


def test_a_key_only_change_of_a_container_restarts_its_unit(tmp_path, dirs, monkeypatch):
    seen = []

    def ensure_engine(engine, _host, _diff):
        seen.append(engine["secret_environment"])
        return {"changed": True, "env_changed": True, "run_argv": ["/usr/bin/podman", "run", "x"], "stop_argv": ["/usr/bin/podman", "stop", "x"]}

    monkeypatch.setattr(deploy_module, "ensure_engine", ensure_engine)
    runner = FakeRunner({(SYSTEMCTL, "show"): [show(LoadState="loaded", ActiveState="active", UnitFileState="enabled")]})
    unit = {"name": UNIT, "command": [], **dirs}
    given = {"engine": {"name": "keyed"}, "unit": unit, "record_dir": str(tmp_path / "record"), "shape": {"runtime": "llamacpp"}, "api_key": KEY_B}
    deploy_endpoint(given, Host(runner), diff=False)
    assert seen == [{"LLAMA_API_KEY": KEY_B}]
    assert runner.ran(SYSTEMCTL, "start"), "the env file changed, so the running unit restarts"


def test_dropping_the_secrets_removes_the_env_file(tmp_path, dirs):
    deploy_endpoint(params(tmp_path, dirs, KEY_A), Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False, probe=lambda _p: "hi")
    assert (tmp_path / "env" / "keyed.env").exists()
    runner = FakeRunner({(SYSTEMCTL, "show"): [show(LoadState="loaded", ActiveState="active", UnitFileState="enabled")]})
    result = deploy_endpoint(params(tmp_path, dirs), Host(runner), diff=False, probe=lambda _p: "hi")
    assert not (tmp_path / "env" / "keyed.env").exists()
    assert not (tmp_path / "env" / "keyed.last-good-secrets.json").exists()
    assert result["steps"]["unit"]["env_changed"] and runner.ran(SYSTEMCTL, "start")


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", "x" * ((1 << 20) + 10)])
def test_a_damaged_record_is_kept_aside_and_the_deploy_runs_as_a_first_deploy(tmp_path, dirs, damage):
    (tmp_path / "record").mkdir()
    (tmp_path / "record" / RECORD_FILE).write_text(damage)
    result = deploy_endpoint(params(tmp_path, dirs), Host(FakeRunner({(SYSTEMCTL, "show"): [DEAD]})), diff=False, probe=lambda _p: "hi")
    kept = [p for p in (tmp_path / "record").iterdir() if p.name.startswith(f"{RECORD_FILE}.corrupt-")]
    assert len(kept) == 1 and kept[0].read_text() == damage
    assert json.loads((tmp_path / "record" / RECORD_FILE).read_text())["unit"]["name"] == UNIT
    assert any("kept aside" in warning for warning in result["warnings"])


# --- the health gate with a key ----------------------------------------------------------------

ACTIVE = show(ActiveState="active", SubState="running", MainPID=4242, NRestarts=0, ControlGroup=CGROUP)


def gate(tmp_path, api_key, answers):
    fake_process(tmp_path / "proc", 4242, CGROUP, "llama-server --port 7775", started_s=200)
    manager = UnitManager(Host(FakeRunner({(SYSTEMCTL, "show"): [ACTIVE], ("/usr/bin/ss",): [ss_listening(PORT, 4242)]})), proc=str(tmp_path / "proc"))
    clock = FakeClock()
    health = HealthSpec(port=PORT, served_id="keyed", timeout=30, api_key=api_key)
    assert api_key not in repr(health) or not api_key
    # Every path outside /v1 refuses an unkeyed request, as a guarded engine does.
    return lambda: wait_healthy(manager, UNIT, health, started_at=100.0, restarts_before=0, clock=clock, sleep=clock.sleep, get=answers, post=lambda *_: 401)


def engine_with_key(key):
    def get(_host, _port, path, api_key=""):
        if api_key != key:
            return 401, b'{"error": {"message": "Invalid API Key"}}'
        return (200, b"") if path == "/health" else (200, json.dumps({"data": [{"id": "keyed"}]}).encode())

    return get


def test_the_health_gate_sends_the_key(tmp_path):
    assert gate(tmp_path, KEY_A, engine_with_key(KEY_A))().healthy


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("", "wants an API key the health gate was not given.*endpoint_api_key"),
        (KEY_B, "refused the endpoint's API key.*another key"),
    ],
)
def test_a_refused_key_fails_at_once_saying_which_case(tmp_path, given, message):
    with pytest.raises(GateError, match=message) as failure:
        gate(tmp_path, given, engine_with_key(KEY_A))()
    assert KEY_B not in str(failure.value) and KEY_A not in str(failure.value)


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "LLAMA_API_KEY", "DB_PASSWORD", "MYSECRET", "ACCESSTOKEN", "hf_token"])
def test_credential_names_are_refused_in_the_plain_environment(name):
    with pytest.raises(StepError, match=f"engine.environment: {name} look like credentials"):
        engine_secrets({"engine": {"environment": {name: "x"}}, "shape": {"runtime": "llamacpp"}})


@pytest.mark.parametrize("name", ["HALOGEN_TOKENIZER", "MAX_TOKENS", "HALOGEN_KV_POOL_POSITIONS"])
def test_plain_names_holding_token_pass(name):
    # halogen's tokenizer directory variable was refused as a credential until a lab deploy of the
    # stand-in flash-server met it (every production halogen deploy would have been refused).
    assert engine_secrets({"engine": {"environment": {name: "/models/tokenizer"}}, "shape": {"runtime": "halogen"}}) == {}
