"""The deploy plan (plugins/plugin_utils/deploy_plan.py and the callback frank.llm_fleet.deploy_plan)
driven with synthetic task results shaped like endpoint_deploy's and the gate modules' own."""

import json

import pytest
from ansible import context

from ansible_collections.frank.llm_fleet.plugins.callback import deploy_plan as callback
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.deploy_plan import DeployPlan, Row, deploy_verdict, render

DEPLOY = "frank.llm_fleet.endpoint_deploy"
ROLE = "/c/ansible_collections/frank/llm_fleet/roles/endpoint/tasks"


def steps(*changed, unit=None, record_diff=None):
    result = {name: {"changed": name in changed} for name in ("engine", "unit", "probe", "record")}
    result["unit"].update(unit or {})
    if record_diff is not None:
        result["record"]["diff"] = {"before": record_diff[0], "after": record_diff[1]}
    return {"changed": bool(changed), "steps": result, "rolled_back": False, "actions": []}


def record(runtime, launch, unit="frank-secondary.service", ctx=8192):
    return json.dumps({"shape": {"runtime": runtime, "launch": launch, "ctx_size": ctx}, "engine": None, "unit": {"name": unit}})


@pytest.mark.parametrize(
    ("result", "verdict", "detail"),
    [
        (steps(), "unchanged", ""),
        (steps("unit", "record"), "shape change (restart)", "changed: unit, record"),
        (steps("engine", "unit", "record"), "shape change (restart)", "changed: engine, unit, record"),
        # The record alone (a shape key the unit does not carry): the engine keeps serving.
        (steps("record"), "cosmetic change (no restart)", "changed: record"),
        # A unit step that reports a documentation-only edit (rewritten and reloaded, no restart).
        (steps("unit", unit={"cosmetic": True}), "cosmetic change (no restart)", "changed: unit"),
        # endpoint_deploy names a runtime swap itself, and the drain's outcome and the retired units show.
        (
            {
                **steps("unit", "record", unit={"drain": {"outcome": "forced", "cut": 2}}),
                "steps": {
                    **steps("unit", "record")["steps"],
                    "unit": {"changed": True, "drain": {"outcome": "forced", "cut": 2}},
                    "retire": {"changed": True, "swap": "llamacpp/native -> vllm/podman", "units": [{"unit": "old.service", "changed": True}]},
                },
            },
            "runtime swap",
            "llamacpp/native -> vllm/podman (old unit archived); changed: retire, unit, record; drain forced, 2 cut; retired old.service",
        ),
        (steps("unit", "record", record_diff=("", record("llamacpp", "podman"))), "new endpoint (install)", "changed: unit, record"),
        (
            steps("unit", "record", record_diff=(record("llamacpp", "podman"), record("llamacpp", "podman", ctx=4096))),
            "shape change (restart)",
            "changed: unit, record",
        ),
        (
            steps("engine", "unit", "record", record_diff=(record("llamacpp", "native"), record("llamacpp", "podman"))),
            "runtime swap",
            "llamacpp/native frank-secondary.service -> llamacpp/podman frank-secondary.service; changed: engine, unit, record",
        ),
        ({"changed": True, "restored": True, "steps": {}}, "restored (last-known-good)", ""),
    ],
)
def test_each_deploy_result_gets_its_verdict(result, verdict, detail):
    assert deploy_verdict(result) == (verdict, detail)


BUDGET_MSG = "shape does not fit lab-cpu: 2.1 GiB over"
DIGEST_MSG = "image x has digest sha256:aa; expected sha256:bb"
PROBE_MSG = "smoke probe: the completion is empty (0 completion tokens)"


