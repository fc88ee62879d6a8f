"""The endpoint role's preflight (plugins/plugin_utils/endpoint_preflight.py), driven with plain
values through a fake of Ansible's variables: each problem names the field, the file and line that
set it and the fix, every problem is reported (not only the first), and the role's own values are
left alone. The action and the playbooks run it in tests/unit/test_user_mistakes.py."""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.plugin_utils import endpoint_preflight as pf

ROOT = Path(__file__).resolve().parents[2]
LLAMACPP = {"runtime": "llamacpp", "port": 8080, "model_file": "m.gguf", "ctx_size": 4096, "parallel": 1}
HOST_VARS = "inv/host_vars/my-llamacpp.yml"


class FakeVariables:
    """HostVariables over plain dicts: values as written, their places, the role's defaults."""

    def __init__(self, values: dict[str, Any], where: dict[str, str] | None = None, defaults: Iterable[str] = (), locked: Iterable[str] = ()):
        self.values = values
        self.places = where or {}
        self.defaults = set(defaults)
        self.vaulted = list(locked)

    def names(self):
        return self.values.keys()

    def raw(self, name):
        return self.values[name]

    def value(self, name):
        value = self.values[name]
        if isinstance(value, str) and value.startswith("{{"):
            raise ValueError(f"'{value[3:-3]}' is undefined")
        return value

    def where(self, name):
        return self.places.get(name)

    def origin(self, value):
        return self.places.get(f"value:{value}")

    def is_role_default(self, name):
        return name in self.defaults

    def locked(self, names):
        return [f"{name} ({self.places.get(name, '?')})" for name in names if name in self.vaulted]


def run(values, reads_secrets=False, neighbours=(), **kwargs):
    values = {"inventory_hostname": "my-llamacpp", "endpoint_shape": LLAMACPP, **values}
    return pf.preflight("my-llamacpp", FakeVariables(values, **kwargs), list(neighbours), reads_secrets)


def test_the_role_spec_knows_every_default_and_every_documented_name():
    spec = pf.load_role_spec()
    defaults = yaml.safe_load((ROOT / "roles" / "endpoint" / "defaults" / "main.yml").read_text())
    assert set(defaults) <= spec.known
    assert {"endpoint_api_key", "endpoint_secret_environment", "endpoint_budget_controller_only"} <= spec.known
    assert spec.options["endpoint_health_timeout"]["type"] == "int"


def test_a_misspelt_role_variable_is_named_with_its_file_and_the_closest_name():
    verdict = run({"endpoint_helth_timeout": 120}, where={"endpoint_helth_timeout": f"{HOST_VARS}:34"})
    assert verdict.problems == [
        f"endpoint_helth_timeout ({HOST_VARS}:34): not a variable of the endpoint role, so it would be ignored; "
        "did you mean endpoint_health_timeout? fix: rename it (every variable of the role and its form: roles/endpoint/README.md)"
    ]
    assert verdict.message("my-llamacpp").startswith("my-llamacpp: endpoint_helth_timeout (")


def test_a_name_far_from_any_is_refused_without_a_guess_and_a_moved_one_with_its_new_name():
    verdict = run({"endpoint_zzz": 1, "endpoint_unit_metrics": True})
    assert "not a variable of the endpoint role" in verdict.problems[1] and "did you mean" not in verdict.problems[1]
    assert verdict.problems[0].startswith("endpoint_unit_metrics: renamed to host_metrics_enabled")


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        (
            "endpoint_health_timeout",
            "soon",
            "'soon' is not a whole number; fix: write a whole number, e.g. endpoint_health_timeout: 600 (Seconds the health gate waits)",
        ),
        ("endpoint_probe", "maybe", "'maybe' is not true or false; fix: write true or false, e.g. endpoint_probe: true"),
        ("endpoint_gpu_facts_source", "nvidia", "'nvidia' is not one of auto, nvidia-smi, rocm-smi, sysfs"),
        ("endpoint_retired_units", {"old": "x"}, "is not a list of strings; fix: write a list of strings, e.g. endpoint_retired_units: []"),
        ("endpoint_container", ["runtime", "crun"], "is not a mapping"),
    ],
)
def test_a_value_of_the_wrong_form_names_the_field_its_file_and_the_accepted_form(name, value, said):
    verdict = run({name: value}, where={name: f"{HOST_VARS}:7"})
    assert len(verdict.problems) == 1, verdict.problems
    assert verdict.problems[0].startswith(f"{name} ({HOST_VARS}:7): ")
    assert said in verdict.problems[0]


TAKEN = [("endpoint_health_timeout", "120"), ("endpoint_probe", "yes"), ("endpoint_devices", "discover"), ("endpoint_retired_units", "old.service")]


