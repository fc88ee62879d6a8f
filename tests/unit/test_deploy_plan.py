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

    def __init__(self, hosts, name="Deploy llm_endpoints", uuid=None):
        self.variable_manager = VariableManager(hosts)
        self.name = name
        self._uuid = uuid or name

    def get_name(self):
        return self.name

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


class Playbook:
    def __init__(self, plays):
        self.plays = plays

    def get_plays(self):
        return self.plays


def test_a_stopped_unit_started_with_its_shape_unchanged_is_started_not_a_shape_change():
    assert deploy_verdict(steps("unit", unit={"restarted": True, "started_from": "inactive"})) == ("started", "the unit was inactive; shape unchanged")
    # A start that came with a changed file is still a shape change.
    assert deploy_verdict(steps("engine", "unit", unit={"started_from": "failed"}))[0] == "shape change (restart)"


def test_a_validation_failure_names_its_fields():
    plan = DeployPlan()
    errors = ["endpoint_shape.ctx_sise. Supported parameters include: ctx_size, ..."]
    result = {"msg": "Validation of arguments failed:\n" + errors[0], "argument_errors": errors, "failed": True}
    name = "endpoint : Validating arguments against arg spec main"
    plan.failed("frank-secondary", "ansible.builtin.validate_argument_spec", f"{ROLE}/main.yml:1", name, result)
    row = plan.rows()[0]
    assert row.verdict == "refused by a gate (argument_specs)"
    assert row.detail.startswith("endpoint_shape.ctx_sise") and row.detail != "Validation of arguments failed:"


def test_every_play_is_listed_a_failed_companion_too_and_the_plays_never_reached(plan_callback):
    relay = Host("webhook-relay", groups=("webhook_relays",))
    searx = Host("searxng", groups=("searxng_services",))
    plays = [
        Play([Host("frank-primary"), Host("frank-secondary")], "Deploy llm_endpoints"),
        Play([relay], "Deploy the webhook relay"),
        Play([searx], "Deploy the search settings"),
        Play([], "Deploy the homepage"),
    ]
    plan_callback.v2_playbook_on_start(Playbook(plays))
    plan_callback.v2_playbook_on_play_start(plays[0])
    plan_callback.v2_runner_on_ok(Result(Host("frank-primary"), Task(DEPLOY), steps()))
    plan_callback.v2_runner_on_ok(Result(Host("frank-secondary"), Task(DEPLOY), steps()))
    plan_callback.v2_playbook_on_play_start(plays[1])
    install = Task("ansible.builtin.copy", "/r/webhook_relay/tasks/present.yml:3", "webhook_relay : Install")
    plan_callback.v2_runner_on_ok(Result(relay, install, {"changed": True}))
    plan_callback.v2_playbook_on_play_start(plays[2])
    failure = {"msg": "Could not find the requested service llm-fleet-lab-searx.service: host"}
    restart = Task("ansible.builtin.systemd_service", "/r/searxng/tasks/main.yml:9", "searxng : Restart the search service")
    plan_callback.v2_runner_on_failed(Result(searx, restart, failure))
    plan_callback.v2_playbook_on_stats(None)
    lines = plan_callback._display.lines
    # Today's run ended rc=2 with a table reading "2 unchanged": the failed companion play is named.
    assert "2 unchanged" in lines
    assert lines[lines.index("2 unchanged") + 2 :] == [
        "play                        outcome      detail",
        "Deploy llm_endpoints        ok",
        "Deploy the webhook relay    changed      webhook-relay",
        "Deploy the search settings  failed       searxng: Restart the search service: Could not find the requested service llm-fleet-lab-searx.service: host",
        "Deploy the homepage         not reached  the run stopped before this play",
        "",
        "1 ok, 1 changed, 1 failed, 1 not reached",
    ]


