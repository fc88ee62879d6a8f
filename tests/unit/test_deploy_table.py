"""The deploy's closing table without the callback (plugins/plugin_utils/deploy_table.py, printed by
playbooks/deploy.yml and deploy_fleet.yml through the action frank.llm_fleet.deploy_table), and the
no-op proof's verdict line the callback frank.llm_fleet.deploy_plan prints as each proof arrives."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ansible import context
from test_deploy_plan import DEPLOY, Display, Host, Play, Result, Task

from ansible_collections.frank.llm_fleet.plugins.callback import deploy_plan as callback
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.deploy_table import deploy_table_from_facts, endpoint_row, noop_sentence

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROVEN = {"changed": False, "noop": True, "full_path_reason": "", "main_pid": 4242, "health": {"models": ["frank-secondary"]}}
NOT_PROVEN = {"changed": False, "noop": False, "full_path_reason": "gates: the inputs of the gates budget differ from the last green deploy's"}


def test_the_proofs_verdict_in_one_line():
    assert noop_sentence("frank-secondary", PROVEN) == (
        "frank-secondary is a no-op: serving frank-secondary, healthy under MainPID 4242; the budget, payload and deploy gates are skipped"
    )
    assert noop_sentence("frank-secondary", NOT_PROVEN) == f"frank-secondary: full path: {NOT_PROVEN['full_path_reason']}"
    # A proof that could not run (its task does not fail: the full path reports in its own words).
    said = noop_sentence("x", {"msg": "endpoint_deploy: record_dir\nmissing"})
    assert said == "x: full path: the no-op check did not run: endpoint_deploy: record_dir missing"


@pytest.mark.parametrize(
    ("facts", "verdict", "detail"),
    [
        ({"__endpoint_noop": PROVEN, "__endpoint_deploy": {"skipped": True}}, "unchanged", "no-op: healthy under MainPID 4242"),
        ({"__endpoint_noop": NOT_PROVEN, "__endpoint_deploy": {"steps": {"unit": {"changed": True}}}}, "shape change (restart)", "changed: unit"),
        ({"__fleet_failure": "Price per device - x: lab-cpu: over"}, "refused by a gate", "Price per device - x: lab-cpu: over"),
        ({"__fleet_failure": "Deploy: health gate (rolled back to the last-known-good shape)"}, "rolled back", "Deploy: health gate"),
        ({"__fleet_not_reached": "depends on a, which failed (x)", "__endpoint_noop": PROVEN}, "not reached", "depends on a, which failed (x)"),
        ({"__endpoint_budget": {"fits": True, "ledger": [], "payload_identity": {"checked": True}}}, "fits", "payload identity checked"),
        ({}, "not deployed", "no deploy task ran (tags or a condition)"),
    ],
)
def test_each_endpoint_reads_as_the_run_left_it(facts, verdict, detail):
    row = endpoint_row("x", facts)
    assert (row.verdict, row.detail) == (verdict, detail)


def test_the_table_is_a_deploy_result_or_a_fleet_plan_when_the_run_only_priced():
    deployed = deploy_table_from_facts(["a", "b"], {"a": {"__endpoint_noop": PROVEN}, "b": {"__fleet_failure": "preflight: no port"}}, check_mode=False)
    lines = deployed.splitlines()
    assert lines[0] == "Deploy result" and lines[2].split() == ["endpoint", "verdict", "detail"]
    assert lines[3].split()[:2] == ["a", "unchanged"] and lines[4].split()[:2] == ["b", "refused"]
    assert lines[-1] == "1 unchanged, 1 refused by a gate"
    priced = deploy_table_from_facts(["a"], {"a": {"__endpoint_budget": {"fits": True, "ledger": []}}}, check_mode=True)
    assert priced.startswith("Fleet plan (priced only: nothing was changed)")


@pytest.mark.slow
@pytest.mark.parametrize("callback", [True, False], ids=["callback", "no-callback"])
def test_the_budget_check_prints_the_table_once_with_or_without_the_callback(tmp_path, callback):
    # The documented pre-deploy check, on the production inventory (priced on the controller).
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
    # Another callback named instead of ours: the user who never enabled it.
    env["ANSIBLE_CALLBACKS_ENABLED"] = "frank.llm_fleet.deploy_plan" if callback else "ansible.builtin.junit"
    env["JUNIT_OUTPUT_DIR"] = str(tmp_path)
    argv = [str(BIN / "ansible-playbook"), "playbooks/deploy_fleet.yml", "-i", "inventories/production", "--check", "--tags", "budget"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert proc.stdout.count("Fleet plan (priced only: nothing was changed)") == 1, proc.stdout[-3000:]
    table = proc.stdout[proc.stdout.index("Fleet plan (priced only") :]
    for endpoint in ("frank-archon", "frank-zealot", "frank-dragoon"):
        assert re.search(rf"{endpoint}\s+fits\s", table), table


@pytest.fixture
def plan_callback(monkeypatch):
    monkeypatch.setattr(context, "CLIARGS", {"check": False})
    module = callback.CallbackModule()
    module._display = Display()
    return module


def test_the_callback_says_what_each_proof_found_as_it_arrives(plan_callback):
    plan_callback.v2_playbook_on_play_start(Play([Host("frank-primary"), Host("frank-secondary")]))
    proof = Task(DEPLOY, args={"noop_check": True})
    plan_callback.v2_runner_on_ok(Result(Host("frank-secondary"), proof, PROVEN))
    plan_callback.v2_runner_on_ok(Result(Host("frank-primary"), proof, NOT_PROVEN))
    # A deploy's own result is not a proof: no line.
    plan_callback.v2_runner_on_ok(Result(Host("frank-primary"), Task(DEPLOY), {"steps": {"unit": {"changed": True}}}))
    assert plan_callback._display.lines == [noop_sentence("frank-secondary", PROVEN), noop_sentence("frank-primary", NOT_PROVEN)]


def test_the_proofs_line_is_not_printed_into_a_json_document(plan_callback, monkeypatch):
    monkeypatch.setattr(callback.C.config, "get_config_value", lambda name: "ansible.builtin.json" if name == "DEFAULT_STDOUT_CALLBACK" else None)
    plan_callback.v2_runner_on_ok(Result(Host("frank-secondary"), Task(DEPLOY, args={"noop_check": True}), PROVEN))
    assert plan_callback._display.lines == []
