"""The host modules' option specs (host/specs.py) and their documentation (doc_fragments/host_options.py)."""

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.doc_fragments.host_options import ModuleDocFragment
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import ENGINE_OPTIONS, PROBE_OPTIONS, UNIT_OPTIONS, with_defaults

SPEC_KEYS = ("type", "required", "default", "choices", "elements")


def spec_of(documented):
    """The argument spec a documented option list describes (no_log is not documentation)."""
    spec = {}
    for name, doc in documented.items():
        option = {key: doc[key] for key in SPEC_KEYS if key in doc and not (key == "required" and doc[key] is False)}
        if "suboptions" in doc:
            option["options"] = spec_of(doc["suboptions"])
        spec[name] = option
    return spec


def without_no_log(spec):
    return {name: {k: (without_no_log(v) if k == "options" else v) for k, v in option.items() if k != "no_log"} for name, option in spec.items()}


@pytest.mark.parametrize(("fragment", "spec"), [("ENGINE", ENGINE_OPTIONS), ("UNIT", UNIT_OPTIONS), ("PROBE", PROBE_OPTIONS)])
def test_each_shared_spec_equals_its_documented_form(fragment, spec):
    documented = yaml.safe_load(getattr(ModuleDocFragment, fragment))["options"]
    assert spec_of(documented) == without_no_log(spec)


@pytest.mark.parametrize(("option", "fragment"), [("engine", "ENGINE"), ("unit", "UNIT"), ("probe", "PROBE")])
def test_endpoint_deploy_documents_the_same_options_word_for_word(option, fragment):
    # ansible-test takes doc fragments as literals only, so DEPLOY repeats the three lists.
    suboptions = yaml.safe_load(ModuleDocFragment.DEPLOY)["options"][option]["suboptions"]
    assert suboptions == yaml.safe_load(getattr(ModuleDocFragment, fragment))["options"]


def test_defaults_fill_nested_options_the_way_ansible_does():
    unit = with_defaults(UNIT_OPTIONS, {"name": "x.service", "command": ["/bin/true"], "health": {"port": 7771}})
    assert unit["restart_sec"] == 5 and unit["timeout_start_sec"] == 900 and unit["enabled"] is True
    assert unit["health"] == {"port": 7771, "host": "127.0.0.1", "served_id": "", "container": "", "timeout": 300, "allowed_restarts": 0, "api_key": ""}
    # A default is a fresh copy: one caller's list cannot leak into the next.
    engine = with_defaults(ENGINE_OPTIONS, {"name": "e"})
    engine["ulimits"].append("nofile=1:1")
    assert with_defaults(ENGINE_OPTIONS, {"name": "e"})["ulimits"] == []
