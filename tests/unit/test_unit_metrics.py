"""The machine's unit-metrics writer: frank.llm_fleet.unit_metrics's install step on a fake host
(one call per machine: files written only when they differ, the timer enabled once, the
per-endpoint template timers of earlier versions retired) and the writer itself on a temp dir."""

import os
import subprocess
from pathlib import Path

import pytest
from fake_host import SYSTEMCTL, FakeRunner, show

from ansible_collections.frank.llm_fleet.plugins.module_utils.host import unit_metrics_writer
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_metrics import current_probe, ensure_unit_metrics
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host

TIMER_SHOW = (SYSTEMCTL, "show", "llm-fleet-unit-metrics.timer")
RUNNING = {TIMER_SHOW: [show(UnitFileState="enabled", ActiveState="active")]}
ABSENT = {TIMER_SHOW: [show(UnitFileState="", ActiveState="inactive", LoadState="not-found")]}


@pytest.fixture
def params(tmp_path):
    return {
        "units": ["frank-secondary.service", "frank-large.service"],
        "textfile_dir": "/var/lib/prometheus/node-exporter",
        "unit_dir": str(tmp_path / "units"),
        "lib_dir": str(tmp_path / "lib"),
    }


def install(params, script, check_mode=False):
    runner = FakeRunner(script)
    result = ensure_unit_metrics(params, Host(runner, check_mode), diff=True)
    return result, runner


def test_a_fresh_machine_gets_writer_service_and_timer_in_one_call(params):
    result, runner = install(params, ABSENT)
    service = Path(params["unit_dir"], "llm-fleet-unit-metrics.service").read_text()
    writer = Path(params["lib_dir"], "llm_fleet_unit_metrics.py")
    exec_start = f"ExecStart=/usr/bin/python3 {writer} /var/lib/prometheus/node-exporter frank-large.service frank-secondary.service\n"
    assert exec_start in service
    assert "OnUnitActiveSec=30s" in Path(params["unit_dir"], "llm-fleet-unit-metrics.timer").read_text()
    # What the machine runs is the writer the tests below import.
    assert writer.read_text() == Path(unit_metrics_writer.__file__).read_text()
    assert os.stat(writer).st_mode & 0o777 == 0o755
    assert runner.ran(SYSTEMCTL, "daemon-reload")
    assert runner.ran(SYSTEMCTL, "enable", "--now", "llm-fleet-unit-metrics.timer")
    assert result["changed"] is True and len(result["files"]) == 3 and len(result["diff"]) == 3


def test_a_rerun_reads_and_asks_systemd_once_and_changes_nothing(params):
    install(params, ABSENT)
    result, runner = install(params, RUNNING)
    assert result["changed"] is False and result["actions"] == [] and result["files"] == []
    assert [argv[:3] for argv in runner.calls] == [list(TIMER_SHOW)]


def test_a_new_endpoint_rewrites_the_service_and_refreshes_at_once(params):
    install(params, ABSENT)
    result, runner = install({**params, "units": [*params["units"], "frank-extra.service"]}, RUNNING)
    assert result["files"] == [os.path.join(params["unit_dir"], "llm-fleet-unit-metrics.service")]
    assert "frank-extra.service" in result["diff"][0]["after"] and "frank-extra.service" not in result["diff"][0]["before"]
    assert runner.ran(SYSTEMCTL, "daemon-reload")
    assert runner.ran(SYSTEMCTL, "start", "--no-block", "llm-fleet-unit-metrics.service")
    assert not runner.ran(SYSTEMCTL, "enable")


def test_check_mode_on_a_fresh_machine_reports_and_writes_nothing(params):
    result, runner = install(params, ABSENT, check_mode=True)
    assert result["changed"] is True
    assert "/usr/bin/systemctl enable --now llm-fleet-unit-metrics.timer" in result["actions"]
    assert not os.path.exists(params["unit_dir"]) and not os.path.exists(params["lib_dir"])
    assert [argv[:3] for argv in runner.calls] == [list(TIMER_SHOW)]  # the query only


