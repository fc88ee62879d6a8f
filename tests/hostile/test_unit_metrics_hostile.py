"""Unit names and the textfile directory reach a shell (the host_metrics role's no-op probe runs
through ansible.builtin.raw) and an unquoted ExecStart line: a value that would need quoting is
refused before any command or file exists."""

import os

import pytest
from fake_host import FakeRunner

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_metrics import current_probe, ensure_unit_metrics
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

HOSTILE = [
    ("units", ["x.service; reboot"], "units: 'x.service; reboot' is not a unit name"),
    ("units", ["$(id).service"], "units: '$(id).service' is not a unit name"),
    ("units", ["a b.service"], "units: 'a b.service' is not a unit name"),
    ("units", ["x.service\nExecStartPre=/bin/sh"], "is not a unit name"),
    ("units", ["frank-secondary"], "give each endpoint's unit as NAME.service"),
    ("textfile_dir", "/var/lib/`id`", "textfile_dir: '/var/lib/`id`' must be an absolute path"),
    ("textfile_dir", "/tmp/x;rm -rf /", "textfile_dir"),
    ("textfile_dir", "relative/dir", "textfile_dir: 'relative/dir' must be an absolute path"),
]


@pytest.mark.parametrize(("field", "value", "named"), HOSTILE)
def test_a_value_that_would_need_quoting_is_refused_before_any_command_or_file(tmp_path, field, value, named):
    params = {"units": ["frank-secondary.service"], "textfile_dir": "/var/lib/prometheus/node-exporter"}
    params.update({"unit_dir": str(tmp_path / "units"), "lib_dir": str(tmp_path / "lib"), field: value})
    with pytest.raises(StepError) as probe_refused:
        current_probe(params["units"], params["textfile_dir"], params["unit_dir"], params["lib_dir"])
    assert named in str(probe_refused.value)
    runner = FakeRunner()
    with pytest.raises(StepError) as install_refused:
        ensure_unit_metrics(params, Host(runner), diff=False)
    assert named in str(install_refused.value)
    assert runner.calls == [] and not os.path.exists(params["unit_dir"]) and not os.path.exists(params["lib_dir"])
