"""Root units: a unit name that is a path, and unit fields that carry a line break, are refused
before anything is read, written or started (README.md, "Root units")."""

import pytest
from fake_host import SYSTEMCTL, FakeRunner, show

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.systemd_unit import UnitError, UnitSpec, render_unit
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_step import ensure_unit, remove_unit
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

INSTALLED = {(SYSTEMCTL, "show"): [show(LoadState="loaded", ActiveState="active", UnitFileState="enabled")]}


@pytest.fixture
def layout(tmp_path):
    """A unit directory, an env directory, and a victim file beside them that no unit owns."""
    (tmp_path / "units").mkdir()
    (tmp_path / "env").mkdir()
    victim = tmp_path / "victim" / "file"
    victim.parent.mkdir()
    victim.write_text("SECRET-TOKEN=hunter2\n")
    return tmp_path, victim


def params(tmp_path, **overrides):
    return {
        "name": "lab.service",
        "command": ["/usr/bin/python3", "-m", "http.server"],
        "unit_dir": str(tmp_path / "units"),
        "env_dir": str(tmp_path / "env"),
        **overrides,
    }


# Names that reach outside the unit directory, or are no service unit name by systemd's rules.
PATH_NAMES = [
    "../victim/file",
    "../victim/x.service",
    "/etc/passwd",
    "a/b.service",
    "..service",
    "x..service",
    ".hidden.service",
    "@.service",
    "a@b@c.service",
    "ok.socket",
    "x" * 248 + ".service",
    "a\nb.service",
]


@pytest.mark.parametrize("name", PATH_NAMES)
@pytest.mark.parametrize("check_mode", [False, True])
def test_absent_with_a_path_as_name_touches_nothing(layout, name, check_mode):
    tmp_path, victim = layout
    runner = FakeRunner(INSTALLED)
    host = Host(runner, check_mode=check_mode)
    with pytest.raises(StepError, match="^name: ") as refused:
        remove_unit(params(tmp_path, name=name, state="absent"), host)
    assert victim.read_text() == "SECRET-TOKEN=hunter2\n"
    assert "hunter2" not in str(refused.value) and "hunter2" not in repr(refused.value.result)
    assert host.actions == [] and runner.calls == []


def test_absent_diff_never_shows_a_file_outside_the_unit_directory(layout):
    """check mode + diff printed the victim's contents as the unit's "before" (today's finding)."""
    tmp_path, _victim = layout
    with pytest.raises(StepError) as refused:
        remove_unit(params(tmp_path, name="../victim/file", state="absent"), Host(FakeRunner(INSTALLED), check_mode=True))
    assert "diff" not in refused.value.result


@pytest.mark.parametrize("state", ["started", "stopped"])
@pytest.mark.parametrize("check_mode", [False, True])
def test_started_and_stopped_with_a_path_as_name_touch_nothing(layout, state, check_mode):
    tmp_path, victim = layout
    runner = FakeRunner(INSTALLED)
    host = Host(runner, check_mode=check_mode)
    with pytest.raises(StepError, match="^name: "):
        ensure_unit(params(tmp_path, name="../victim/x.service", state=state), host, diff=True)
    assert victim.read_text() == "SECRET-TOKEN=hunter2\n" and not (tmp_path / "victim" / "x.service").exists()
    assert host.actions == [] and runner.calls == []


@pytest.mark.parametrize(("option", "value"), [("unit_dir", "units"), ("env_dir", "env"), ("unit_dir", "/etc/../tmp"), ("env_dir", "")])
@pytest.mark.parametrize("state", ["started", "absent"])
def test_directories_must_be_absolute(layout, option, value, state):
    tmp_path, _victim = layout
    step = remove_unit if state == "absent" else lambda p, h: ensure_unit(p, h, diff=False)
    with pytest.raises(StepError, match=f"^{option}: give an absolute directory"):
        step(params(tmp_path, state=state, **{option: value}), Host(FakeRunner(INSTALLED)))


