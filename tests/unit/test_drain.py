"""Deploys that do not cut clients, on a fake host: the drain before a restart (in-flight requests
read from each engine's own /metrics gauges), a documentation-only unit edit that reloads without
a restart, and a foreign drop-in refused by name."""

import sys

import pytest
from fake_host import SYSTEMCTL, FakeClock, FakeRunner, fake_process, show, ss_listening

from ansible_collections.frank.llm_fleet.plugins.module_utils.host import unit_step as deploy_steps
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.drain import DrainReport, drain, in_flight
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import UnitManager
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_step import ensure_unit
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

UNIT = "lab.service"
PORT = 7771

# Captured forms of the gauges (llama-server b11669 with --metrics; vLLM's Prometheus exposition).
LLAMACPP_METRICS = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {processing}
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred {deferred}
llamacpp:n_decode_total 12
"""
VLLM_METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="frank-primary"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="frank-primary"}} {waiting}
vllm:num_preemptions_total{{engine="0",model_name="frank-primary"}} 3.0
"""


def test_in_flight_sums_each_engines_running_and_waiting_gauges():
    assert in_flight(LLAMACPP_METRICS.format(processing=2, deferred=1)) == 3
    assert in_flight(VLLM_METRICS.format(running="1.0", waiting="4.0")) == 5
    assert in_flight("# no gauges here\nprocess_cpu_seconds_total 4\n") is None


def engine(sequence, status=200):
    """A /metrics GET answering the in-flight counts in order (the last repeating)."""
    calls = []

    def get(_host, _port, path, api_key=""):
        calls.append((path, api_key))
        value = sequence[min(len(calls) - 1, len(sequence) - 1)]
        return status, LLAMACPP_METRICS.format(processing=value, deferred=0).encode()

    return get, calls


@pytest.mark.parametrize(
    ("sequence", "timeout", "outcome", "cut", "status"),
    [
        ([0], 60, "idle", 0, 200),
        ([2, 2, 1, 0], 60, "drained", 0, 200),
        ([3, 3, 3, 3, 3, 3], 2, "forced", 3, 200),
        ([1], 60, "unknown", 0, 404),
    ],
)
def test_the_drain_waits_for_in_flight_requests_bounded_by_its_timeout(sequence, timeout, outcome, cut, status):
    clock = FakeClock()
    get, calls = engine(sequence, status)
    report = drain(get, "127.0.0.1", PORT, "sk-key", timeout, interval=1.0, clock=clock, sleep=clock.sleep)
    assert (report.outcome, report.cut) == (outcome, cut)
    assert all(call == ("/metrics", "sk-key") for call in calls)  # authenticated: llama-server guards /metrics with its key
    if outcome == "forced":
        assert report.waited_s >= timeout


@pytest.fixture
def dirs(tmp_path):
    return {"unit_dir": str(tmp_path / "units"), "env_dir": str(tmp_path / "env")}


def unit_params(dirs, **overrides):
    return {"name": UNIT, "command": [sys.executable, "-m", "http.server"], **dirs, **overrides}


RUNNING = show(LoadState="loaded", ActiveState="active", UnitFileState="enabled", NRestarts=0)


def test_a_restart_of_a_serving_unit_drains_first_and_reports_it(dirs, monkeypatch):
    ensure_unit(unit_params(dirs), Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})), diff=False)
    monkeypatch.setattr(deploy_steps.UnitManager, "port_owned", lambda *_a: True)
    drained = []
    report = DrainReport("drained", in_flight_at_start=2)
    monkeypatch.setattr(deploy_steps, "drain", lambda *args, **_kw: drained.append(args) or report)
    runner = FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})
    health = {"port": PORT, "drain_timeout": 30, "timeout": 1}
    monkeypatch.setattr(deploy_steps, "wait_healthy", lambda *a, **k: type("H", (), {"as_dict": lambda self: {"healthy": True}})())
    result = ensure_unit(unit_params(dirs, restart=True, health=health), Host(runner), diff=False)
    assert result["drain"] == {"outcome": "drained", "in_flight_at_start": 2, "cut": 0, "waited_s": 0.0}
    assert drained and drained[0][2] == PORT and drained[0][4] == 30.0
    # The drain ran before the stop.
    assert runner.calls.index([SYSTEMCTL, "stop", UNIT]) > 0


def test_check_mode_says_whether_a_restart_would_cut_requests_now(dirs, monkeypatch):
    ensure_unit(unit_params(dirs), Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})), diff=False)
    monkeypatch.setattr(deploy_steps.UnitManager, "port_owned", lambda *_a: True)
    monkeypatch.setattr(deploy_steps, "http_get", engine([2])[0])
    result = ensure_unit(unit_params(dirs, description="new", restart=True, health={"port": PORT}), Host(FakeRunner(), check_mode=True), diff=False)
    assert result["drain"] == {"outcome": "would_cut", "in_flight_now": 2}