@pytest.mark.parametrize(
    ("action", "path", "result", "verdict", "detail"),
    [
        ("frank.llm_fleet.vram_budget", f"{ROLE}/budget.yml:2", {"msg": BUDGET_MSG + "\nledger..."}, "refused by a gate (budget)", BUDGET_MSG),
        ("frank.llm_fleet.hf_payload_gate", f"{ROLE}/payload.yml:9", {"msg": "size 10 != 12"}, "refused by a gate (payload)", "size 10 != 12"),
        ("ansible.builtin.assert", f"{ROLE}/preflight.yml:30", {"msg": "no port"}, "refused by a gate (preflight)", "no port"),
        (DEPLOY, f"{ROLE}/deploy.yml:4", {"msg": DIGEST_MSG, "expected_digest": "sha256:bb"}, "refused by a gate (digest)", DIGEST_MSG),
        (DEPLOY, f"{ROLE}/deploy.yml:4", {"msg": "port held by PID 9", "foreign_pid": 9}, "refused by a gate (ownership)", "port held by PID 9"),
        (DEPLOY, f"{ROLE}/deploy.yml:4", {"msg": "crash-looping", "health": {}, "rolled_back": False}, "refused by a gate (health)", "crash-looping"),
        (DEPLOY, f"{ROLE}/deploy.yml:4", {"msg": PROBE_MSG}, "refused by a gate (probe)", PROBE_MSG),
        (
            DEPLOY,
            f"{ROLE}/deploy.yml:4",
            {"msg": "the new shape failed (crash-looping). The last-known-good shape is serving again.", "health": {}, "rolled_back": True},
            "rolled back",
            "health: the new shape failed (crash-looping). The last-known-good shape is serving again.",
        ),
        ("ansible.builtin.copy", "/x/site.yml:3", {"msg": "Destination not writable"}, "refused by a gate (Copy the thing)", "Destination not writable"),
        ("ansible.builtin.raw", f"{ROLE}/x.yml:3", {"msg": "rc 1"}, "refused by a gate (Ask the machine)", "rc 1"),
    ],
)
def test_a_failed_task_names_its_gate_and_why(action, path, result, verdict, detail):
    plan = DeployPlan()
    name = "frank.llm_fleet.host_metrics : Ask the machine" if action == "ansible.builtin.raw" else "Copy the thing"
    plan.failed("frank-x", action, path, name, result)
    assert plan.rows() == [Row("frank-x", verdict, detail)]


def test_a_stopped_run_lists_every_later_endpoint_as_pending():
    plan = DeployPlan()
    plan.expect(["frank-primary", "frank-secondary", "frank-large", "frank-extra"])
    plan.deployed("frank-primary", steps())
    plan.failed("frank-secondary", DEPLOY, f"{ROLE}/deploy.yml:4", "Deploy", {"msg": "crash-looping", "health": {}, "rolled_back": True})
    assert [(row.endpoint, row.verdict) for row in plan.rows()] == [
        ("frank-primary", "unchanged"),
        ("frank-secondary", "rolled back"),
        ("frank-large", "pending"),
        ("frank-extra", "pending"),
    ]
    assert plan.rows()[2].detail == "never reached: the run stopped at frank-secondary"


def test_an_endpoint_no_deploy_task_reached_in_a_finished_run_is_not_pending():
    plan = DeployPlan()
    plan.expect(["frank-primary", "frank-secondary"])
    plan.deployed("frank-primary", steps())
    assert plan.rows()[1] == Row("frank-secondary", "not deployed", "no deploy task ran (tags or a condition)")


def test_the_table_aligns_its_columns_and_counts_each_verdict():
    rows = [Row("frank-primary", "unchanged"), Row("frank-large", "shape change (restart)", "changed: unit"), Row("frank-extra", "unchanged")]
    assert render(rows, check_mode=True).splitlines() == [
        "Deploy plan (check mode: nothing was changed)",
        "",
        "endpoint       verdict                 detail",
        "frank-primary  unchanged",
        "frank-large    shape change (restart)  changed: unit",
        "frank-extra    unchanged",
        "",
        "2 unchanged, 1 shape change (restart)",
    ]
    assert render(rows, check_mode=False).splitlines()[0] == "Deploy result"