def test_the_per_endpoint_template_timers_are_retired(params):
    wants = Path(params["unit_dir"], "timers.target.wants")
    wants.mkdir(parents=True)
    (wants / "llm-fleet-unit-metrics@frank-secondary.timer").symlink_to("/dev/null")
    template = Path(params["unit_dir"], "llm-fleet-unit-metrics@.timer")
    template.write_text("[Timer]\n")
    result, runner = install(params, RUNNING)
    assert runner.ran(SYSTEMCTL, "disable", "llm-fleet-unit-metrics@frank-secondary.timer")
    assert runner.ran(SYSTEMCTL, "stop", "llm-fleet-unit-metrics@frank-secondary.timer")
    assert not template.exists()
    assert result["retired"] == ["llm-fleet-unit-metrics@frank-secondary.timer", str(template)]


def facts_of(table):
    return lambda unit: table[unit]


def test_the_writer_writes_each_unit_and_drops_retired_ones(tmp_path):
    (tmp_path / "llm_fleet_frank-gone.service.prom").write_text("stale\n")
    (tmp_path / "node_other.prom").write_text("kept\n")
    table = {
        "frank-secondary.service": {"NRestarts": "3", "ActiveState": "active", "ExecMainStartTimestamp": "@1764470000"},
        "frank-large.service": {"NRestarts": "0", "ActiveState": "failed", "ExecMainStartTimestamp": ""},
    }
    unit_metrics_writer.write_all(str(tmp_path), list(table), facts=facts_of(table))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "llm_fleet_frank-large.service.prom",
        "llm_fleet_frank-secondary.service.prom",
        "node_other.prom",
    ]
    secondary = (tmp_path / "llm_fleet_frank-secondary.service.prom").read_text()
    assert 'llm_fleet_unit_restarts_total{unit="frank-secondary.service"} 3\n' in secondary
    assert 'llm_fleet_unit_active{unit="frank-secondary.service"} 1\n' in secondary
    assert 'llm_fleet_unit_start_time_seconds{unit="frank-secondary.service"} 1764470000\n' in secondary
    large = (tmp_path / "llm_fleet_frank-large.service.prom").read_text()
    assert 'llm_fleet_unit_active{unit="frank-large.service"} 0\n' in large and "start_time" not in large


def probe_output(command, root):
    """Run the probe's command on this machine with systemctl answering enabled/active (a fake on PATH)."""
    fake_bin = Path(root, "bin")
    fake_bin.mkdir(exist_ok=True)
    systemctl = fake_bin / "systemctl"
    systemctl.write_text('#!/bin/sh\n[ "$1" = is-enabled ] && echo enabled || echo active\n')
    systemctl.chmod(0o755)
    proc = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env={"PATH": f"{fake_bin}:/usr/bin:/bin"}, check=True)
    return proc.stdout.splitlines()


def test_the_no_op_probe_matches_exactly_what_the_module_installs(params, tmp_path):
    units, textfile_dir = params["units"], params["textfile_dir"]
    probe = current_probe(units, textfile_dir, params["unit_dir"], params["lib_dir"])
    assert probe_output(probe["command"], tmp_path) != probe["expected"]  # nothing installed yet
    install(params, ABSENT)
    assert probe_output(probe["command"], tmp_path) == probe["expected"]
    # A writer edited on the machine, or a template timer left behind, runs the module again.
    Path(params["unit_dir"], "llm-fleet-unit-metrics@.timer").write_text("[Timer]\n")
    assert probe_output(probe["command"], tmp_path) != probe["expected"]
    Path(params["unit_dir"], "llm-fleet-unit-metrics@.timer").unlink()
    Path(params["lib_dir"], "llm_fleet_unit_metrics.py").write_text("# edited\n")
    assert probe_output(probe["command"], tmp_path) != probe["expected"]
    # Another endpoint on the machine changes the service, so the expected lines differ.
    assert current_probe([*units, "frank-extra.service"], textfile_dir, params["unit_dir"], params["lib_dir"])["expected"] != probe["expected"]
