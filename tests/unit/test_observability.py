"""Observability, the client contract and the runbooks follow the inventory."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape
from ansible_collections.frank.llm_fleet.plugins.plugin_utils import observability
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.fleet_artifacts import exported_series

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = ROOT / ".cache" / "tools" / "promtool"
EXPORTED = exported_series(str(ROOT / "observability" / "exported"))


def generate(inventory, out, *extra):
    argv = [sys.executable, str(ROOT / "bin" / "llm-fleet"), "generate", "-i", str(inventory), "-o", str(out), *extra]
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)


@pytest.fixture
def inventory(tmp_path):
    """A copy of the production inventory the test may edit."""
    copy = tmp_path / "production"
    shutil.copytree(ROOT / "inventories" / "production", copy)
    return copy


def edit_shape(inventory, endpoint, **changes):
    path = inventory / "host_vars" / f"{endpoint}.yml"
    data = yaml.safe_load(path.read_text())
    data["endpoint_shape"].update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del data["endpoint_shape"][key]
    path.write_text(yaml.safe_dump(data))


def rules_of(out, endpoint):
    return yaml.safe_load((out / "prometheus" / "rules" / f"{endpoint}.rules.yml").read_text())["groups"][0]["rules"]


def series_of(rules):
    return set().union(*(observability.series_in_expr(rule["expr"]) for rule in rules))


def test_series_in_expr_reads_names_not_functions_labels_or_keywords():
    expr = 'rate(vllm:generation_tokens_total{job="a", le="0.5"}[10m]) > 0 and on(job) sum by (le) (vllm:x_bucket{job=~"a|b"}) == bool 0'
    assert observability.series_in_expr(expr) == {"vllm:generation_tokens_total", "vllm:x_bucket"}
    assert observability.series_in_expr("up == 0") == {"up"}


def test_exposition_series_include_what_types_imply():
    text = '# TYPE vllm:a counter\n# TYPE vllm:h histogram\n# TYPE vllm:g gauge\nvllm:g{x="1"} 2\nllamacpp:b_total 3\n'
    assert observability.series_from_exposition(text) == {"vllm:a_total", "vllm:h_bucket", "vllm:h_sum", "vllm:h_count", "vllm:g", "llamacpp:b_total"}


def test_captured_lists_hold_the_series_the_rules_rely_on():
    assert {"llamacpp:requests_deferred", "llamacpp:spec_decode_num_drafts_total", "llamacpp:tokens_predicted_total"} <= EXPORTED["llamacpp"]
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:spec_decode_num_drafts_total"} <= EXPORTED["vllm"]
    # The old vLLM name the fleet's hand-written rules once used is gone from the real engine.
    assert "vllm:gpu_cache_usage_perc" not in EXPORTED["vllm"]
    assert not any(name.startswith("vllm:") for name in EXPORTED["llamacpp"])


def test_a_rule_naming_a_series_the_runtime_does_not_export_fails_the_check():
    group, _notes = observability.alert_group("frank-primary", parse_shape({"runtime": "vllm", "max_model_len": 4096, "port": 7770}), EXPORTED["vllm"])
    assert observability.check_rule_groups([group], EXPORTED) == []
    group["rules"].append({"alert": "Stale", "expr": "vllm:gpu_cache_usage_perc > 0.9", "labels": {"runtime": "vllm"}})
    assert observability.check_rule_groups([group], EXPORTED) == ["llm-fleet-frank-primary/Stale: names series vllm does not export: vllm:gpu_cache_usage_perc"]
    # Namespaces do not mix: a llama.cpp series on a vLLM endpoint is as wrong.
    group["rules"][-1]["expr"] = "llamacpp:requests_deferred > 0"
    assert "llamacpp:requests_deferred" in observability.check_rule_groups([group], EXPORTED)[0]


def test_rules_that_need_an_unexported_series_are_left_out_and_named():
    without_kv = EXPORTED["vllm"] - {"vllm:kv_cache_usage_perc"}
    group, notes = observability.alert_group("frank-primary", parse_shape({"runtime": "vllm", "max_model_len": 4096, "port": 7770}), without_kv)
    assert "FrankPrimaryKvPoolNearlyFull" not in [r["alert"] for r in group["rules"]]
    assert notes == ["frank-primary: KvPoolNearlyFull left out: vllm does not export vllm:kv_cache_usage_perc"]


def test_dashboard_panels_only_for_exported_series():
    board, notes = observability.dashboard("vllm", ["frank-primary"], EXPORTED["vllm"] - {"vllm:num_preemptions_total"})
    titles = [p["title"] for p in board["panels"]]
    assert "Preemptions/s" not in titles and any("Preemptions" in n for n in notes)
    assert observability.check_dashboard(board, "vllm", EXPORTED["vllm"]) == []
    assert observability.check_dashboard(board, "llamacpp", EXPORTED["llamacpp"])  # wrong namespace is caught


@pytest.mark.slow  # llm-fleet generate (ansible-inventory), promtool or ansible-doc
def test_changing_the_runtime_moves_rules_and_dashboard_to_the_other_namespace(inventory, tmp_path):
    out = tmp_path / "out"
    assert generate(inventory, out).returncode == 0
    before = series_of(rules_of(out, "frank-archon"))
    assert any(s.startswith("radiance:") for s in before) and not any(s.startswith("llamacpp:") for s in before)
    assert "frank-archon" in json.loads((out / "grafana" / "radiance.json").read_text())["templating"]["list"][1]["query"]
    # A runtime swap is a new shape: the radiance keys go (the parser refuses them on a llama.cpp shape).
    path = inventory / "host_vars" / "frank-archon.yml"
    data = yaml.safe_load(path.read_text())
    identity = {k: data["endpoint_shape"][k] for k in ("served_id", "bind", "port") if k in data["endpoint_shape"]}
    data["endpoint_shape"] = {**identity, "runtime": "llamacpp", "launch": "native", "model_file": "model.gguf", "ctx_size": 401408, "parallel": 2}
    path.write_text(yaml.safe_dump(data))
    proc = generate(inventory, out)
    assert proc.returncode == 0, proc.stderr
    after = series_of(rules_of(out, "frank-archon"))
    assert any(s.startswith("llamacpp:") for s in after) and not any(s.startswith("radiance:") for s in after)
    assert all(r["labels"]["runtime"] == "llamacpp" for r in rules_of(out, "frank-archon"))
    # No radiance endpoint is left: its dashboard is removed, and the llama.cpp one lists frank-primary.
    assert not (out / "grafana" / "radiance.json").exists() and "removed: grafana/radiance.json" in proc.stdout
    board = json.loads((out / "grafana" / "llamacpp.json").read_text())
    assert "frank-archon" in board["templating"]["list"][1]["query"]
    assert not any("radiance:" in t["expr"] for p in board["panels"] for t in p["targets"])


@pytest.mark.slow  # llm-fleet generate (ansible-inventory), promtool or ansible-doc
def test_models_window_follows_a_context_change_by_the_law(inventory, tmp_path):
    out = tmp_path / "out"
    assert generate(inventory, out).returncode == 0
    model = yaml.safe_load((out / "client" / "frank-archon.models.yml").read_text())["models"][0]
    assert (model["contextWindow"], model["maxTokens"]) == (154_944, 45_056)  # ceiling 200,000 - gap 45,056
    assert model["input"] == ["text"]
    edit_shape(inventory, "frank-archon", max_model_len=262_144)
    proc = generate(inventory, out, "--diff")
    assert proc.returncode == 0
    assert "-    contextWindow: 154944\n+    contextWindow: 217088\n" in proc.stdout  # 262,144 - 45,056
    assert "changed: client/frank-archon.models.yml" in proc.stdout
    rerun = generate(inventory, out)
    assert "0 changed" in rerun.stderr and "changed:" not in rerun.stdout


@pytest.mark.slow  # llm-fleet generate (ansible-inventory), promtool or ansible-doc
def test_llamacpp_window_is_the_per_slot_window_and_a_projector_adds_images(inventory, tmp_path):
    out = tmp_path / "out"
    assert generate(inventory, out).returncode == 0
    secondary = yaml.safe_load((out / "client" / "frank-zealot.models.yml").read_text())["models"][0]
    # 401,408 over 2 slots = 200,704 per request -> 155,648; the vision projector means images.
    assert secondary["contextWindow"] == 155_648 and secondary["input"] == ["text", "image"]
    assert secondary["baseUrl"] == "http://dankclaw:7771/v1"


@pytest.mark.slow  # llm-fleet generate (ansible-inventory), promtool or ansible-doc
def test_models_dir_and_check_mode(inventory, tmp_path):
    out, models = tmp_path / "out", tmp_path / "harness"
    proc = generate(inventory, out, "--models-dir", str(models), "--check")
    assert proc.returncode == 0 and "would change: frank-archon.models.yml" in proc.stdout
    assert not out.exists() and not models.exists()
    assert generate(inventory, out, "--models-dir", str(models)).returncode == 0
    assert sorted(p.name for p in models.iterdir()) == ["frank-archon.models.yml", "frank-dragoon.models.yml", "frank-zealot.models.yml"]
    assert not (out / "client").exists()


@pytest.mark.skipif(not PROMTOOL.exists(), reason="promtool is installed by `make setup`")
@pytest.mark.slow  # llm-fleet generate (ansible-inventory), promtool or ansible-doc
def test_promtool_accepts_the_generated_config_and_rules(tmp_path):
    for inventory in ("inventories/production", "inventories/lab"):
        out = tmp_path / Path(inventory).name
        proc = generate(ROOT / inventory, out, "--calibration-dir", str(tmp_path / "none"))
        assert proc.returncode == 0, proc.stderr
        # The operator stages a keyed llama.cpp endpoint's key beside the config; promtool checks it exists.
        config = yaml.safe_load((out / "prometheus" / "prometheus.yml").read_text())
        for job in config["scrape_configs"]:
            if "authorization" in job:
                key = out / "prometheus" / job["authorization"]["credentials_file"]
                key.parent.mkdir(exist_ok=True)
                key.write_text("staged-by-the-operator\n")
        check = subprocess.run([str(PROMTOOL), "check", "config", str(out / "prometheus" / "prometheus.yml")], capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        rules = sorted(str(p) for p in (out / "prometheus" / "rules").glob("*.yml"))
        check = subprocess.run([str(PROMTOOL), "check", "rules", *rules], capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.skipif(not PROMTOOL.exists(), reason="promtool is installed by `make setup`")
@pytest.mark.slow  # llm-fleet generate (ansible-inventory), promtool or ansible-doc
def test_promtool_fires_the_alerts_on_synthetic_series(tmp_path):
    out = tmp_path / "out"
    assert generate(ROOT / "inventories" / "production", out, "--calibration-dir", str(tmp_path / "none")).returncode == 0
    tests = {
        "rule_files": [str(out / "prometheus" / "rules" / "frank-archon.rules.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'radiance:num_requests_waiting{job="frank-archon"}', "values": "3x10"},
                    {"series": 'llm_fleet_unit_restarts_total{unit="frank-archon.service"}', "values": "0 1 2 3 4 5 6 7 8 9 10"},
                    {"series": 'up{job="frank-archon"}', "values": "1 1 0 0 0 0 0 0 0 0 0"},
                ],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": "FrankArchonRequestsQueueing", "exp_alerts": []},
                    {
                        "eval_time": "6m",
                        "alertname": "FrankArchonRequestsQueueing",
                        "exp_alerts": [_alert("warning", "frank-archon: requests wait for the scheduler", job="frank-archon")],
                    },
                    {
                        "eval_time": "8m",
                        "alertname": "FrankArchonUnitCrashLooping",
                        "exp_alerts": [_alert("critical", CRASH_LOOP, unit="frank-archon.service")],
                    },
                    {"eval_time": "3m", "alertname": "FrankArchonEndpointDown", "exp_alerts": []},
                    {
                        "eval_time": "5m",
                        "alertname": "FrankArchonEndpointDown",
                        "exp_alerts": [_alert("critical", "frank-archon does not answer /metrics: the endpoint is down", job="frank-archon")],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "alerts.test.yml"
    path.write_text(yaml.safe_dump(tests))
    proc = subprocess.run([str(PROMTOOL), "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


CRASH_LOOP = "frank-archon: systemd restarted frank-archon.service more than twice in 15 minutes"


def _alert(severity, summary, **series_labels):
    labels = {"severity": severity, "endpoint": "frank-archon", "runtime": "radiance", **series_labels}
    return {"exp_labels": labels, "exp_annotations": {"summary": summary}}


@pytest.mark.slow  # llm-fleet generate (ansible-inventory), promtool or ansible-doc
def test_docs_are_current_and_the_index_links_every_page():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    index = (ROOT / "docs" / "index.md").read_text()
    linked = {(ROOT / "docs" / target).resolve() for target in re.findall(r"\]\(([^)]+\.md)\)", index)}
    # docs/fleet (the maintainers' fleet, not shipped) is named, not linked: the shipped index's links all resolve.
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md") if p.name != "index.md" and "fleet" not in p.relative_to(ROOT / "docs").parts}
    pages |= {p.resolve() for p in (ROOT / "roles").glob("*/README.md")}
    assert pages - linked == set()
    assert "## The production fleet" in index and "docs/fleet" in index
    assert all(p.exists() for p in linked)


@pytest.mark.parametrize("endpoint", ["frank-archon", "frank-zealot", "frank-dragoon"])
def test_each_production_runbook_renders_with_its_picture(endpoint):
    page = (ROOT / "docs" / "fleet" / "runbooks" / f"{endpoint}.md").read_text()
    assert f"# Runbook: {endpoint}" in page and f"ansible-playbook frank.llm_fleet.rollback -i inventories/production -e endpoint={endpoint}" in page
    picture = re.search(r"!\[[^\]]*\]\(([^)]+\.png)\)", page).group(1)
    with Image.open(ROOT / "docs" / "fleet" / "runbooks" / picture) as image:
        image.load()
        assert image.format == "PNG" and image.size == (1000, 600)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    # Not blank: many colours (text antialiasing, bars), and white does not cover everything.
    assert len(colours) > 20 and max(colours)[0] < 1000 * 600


def test_the_priced_runbook_picture_shows_the_ledger_bars():
    with Image.open(ROOT / "docs" / "fleet" / "runbooks" / "frank-archon-ledger.png") as image:
        colours = dict((c, n) for n, c in image.convert("RGB").getcolors(maxcolors=1 << 16))
    # matplotlib's first two cycle colours: the expert_slab and kv_pool terms of both ranks.
    assert colours.get((31, 119, 180), 0) > 2000 and colours.get((255, 127, 14), 0) > 2000


def test_the_runbook_shows_what_the_last_restart_cost_clients():
    from ansible_collections.frank.llm_fleet.plugins.plugin_utils.fleet_artifacts import EndpointFacts, runbook

    shape = {"runtime": "llamacpp", "port": 7771, "model_file": "m.gguf", "ctx_size": 8192}
    restart = {"drain": {"outcome": "drained", "in_flight_at_start": 5, "cut": 0, "waited_s": 2.02}, "start_to_healthy_s": 4.7}
    boot = {"endpoint": "frank-secondary", "host": "dankclaw", "recorded_at": "2026-11-30T04:00:00Z", "shape": shape, "ledger": {"restart": restart}}
    page = runbook(EndpointFacts("frank-secondary", "frank-secondary", "dankclaw", shape, boots=[boot]), None, "not priced", [], "lab")
    assert "- Restart: healthy **4.7 s** after the start; drain drained (5 in flight, waited 2.02 s, 0 cut)" in page