# --- the callback, with stand-ins for what ansible-playbook hands it -----------------------------


class Group:
    def __init__(self, name):
        self.name = name


class Host:
    def __init__(self, name, groups=("llm_endpoints",)):
        self.name = name
        self.groups = [Group(group) for group in groups]

    def get_name(self):
        return self.name

    def get_groups(self):
        return self.groups


class Task:
    def __init__(self, action, path=f"{ROLE}/deploy.yml:4", name="Deploy", args=None):
        self.resolved_action = action
        self.action = action
        self.args = args or {}
        self.path = path
        self.name = name

    def get_path(self):
        return self.path

    def get_name(self):
        return self.name


class Result:
    def __init__(self, host, task, result):
        self.host, self.task, self.result = host, task, result


class Inventory:
    def __init__(self, hosts):
        self.hosts = hosts

    def get_hosts(self, pattern, order=None):
        return self.hosts


class VariableManager:
    def __init__(self, hosts):
        self._inventory = Inventory(hosts)


class Play:
    hosts = "llm_endpoints"
    order = "inventory"

    def __init__(self, hosts):
        self.variable_manager = VariableManager(hosts)

    def get_variable_manager(self):
        return self.variable_manager


class Display:
    def __init__(self):
        self.lines = []

    def banner(self, text):
        self.lines.append(f"BANNER {text}")

    def display(self, text):
        self.lines.extend(text.splitlines())


@pytest.fixture
def plan_callback(monkeypatch):
    monkeypatch.setattr(context, "CLIARGS", {"check": True})
    module = callback.CallbackModule()
    module._display = Display()
    return module


def test_the_callback_prints_one_row_per_endpoint_and_pending_after_a_refusal(plan_callback):
    primary, secondary, large = Host("frank-primary"), Host("frank-secondary"), Host("frank-large")
    plan_callback.v2_playbook_on_play_start(Play([primary, secondary, large, Host("llm-fleet-lab-host1", groups=("lab_hosts",))]))
    plan_callback.v2_runner_on_ok(Result(primary, Task(DEPLOY), steps("unit", "record")))
    # A restore (rollback.yml) and a failure someone ignored are not verdicts.
    plan_callback.v2_runner_on_ok(Result(secondary, Task(DEPLOY, args={"restore": True}), {"changed": True, "restored": True}))
    plan_callback.v2_runner_on_failed(Result(secondary, Task("ansible.builtin.command"), {"msg": "ignored"}), ignore_errors=True)
    plan_callback.v2_runner_on_failed(Result(secondary, Task("frank.llm_fleet.vram_budget", f"{ROLE}/budget.yml:2"), {"msg": "shape does not fit lab-cpu"}))
    plan_callback.v2_playbook_on_stats(None)
    lines = plan_callback._display.lines
    assert lines[0] == "BANNER DEPLOY PLAN"
    assert lines[4:7] == [
        "frank-primary    shape change (restart)      changed: unit, record",
        "frank-secondary  refused by a gate (budget)  shape does not fit lab-cpu",
        "frank-large      pending                     never reached: the run stopped at frank-secondary",
    ]
    assert not any("lab-host1" in line for line in lines)


def test_the_callback_is_silent_for_a_run_that_deployed_nothing_and_under_a_json_stdout(plan_callback, monkeypatch):
    plan_callback.v2_playbook_on_play_start(Play([Host("frank-primary")]))
    plan_callback.v2_playbook_on_stats(None)
    assert plan_callback._display.lines == []
    plan_callback.v2_runner_on_ok(Result(Host("frank-primary"), Task(DEPLOY), steps()))
    monkeypatch.setattr(callback.C.config, "get_config_value", lambda name: "ansible.builtin.json" if name == "DEFAULT_STDOUT_CALLBACK" else None)
    plan_callback.v2_playbook_on_stats(None)
    assert plan_callback._display.lines == []