@pytest.mark.parametrize(("name", "value"), TAKEN)
def test_what_ansibles_own_check_takes_passes(name, value):
    assert run({name: value}).ok


def test_the_roles_own_defaults_and_the_secrets_are_not_templated_here():
    # A role default with a template is the role's business; a vaulted secret is read only where a run needs it.
    values = {"endpoint_calibration_dir": "{{ nowhere }}", "endpoint_api_key": "{{ vaulted }}", "endpoint_hub_token": "{{ vaulted }}"}
    assert run(values, defaults=["endpoint_calibration_dir"]).ok


def test_a_template_that_cannot_be_resolved_is_named():
    verdict = run({"endpoint_image": "{{ no_such_var }}"}, where={"endpoint_image": f"{HOST_VARS}:3"})
    assert verdict.problems == [f"endpoint_image ({HOST_VARS}:3): cannot be read: 'no_such_var' is undefined"]


def test_every_problem_is_reported_not_only_the_first():
    verdict = run({"endpoint_helth_timeout": 1, "endpoint_probe": "maybe", "endpoint_shape": {**LLAMACPP, "ctx_sise": 1}, "bench_endpoints": ["x"]})
    assert len(verdict.problems) == 4, verdict.problems
    assert verdict.problems[0].startswith("bench_endpoints=['x'] is gone")
    assert any(problem.startswith("endpoint_shape.ctx_sise") and "did you mean ctx_size" in problem for problem in verdict.problems)
    assert len(verdict.message("my-llamacpp").splitlines()) == 4


def test_the_removed_roles_variables_are_each_renamed():
    verdict = run({"frank_primary_port": 1, "frank_secondary_name": "x", "frank_large_shape_defaults": {}})
    text = verdict.problems[0]
    assert text.startswith("the roles frank_primary, frank_secondary and frank_large are gone")
    assert "  frank_primary_port -> endpoint_port in host_vars/frank-primary.yml" in text
    assert "  frank_secondary_name -> the inventory hostname frank-secondary (endpoint_name defaults to it)" in text
    assert "  frank_large_shape_defaults -> served_id, port and bind written in endpoint_shape of host frank-large" in text


def test_a_shape_without_a_port_is_refused():
    shape = {key: value for key, value in LLAMACPP.items() if key != "port"}
    assert run({"endpoint_shape": shape}).problems == [pf.missing_port_problem("my-llamacpp")]


def test_two_endpoints_on_one_machine_and_port_name_both_files_and_lines():
    shape = {**LLAMACPP}
    others = [pf.Neighbour("my-vllm", "gpu-1", 8080, "inv/host_vars/my-vllm.yml:9"), pf.Neighbour("far", "gpu-2", 8080, "x:1")]
    verdict = run(
        {"endpoint_shape": shape, "ansible_host": "gpu-1"},
        neighbours=others,
        where={"value:8080": f"{HOST_VARS}:9"},
    )
    assert verdict.problems == [
        "port 8080 on gpu-1 is also the port of my-vllm (inv/host_vars/my-vllm.yml:9); "
        f"fix: give each endpoint on a machine its own port: endpoint_shape.port ({HOST_VARS}:9)."
    ]


def test_one_shape_given_to_every_endpoint_says_where_to_give_it_instead():
    problem = pf.port_clash_problem("a", "m", 8080, "<CLI -e>", [pf.Neighbour("b", "m", "8080", "<CLI -e>")])
    assert "also the port of b (<CLI -e>)" in problem and "give it in host_vars/a.yml instead" in problem


def test_the_vault_and_the_bind_policy_are_checked_only_where_the_run_reads_the_secrets():
    lan = {**LLAMACPP, "bind": "0.0.0.0"}
    values = {"endpoint_shape": lan, "endpoint_api_key": "sk-x", "endpoint_allowed_networks": [], "endpoint_lan_without_key": False}
    assert run(values, reads_secrets=False, locked=["endpoint_api_key"]).ok
    locked = run(values, reads_secrets=True, locked=["endpoint_api_key"], where={"endpoint_api_key": f"{HOST_VARS}:40"})
    assert locked.problems[0].startswith(f"endpoint_api_key ({HOST_VARS}:40) is vaulted and this run has no password")
    refused = run(values, reads_secrets=True)
    assert refused.problems and "endpoint_allowed_networks" in refused.problems[0], refused.problems
    admitted = run({**values, "endpoint_allowed_networks": ["10.0.0.0/24"]}, reads_secrets=True)
    assert admitted.ok and admitted.firewall == "LAN bind on port 8080: the firewall admits loopback, this host and 10.0.0.0/24"
    assert run({}, reads_secrets=True).firewall == "loopback bind: no firewall needed"