def test_a_documentation_only_edit_reloads_without_restarting_the_engine(dirs, tmp_path):
    ensure_unit(unit_params(dirs, description="old words"), Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})), diff=False)
    runner = FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})
    result = ensure_unit(unit_params(dirs, description="new words"), Host(runner), diff=False)
    assert result["changed"] and result["cosmetic"]
    assert runner.ran(SYSTEMCTL, "daemon-reload") and not runner.ran(SYSTEMCTL, "stop") and not runner.ran(SYSTEMCTL, "start")
    assert "Description=new words" in (tmp_path / "units" / UNIT).read_text()
    # A change to what runs is not cosmetic: it restarts.
    runner = FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})
    result = ensure_unit(unit_params(dirs, description="new words", restart_sec=9), Host(runner), diff=False)
    assert "cosmetic" not in result and runner.ran(SYSTEMCTL, "start")


def test_a_foreign_dropin_is_refused_by_name_and_a_listed_one_is_kept(dirs, tmp_path):
    dropin_dir = tmp_path / "units" / f"{UNIT}.d"
    dropin_dir.mkdir(parents=True)
    (dropin_dir / "bench.conf").write_text("[Service]\nEnvironment=BENCH=1\n")
    refused = r"drop-ins change this unit behind the deploy: .*lab.service.d/bench.conf \(remove it, or list it in dropins\); remove them, or list"
    with pytest.raises(StepError, match=refused):
        ensure_unit(unit_params(dirs), Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]}), check_mode=True), diff=False)
    result = ensure_unit(unit_params(dirs, dropins=["bench.conf"]), Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})), diff=False)
    assert result["changed"]


# --- retiring an old runtime's units, and a runtime swap --------------------------------------


def test_a_retired_unit_is_stopped_disabled_archived_and_masked_then_left_alone(tmp_path, dirs):
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint

    units = tmp_path / "units"
    units.mkdir()
    (units / "vllm-primary.service").write_text("[Service]\nExecStart=/usr/bin/vllm serve\n")
    (units / "vllm-primary.service.d").mkdir()
    (units / "vllm-primary.service.d" / "bench.conf").write_text("[Service]\n")
    runner = FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})
    params = {"unit": unit_params(dirs), "record_dir": str(tmp_path / "state" / "lab"), "retire_units": ["vllm-primary.service"]}
    result = deploy_endpoint(params, Host(runner), diff=False)
    retired = result["steps"]["retire"]["units"][0]
    assert retired["state"] == "retired" and retired["archived_to"].startswith(str(tmp_path / "state" / "archive"))
    archived = tmp_path / "state" / "archive"
    assert [p.name for p in next(archived.iterdir()).iterdir()] == sorted(["vllm-primary.service", "vllm-primary.service.d"])
    verbs = [argv[1] for argv in runner.calls if argv[0] == SYSTEMCTL and argv[-1] == "vllm-primary.service"]
    assert verbs[-3:] == ["stop", "disable", "mask"] or verbs == ["stop", "disable", "mask"]
    # systemctl mask leaves a link to /dev/null: a rerun sees it masked and does nothing.
    (units / "vllm-primary.service").symlink_to("/dev/null")
    again = deploy_endpoint(params, Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})), diff=False)
    assert again["steps"]["retire"]["units"][0] == {"unit": "vllm-primary.service", "changed": False, "state": "masked"}


def test_a_runtime_swap_archives_the_old_unit_file_and_says_so(tmp_path, dirs):
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint

    record_dir = str(tmp_path / "state" / "lab")
    base = {"unit": unit_params(dirs), "record_dir": record_dir}
    deploy_endpoint({**base, "shape": {"runtime": "llamacpp", "launch": "native"}}, Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})), diff=False)
    old_unit = (tmp_path / "units" / UNIT).read_text()
    swapped = {**base, "unit": unit_params(dirs, description="now vllm"), "shape": {"runtime": "vllm", "launch": "podman"}}
    result = deploy_endpoint(swapped, Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})), diff=False)
    assert result["steps"]["retire"]["swap"] == "llamacpp/native -> vllm/podman"
    with open(result["steps"]["retire"]["archived_to"], encoding="utf-8") as handle:
        assert handle.read() == old_unit


@pytest.mark.parametrize("name", ["../etc/passwd", "vllm-primary", "a/b.service"])
def test_a_retired_unit_name_that_is_not_a_service_is_refused(tmp_path, dirs, name):
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint

    with pytest.raises(StepError, match="retire_units: .* is not a service unit name"):
        deploy_endpoint({"unit": unit_params(dirs), "record_dir": str(tmp_path / "s" / "lab"), "retire_units": [name]}, Host(FakeRunner()), diff=False)


# --- the listener is judged before any key leaves; the drain reads with the running engine's key ---

FOREIGN_PID = 4242