def test_a_valid_template_instance_name_is_accepted(layout):
    tmp_path, _victim = layout
    result = ensure_unit(
        params(tmp_path, name="frank-engine@gpu0.service"),
        Host(FakeRunner({(SYSTEMCTL, "show"): [show(LoadState="not-found", ActiveState="inactive")]})),
        diff=False,
    )
    assert result["unit_path"] == f"{tmp_path}/units/frank-engine@gpu0.service"


# A line break in a field ends the line in systemd's parser (\n, \r and NUL all do), so the rest
# becomes a directive of its own; a trailing backslash swallows the next line.
INJECT = "\rExecStartPre=/bin/touch /tmp/pwned"


@pytest.mark.parametrize(
    ("field", "overrides"),
    [
        ("description", {"description": "frank" + INJECT}),
        ("description", {"description": "frank\\"}),
        ("user", {"user": "llm" + INJECT}),
        ("user", {"user": "llm\\"}),
        ("group", {"group": "llm\nExecStartPre=/bin/true"}),
        ("working_directory", {"working_directory": "/srv" + INJECT}),
        ("extra_service.Nice", {"extra_service": {"Nice": "5" + INJECT}}),
        ("extra_service.Nice", {"extra_service": {"Nice": "5\x0bx"}}),
        ("extra_service", {"extra_service": {"Nice\rExecStartPre": "/bin/true"}}),
        ("extra_service", {"extra_service": {"Exec Start": "/bin/true"}}),
        ("pre_start[0]", {"pre_start": [["/bin/echo", "a\x1bb"]]}),
        ("stop_command", {"stop_command": ["/bin/kill", "\t-TERM"]}),
        ("read_write_paths[0]", {"read_write_paths": ["/var/cache/x" + INJECT]}),
        ("read_write_paths[0]", {"read_write_paths": ["var/cache/x"]}),
    ],
)
def test_a_line_break_in_any_unit_field_is_refused_by_name(layout, field, overrides):
    tmp_path, _victim = layout
    host = Host(FakeRunner(INSTALLED))
    with pytest.raises(StepError) as refused:
        ensure_unit(params(tmp_path, **overrides), host, diff=True)
    assert str(refused.value).startswith(f"{field}: "), str(refused.value)
    assert host.actions == []


@pytest.mark.parametrize("option", ["environment", "secret_environment"])
@pytest.mark.parametrize("value", ["hunter2\nExecStartPre=/bin/true", "hunter2\rX", "hunter2\0"])
def test_an_environment_value_with_a_line_break_is_refused_naming_only_its_key(layout, option, value):
    tmp_path, _victim = layout
    with pytest.raises(StepError) as refused:
        ensure_unit(params(tmp_path, **{option: {"API_TOKEN": value}}), Host(FakeRunner(INSTALLED)), diff=True)
    assert "API_TOKEN" in str(refused.value)
    assert "hunter2" not in str(refused.value) and "hunter2" not in repr(refused.value.result)


def test_an_environment_key_with_a_line_break_is_refused(layout):
    tmp_path, _victim = layout
    with pytest.raises(StepError, match="^environment: .* is not a valid variable name"):
        ensure_unit(params(tmp_path, environment={"X\nExecStartPre": "1"}), Host(FakeRunner(INSTALLED)), diff=False)


def test_the_unit_model_refuses_a_line_break_without_the_steps():
    """render_unit is the last line: the model refuses what a direct caller passes."""
    with pytest.raises(UnitError, match="^description: control characters"):
        render_unit(UnitSpec("lab.service", ["/bin/true"], description="x" + INJECT))
    with pytest.raises(UnitError, match=r"^after\[0\]: control characters"):
        render_unit(UnitSpec("lab.service", ["/bin/true"], after=["network.target\nExecStartPre=/bin/true"]))