def test_a_rolled_back_endpoint_and_one_skipped_for_it_and_the_bookkeeping_failure(plan_callback):
    primary, secondary, large = Host("frank-primary"), Host("frank-secondary"), Host("frank-large")
    plan_callback.v2_playbook_on_play_start(Play([primary, secondary, large]))
    rolled = {"msg": "the new shape failed (health: unit exited). The last-known-good shape is serving again.", "rolled_back": True, "health": {}}
    plan_callback.v2_runner_on_failed(Result(primary, Task(DEPLOY), rolled))
    # The endpoint that depends on frank-primary is skipped, the next one deploys.
    fact = {"ansible_facts": {"__fleet_not_reached": "depends on frank-primary, which failed"}, "changed": False}
    plan_callback.v2_runner_on_ok(Result(secondary, Task("ansible.builtin.set_fact", f"{ROLE}/fleet_blocked.yml:3"), fact))
    plan_callback.v2_runner_on_ok(Result(large, Task(DEPLOY), steps("unit", "record")))
    # The run's verdict at the end fails the endpoint's host again: not a new outcome.
    plan_callback.v2_runner_on_failed(Result(primary, Task("ansible.builtin.fail", f"{ROLE}/fleet_verdict.yml:2"), {"msg": "frank-primary failed"}))
    plan_callback.v2_playbook_on_stats(None)
    lines = plan_callback._display.lines
    assert lines[4:7] == [
        "frank-primary    rolled back             health: the new shape failed (health: unit exited). The last-known-good shape is serving again.",
        "frank-secondary  not reached             depends on frank-primary, which failed",
        "frank-large      shape change (restart)  changed: unit, record",
    ]


BUDGET = "frank.llm_fleet.vram_budget"
MIB = 2**20


def priced(fits=True, free_mib=(3_140, 900), identity=True):
    ledger = [
        {"device": f"gpu{index}", "capacity_bytes": 24_576 * MIB, "used_bytes": (24_576 - free) * MIB, "free_bytes": free * MIB}
        for index, free in enumerate(free_mib)
    ]
    rules = [{"rule": "free_floor", "ok": fits, "message": "gpu1: 900.0 MiB free < floor 1,536.0 MiB"}]
    return {"changed": False, "fits": fits, "ledger": ledger, "rules": rules, "payload_identity": {"checked": identity}}


def test_a_run_that_only_priced_is_a_fleet_plan_naming_every_endpoint(plan_callback):
    zealot, dragoon, archon = Host("frank-zealot"), Host("frank-dragoon"), Host("frank-archon")
    plan_callback.v2_playbook_on_play_start(Play([archon, zealot, dragoon], "Plan llm_endpoints"))
    refusal = {"msg": "payload identity: model_file: 'm.ggfu' is not in the manifest; did you mean 'm.gguf'?"}
    plan_callback.v2_runner_on_failed(Result(archon, Task(BUDGET, f"{ROLE}/budget.yml:30", "endpoint : Price per device"), refusal))
    plan_callback.v2_runner_on_ok(Result(zealot, Task(BUDGET, f"{ROLE}/budget.yml:30"), priced()))
    plan_callback.v2_runner_on_ok(Result(dragoon, Task(BUDGET, f"{ROLE}/budget.yml:30"), priced(fits=False, identity=False)))
    plan_callback.v2_playbook_on_stats(None)
    lines = plan_callback._display.lines
    assert lines[:2] == ["BANNER FLEET PLAN", "Fleet plan (priced only: nothing was changed)"]
    assert lines[4:7] == [
        "frank-archon   refused by a gate (budget)  payload identity: model_file: 'm.ggfu' is not in the manifest; did you mean 'm.gguf'?",
        # The tightest device of each: gpu1, 900 MiB free.
        "frank-zealot   fits                        gpu1: 23,676.0 of 24,576.0 MiB, 900.0 free; payload identity checked",
        "frank-dragoon  does not fit                free_floor: gpu1: 900.0 MiB free < floor 1,536.0 MiB; gpu1: 23,676.0 of 24,576.0 MiB, 900.0 free; "
        "payload identity not checked",
    ]


def test_a_deploy_after_the_budget_replaces_the_priced_verdict(plan_callback):
    secondary = Host("frank-secondary")
    plan_callback.v2_playbook_on_play_start(Play([secondary]))
    plan_callback.v2_runner_on_ok(Result(secondary, Task(BUDGET, f"{ROLE}/budget.yml:30"), priced()))
    plan_callback.v2_runner_on_ok(Result(secondary, Task(DEPLOY), steps("unit", "record")))
    plan_callback.v2_playbook_on_stats(None)
    lines = plan_callback._display.lines
    assert lines[0] == "BANNER DEPLOY PLAN"
    assert lines[4] == "frank-secondary  shape change (restart)  changed: unit, record"


def test_a_refusal_by_the_budget_file_s_own_checks_is_the_budget_gate():
    plan = DeployPlan()
    name = "endpoint : The plan can price this endpoint on the controller - frank-zealot"
    plan.failed("frank-zealot", "ansible.builtin.assert", f"{ROLE}/budget.yml:5", name, {"msg": "frank-zealot: a fleet plan never contacts dankclaw"})
    assert plan.rows()[0].verdict == "refused by a gate (budget)"