def foreign_listener(tmp_path):
    """A process outside the unit's cgroup and any container holds the port."""
    proc = tmp_path / "proc"
    fake_process(proc, FOREIGN_PID, "/user.slice/user-1000.slice/session-3.scope", "/usr/bin/python3 -m http.server 7771", 1.0)
    return proc


def key_catching_engine():
    calls = []

    def get(_host, _port, path, api_key=""):
        calls.append((path, api_key))
        return 200, LLAMACPP_METRICS.format(processing=0, deferred=0).encode()

    return get, calls


@pytest.mark.parametrize("check_mode", [False, True])
def test_no_key_is_sent_to_a_port_a_foreign_process_holds(dirs, tmp_path, monkeypatch, check_mode):
    ensure_unit(unit_params(dirs), Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})), diff=False)
    proc = foreign_listener(tmp_path)
    monkeypatch.setattr(deploy_steps, "UnitManager", lambda host: UnitManager(host, proc=str(proc)))
    get, calls = key_catching_engine()
    monkeypatch.setattr(deploy_steps, "http_get", get)
    runner = FakeRunner({(SYSTEMCTL, "show"): [RUNNING], ("/usr/bin/ss",): [ss_listening(PORT, FOREIGN_PID, "python3")]})
    health = {"port": PORT, "drain_timeout": 30, "timeout": 1, "api_key": "sk-the-endpoints-key"}
    with pytest.raises(StepError, match=r"port 7771 is held by PID 4242 .*not lab.service's; stop it or change the port \(no key was sent"):
        ensure_unit(unit_params(dirs, restart=True, health=health), Host(runner, check_mode=check_mode), diff=False)
    assert calls == []  # nothing, not even /metrics, went to the foreign listener
    assert not runner.ran(SYSTEMCTL, "stop")


def rotating_engine(running_key, counts):
    """An engine holding `running_key`: 401 to any other; in flight as `counts` says, read by read."""
    calls = []

    def get(_host, _port, path, api_key=""):
        calls.append((path, api_key))
        if api_key != running_key:
            return 401, b'{"error": "Invalid API Key"}'
        value = counts[min(len([c for c in calls if c[1] == running_key]) - 1, len(counts) - 1)]
        return 200, LLAMACPP_METRICS.format(processing=value, deferred=0).encode()

    return get, calls


def test_a_rotation_drains_with_the_key_the_running_engine_holds():
    clock = FakeClock()
    get, calls = rotating_engine("sk-old", [1, 1, 0])
    report = drain(get, "127.0.0.1", PORT, ("sk-old", "sk-new"), 60, clock=clock, sleep=clock.sleep)
    assert (report.outcome, report.in_flight_at_start, report.cut) == ("drained", 1, 0)
    assert {key for _path, key in calls} == {"sk-old"}


def test_a_drain_that_cannot_read_in_flight_work_waits_its_timeout_unless_forced():
    clock = FakeClock()
    get, _calls = rotating_engine("sk-someone-elses", [1])
    report = drain(get, "127.0.0.1", PORT, ("sk-new",), 30, clock=clock, sleep=clock.sleep)
    assert report.outcome == "unknown" and report.waited_s >= 30  # never a restart at once
    assert report.as_dict()["unread"] == "/metrics answered 401 to every key the deploy holds"
    clock = FakeClock()
    forced = drain(get, "127.0.0.1", PORT, ("sk-new",), 30, clock=clock, sleep=clock.sleep, force=True)
    assert forced.outcome == "unknown" and forced.waited_s == 0


def test_endpoint_deploy_drains_a_rotation_with_the_kept_previous_key(tmp_path, dirs, monkeypatch):
    from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint

    def params(key):
        health = {"port": PORT, "drain_timeout": 30, "timeout": 1}
        return {
            "unit": unit_params(dirs, health=health),
            "record_dir": str(tmp_path / "record"),
            "shape": {"runtime": "llamacpp", "port": PORT},
            "api_key": key,
        }

    monkeypatch.setattr(deploy_steps, "wait_healthy", lambda *a, **k: type("H", (), {"as_dict": lambda self: {"healthy": True}})())
    deploy_endpoint(params("sk-old"), Host(FakeRunner({(SYSTEMCTL, "show"): [show(LoadState="loaded", ActiveState="inactive")]})), diff=False)
    monkeypatch.setattr(deploy_steps.UnitManager, "port_owned", lambda *_a: True)
    get, calls = rotating_engine("sk-old", [1, 0])
    monkeypatch.setattr(deploy_steps, "http_get", get)
    result = deploy_endpoint(params("sk-new"), Host(FakeRunner({(SYSTEMCTL, "show"): [RUNNING]})), diff=False)
    assert result["steps"]["unit"]["drain"]["outcome"] == "drained"
    assert calls[0] == ("/metrics", "sk-old")
    assert "sk-old" not in str(result) and "sk-new" not in str(result)
