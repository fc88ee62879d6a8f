"""deploy_secondary.yml (deploy.yml for the endpoint host frank-secondary) end to end on the lab
host (llama-server in podman under the root unit): gates, idempotence, refusals, rollback, the
calibration loop, the bench playbook, unit metrics."""

import json
import subprocess
import time

import pytest
from engine_privileges import assert_least_privilege
from lab_host import BIN, ROOT, cli, env, lab_shape, on_host, playbook, require_lab_host, served, unit_property, wait_healthy

from ansible_collections.frank.llm_fleet.plugins.plugin_utils import observability

pytestmark = pytest.mark.lab

require_lab_host()

UNIT = "frank-secondary.service"
PORT = 7771
LAB_SHAPE = lab_shape("frank-secondary")


def deploy(tmp_path, *extra, shape=None):
    extra_vars = {"endpoint_shape": shape} if shape is not None else None
    return playbook(tmp_path, "deploy_secondary.yml", *extra, extra_vars=extra_vars, limit="frank-secondary")


def main_pid():
    return unit_property(UNIT, "MainPID")


def test_fresh_deploy_then_rerun_changes_nothing(tmp_path):
    rc, stats, out = deploy(tmp_path)
    assert rc == 0, out[-3000:]
    assert served(PORT) == "frank-secondary"
    rc, stats, out = deploy(tmp_path)
    assert rc == 0 and stats["changed"] == 0, out[-3000:]


def test_the_engine_runs_without_privileges():
    # Capabilities none, no-new-privileges, a read-only root, a non-root UID:GID.
    assert_least_privilege("frank-secondary")


def test_check_mode_on_a_changed_shape_reports_and_changes_nothing(tmp_path):
    unit_before = on_host("cat", f"/etc/systemd/system/{UNIT}")
    pid = main_pid()
    rc, stats, out = deploy(tmp_path, "--check", "--diff", shape={**LAB_SHAPE, "ctx_size": 4096})
    assert rc == 0, out[-3000:]
    assert stats["changed"] >= 1
    assert on_host("cat", f"/etc/systemd/system/{UNIT}") == unit_before
    assert main_pid() == pid


def test_inventory_typo_fails_before_the_host_changes(tmp_path):
    pid = main_pid()
    rc, _stats, out = deploy(tmp_path, shape={**LAB_SHAPE, "ctx_sise": 4096})
    assert rc != 0
    assert "ctx_sise" in out
    assert main_pid() == pid


def test_over_budget_shape_is_refused_and_the_endpoint_keeps_serving(tmp_path):
    pid = main_pid()
    rc, _stats, out = deploy(tmp_path, shape={**LAB_SHAPE, "ctx_size": 8_388_608})
    assert rc != 0
    assert "shape does not fit" in out and "lab-cpu" in out and "MiB" in out
    assert main_pid() == pid
    assert served(PORT) == "frank-secondary"


def test_shape_failing_its_health_gate_is_rolled_back(tmp_path):
    rc, _stats, out = deploy(tmp_path, shape={**LAB_SHAPE, "extra_args": ["--no-such-flag"]})
    assert rc != 0
    assert "the new shape failed" in out and "last-known-good shape is serving again" in out
    assert "--no-such-flag" not in unit_property(UNIT, "ExecStart")
    assert served(PORT) == "frank-secondary"
    rc, stats, out = deploy(tmp_path)
    assert rc == 0 and stats["changed"] == 0, out[-3000:]


def test_each_boot_is_stored_and_its_kv_agrees_exactly_with_the_prediction(tmp_path):
    store = tmp_path / "calibration"
    other = {**LAB_SHAPE, "ctx_size": 6144, "parallel": 3, "type_k": "q8_0"}
    for shape in (other, LAB_SHAPE):
        rc, _stats, out = deploy(tmp_path, "-e", f"llm_fleet_calibration_dir={store}", shape=shape)
        assert rc == 0, out[-3000:]
    proc = cli("calibration", "--dir", str(store), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)
    layouts = {(row["layout"]["ctx_size"], row["layout"]["parallel"]) for row in rows}
    assert layouts == {(6144, 3), (8192, 2)}
    for row in rows:
        assert row["agree"] is True, row
        assert row["measured"] == row["predicted"]
        assert row["measured"]["cells"] == 8192 // 2 or row["measured"]["cells"] == 2048
    # The next budget gate rests on the stored boot: its figure is measured, not formula.
    rc, _stats, out = deploy(tmp_path, "--check", "--tags", "budget", "-e", f"llm_fleet_calibration_dir={store}")
    assert rc == 0 and "'basis': 'measured'" in out.replace('"', "'"), out[-3000:]


def test_bench_playbook_keeps_json_table_and_plot_on_the_controller(tmp_path):
    argv = [str(BIN / "ansible-playbook"), "playbooks/bench.yml", "-e", f"llm_fleet_bench_dir={tmp_path}", "-e", "endpoint_bench_max_tokens=16"]
    argv += ["--limit", "frank-secondary"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env(), check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    [result] = tmp_path.glob("frank-secondary-*.json")
    stored = json.loads(result.read_text())
    assert stored["probe"]["boundary"]["window"] == LAB_SHAPE["ctx_size"] // LAB_SHAPE["parallel"]
    assert stored["probe"]["parallel"]["parallel"] is True
    assert all(job["ok"] for job in stored["bench"]["jobs"])
    assert result.with_suffix(".txt").exists() and result.with_suffix(".png").stat().st_size > 10_000


def test_the_committed_llamacpp_series_list_is_what_the_lab_engine_exports():
    live = observability.series_from_exposition(on_host("curl", "-s", f"http://127.0.0.1:{PORT}/metrics"))
    committed = observability.series_from_exposition((ROOT / "observability" / "exported" / "llamacpp.metrics").read_text())
    assert live == committed, f"recapture observability/exported/llamacpp.metrics: only live {live - committed}, only committed {committed - live}"


def test_unit_metrics_count_a_crash_restart_for_the_alert_rules():
    prom = "/var/lib/prometheus/node-exporter/llm_fleet_frank-secondary.service.prom"

    def facts():
        on_host("systemctl", "start", "llm-fleet-unit-metrics.service")  # what the timer runs
        text = on_host("cat", prom)
        values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
        return text, values

    text, before = facts()
    assert observability.series_from_exposition(text) == observability.UNIT_SERIES
    assert on_host("systemctl", "is-active", "llm-fleet-unit-metrics.timer") == "active"
    restarts = int(before['llm_fleet_unit_restarts_total{unit="frank-secondary.service"}'])
    on_host("systemctl", "kill", "--signal=SIGKILL", UNIT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _text, after = facts()
        if (
            int(after['llm_fleet_unit_restarts_total{unit="frank-secondary.service"}']) > restarts
            and after['llm_fleet_unit_active{unit="frank-secondary.service"}'] == "1"
        ):
            break
        time.sleep(1)
    else:
        pytest.fail(f"the restart did not show in {prom}: {after}")
    assert wait_healthy(PORT, 60)  # serving again before the next test
