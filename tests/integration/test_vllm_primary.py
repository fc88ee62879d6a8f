"""frank-primary on its production runtime, a real vLLM (CPU build) in podman under the root unit
on the lab host: green deploy, the KV law against the engine's own line for two shapes, the
crash-loop and false-green protections, and rollback from a shape that fails its gate.

Each vLLM boot takes about a minute on two cores, so the tests share one calibration store and
run in file order, leaving the lab shape serving."""

import json
import re

import pytest
from engine_privileges import assert_least_privilege
from lab_host import ROOT, cli, failures, lab_shape, on_host, playbook, require_lab_host, served, unit_property, wait_healthy

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_boot_log, price_shape
from ansible_collections.frank.llm_fleet.plugins.plugin_utils import observability

pytestmark = pytest.mark.lab

require_lab_host()

UNIT = "frank-primary.service"
PORT = 7770
LAB_SHAPE = lab_shape("frank-primary")
MODEL = ROOT / ".lab" / "models" / LAB_SHAPE["model_file"]
# A second shape of the same geometry: shorter requests, three of them, a 3 MiB pool.
OTHER_SHAPE = {**LAB_SHAPE, "max_model_len": 2048, "max_num_seqs": 3, "kv_cache_memory_bytes": "3 MiB"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("calibration")


def deploy(tmp_path, store, *extra, shape=None):
    extra_vars = {"llm_fleet_calibration_dir": str(store)}
    if shape is not None:
        extra_vars["endpoint_shape"] = shape
    return playbook(tmp_path, "deploy_primary.yml", *extra, extra_vars=extra_vars, limit="frank-primary")


def engine_kv_line() -> tuple[int, float]:
    """The running engine's own `CPU KV cache size: N tokens, Maximum concurrency ...: X x`."""
    invocation = unit_property(UNIT, "InvocationID")
    ledger = parse_boot_log(on_host("journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "--output", "cat", "--no-pager"))
    assert ledger.kv_tokens is not None, "the engine printed no KV cache size line"
    return ledger.kv_tokens, ledger.concurrency


def predicted(shape) -> dict:
    devices = [{"name": "lab-cpu", "memory": "2 GiB", "kind": "cpu"}]
    return price_shape(shape, devices, payload_dir=str(MODEL.parent)).kv


def test_green_deploy_serves_a_completion_and_a_rerun_changes_nothing(tmp_path, store):
    rc, stats, out = deploy(tmp_path, store)
    assert rc == 0, out[-4000:]
    assert served(PORT) == "frank-primary"
    # The full path reports the smoke probe's answer; a redeploy proven a no-op (the lab already
    # serves this shape) carries the proof's own probe answer in its result.
    assert re.search(r'completion: \S|"completion": "[^"]', out), "the deploy showed no completion from the engine"
    assert "--speculative-config" in unit_property(UNIT, "ExecStart")
    rc, stats, out = deploy(tmp_path, store)
    assert rc == 0 and stats["changed"] == 0, out[-4000:]


def test_the_engine_runs_without_privileges():
    # vLLM's compile caches land in the cache mount (HOME, XDG_CACHE_HOME) or the tmpfs /tmp.
    assert_least_privilege("frank-primary")


def test_predicted_kv_tokens_equal_the_engines_own_line_for_two_shapes(tmp_path, store):
    for shape in (OTHER_SHAPE, LAB_SHAPE):
        if shape is OTHER_SHAPE:
            rc, _stats, out = deploy(tmp_path, store, shape=shape)
            assert rc == 0, out[-4000:]
        else:
            rc, _stats, out = deploy(tmp_path, store)
            assert rc == 0, out[-4000:]
        tokens, concurrency = engine_kv_line()
        kv = predicted(shape)
        # bytes per token from the model's config: 2 layers x 2 KV heads x 32 dims x (K, V) x 2 B.
        assert kv["bytes_per_token"] == 512
        assert (kv["tokens"], round(kv["concurrency"], 2)) == (tokens, round(concurrency, 2))
    # 4 MiB / 512 B and 3 MiB / 512 B: the two shapes really differ in what the engine reports.
    assert (predicted(LAB_SHAPE)["tokens"], predicted(OTHER_SHAPE)["tokens"]) == (8192, 6144)
    proc = cli("calibration", "--dir", str(store), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)
    assert {row["layout"]["max_model_len"] for row in rows} == {4096, 2048}
    assert all(row["agree"] is True and row["measured"]["kv_tokens"] in (8192, 6144) for row in rows), rows


def test_the_committed_vllm_series_list_is_what_the_lab_engine_exports():
    live = observability.series_from_exposition(on_host("curl", "-s", f"http://127.0.0.1:{PORT}/metrics"))
    committed = observability.series_from_exposition((ROOT / "observability" / "exported" / "vllm.metrics").read_text())

    def stable(names):  # prometheus_client's *_created stamps appear only once a labelled child exists
        return {name for name in names if not name.endswith("_created")}

    assert stable(live) == stable(committed), (
        f"recapture vllm.metrics: only live {stable(live) - stable(committed)}, only committed {stable(committed) - stable(live)}"
    )


def test_probe_reads_the_refusal_boundary_from_vllm(tmp_path):
    rc, _stats, out = playbook(tmp_path, "bench.yml", "-e", f"llm_fleet_bench_dir={tmp_path}", "-e", "endpoint_bench_max_tokens=16", limit="frank-primary")
    assert rc == 0, failures(out)
    [result] = tmp_path.glob("frank-primary-*.json")
    stored = json.loads(result.read_text())
    assert stored["probe"]["boundary"]["window"] == LAB_SHAPE["max_model_len"]
    assert "maximum context length is 4096 tokens" in stored["probe"]["boundary"]["message"]
    assert stored["probe"]["parallel"]["parallel"] is True


def test_sigkill_of_the_engine_worker_restarts_the_unit():
    restarts = int(unit_property(UNIT, "NRestarts"))
    listener = on_host("podman", "inspect", "frank-primary", "--format", "{{.State.Pid}}")
    worker = on_host("pgrep", "-f", "-o", "VLLM::Worker")  # the process that runs the model
    assert worker and worker != listener
    on_host("kill", "-KILL", worker)
    # The API server may answer /health for a moment after its worker died: wait for the restart first.
    on_host("timeout", "120", "sh", "-c", f"until [ $(systemctl show -p NRestarts --value {UNIT}) -gt {restarts} ]; do sleep 1; done", check=False)
    assert int(unit_property(UNIT, "NRestarts")) > restarts, "the unit did not restart the engine"
    assert wait_healthy(PORT, 420), "the endpoint did not come back"
    assert on_host("podman", "inspect", "frank-primary", "--format", "{{.State.Pid}}") != listener
    assert served(PORT) == "frank-primary"


def test_a_foreign_listener_on_the_port_is_never_taken_for_the_engine(tmp_path, store):
    on_host("systemctl", "stop", UNIT)
    on_host("systemd-run", "--unit", "lab-squatter", "--property=Restart=no", "/usr/bin/python3", "-m", "http.server", "--bind", "127.0.0.1", str(PORT))
    try:
        assert wait_healthy(PORT, 20) is False  # it answers, but not /health
        rc, _stats, out = deploy(tmp_path, store)
        assert rc != 0
        assert "held by PID" in out and "http.server" in out
    finally:
        on_host("systemctl", "stop", "lab-squatter", check=False)
    rc, _stats, out = deploy(tmp_path, store)
    assert rc == 0, out[-4000:]
    assert served(PORT) == "frank-primary"


def test_a_vllm_shape_failing_its_gate_is_rolled_back_to_the_last_good_one(tmp_path, store):
    rc, _stats, out = deploy(tmp_path, store, shape={**LAB_SHAPE, "extra_args": ["--no-such-flag"]})
    assert rc != 0
    assert "the new shape failed" in out and "last-known-good shape is serving again" in out
    assert "--no-such-flag" not in unit_property(UNIT, "ExecStart")
    assert served(PORT) == "frank-primary"
    rc, stats, out = deploy(tmp_path, store)
    assert rc == 0 and stats["changed"] == 0, out[-4000:]
