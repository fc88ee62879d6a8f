"""The host modules' option specs (host/specs.py) and the documentation generated from them
(doc_fragments/host_options.py, written by scripts/gen_host_docs.py)."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.doc_fragments.host_options import ModuleDocFragment
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import (
    DEPLOY_OPTIONS,
    ENGINE_OPTIONS,
    PROBE_OPTIONS,
    UNIT_OPTIONS,
    argument_spec,
    with_defaults,
)

ROOT = Path(__file__).resolve().parents[2]
SPEC_KEYS = ("type", "required", "default", "choices", "elements")


def test_the_doc_fragment_is_current():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_host_docs.py"), "--check"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr  # names the command that regenerates it


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


@pytest.mark.parametrize(("fragment", "options"), [("ENGINE", ENGINE_OPTIONS), ("UNIT", UNIT_OPTIONS), ("PROBE", PROBE_OPTIONS), ("DEPLOY", DEPLOY_OPTIONS)])
def test_each_fragment_documents_the_argument_spec_the_modules_take(fragment, options):
    documented = yaml.safe_load(getattr(ModuleDocFragment, fragment))["options"]
    assert spec_of(documented) == without_no_log(argument_spec(options))


def test_the_argument_spec_carries_no_help():
    def helpless(spec):
        return all("description" not in option and helpless(option.get("options", {})) for option in spec.values())

    assert helpless(argument_spec(DEPLOY_OPTIONS))
    assert argument_spec(UNIT_OPTIONS)["description"] == {"type": "str", "default": ""}  # the unit's own Description= option stays


def test_defaults_fill_nested_options_the_way_ansible_does():
    unit = with_defaults(UNIT_OPTIONS, {"name": "x.service", "command": ["/bin/true"], "health": {"port": 7771}})
    assert unit["restart_sec"] == 5 and unit["timeout_start_sec"] == 900 and unit["enabled"] is True
    expected = {"port": 7771, "host": "127.0.0.1", "served_id": "", "container": "", "timeout": 300, "allowed_restarts": 0, "api_key": ""}
    assert unit["health"] == {**expected, "drain_timeout": 60, "drain_api_key": "", "drain_force": False}
    # A default is a fresh copy: one caller's list cannot leak into the next.
    engine = with_defaults(ENGINE_OPTIONS, {"name": "e"})
    engine["ulimits"].append("nofile=1:1")
    assert with_defaults(ENGINE_OPTIONS, {"name": "e"})["ulimits"] == []
