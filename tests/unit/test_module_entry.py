"""module_entry.run_module: how every module reports its core's result or failure."""

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils import module_entry
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError


class Exited(Exception):
    pass


class FakeModule:
    """AnsibleModule as run_module uses it: the kwargs it was built with, what it warned, how it ended."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.params = {"name": "x"}
        self.check_mode = True
        self._diff = False
        self.warnings = []
        FakeModule.last = self

    def run_command(self, argv, **kwargs):
        raise AssertionError("check mode runs no change")

    def warn(self, warning):
        self.warnings.append(warning)

    def exit_json(self, **result):
        self.ended = ("exit", result)
        raise Exited

    def fail_json(self, **result):
        self.ended = ("fail", result)
        raise Exited


class CoreError(Exception):
    pass


def run(core, **kwargs):
    with pytest.raises(Exited):
        module_entry.run_module({"name": {"type": "str"}}, core, **kwargs)
    return FakeModule.last


@pytest.fixture(autouse=True)
def fake_module(monkeypatch):
    monkeypatch.setattr(module_entry, "AnsibleModule", FakeModule)


def test_the_core_result_is_the_exit_and_its_warnings_go_through_warn():
    module = run(lambda call: {"changed": False, "name": call.params["name"], "warnings": ["careful"]}, required_if=[("a", "b", ["c"])])
    assert module.kwargs == {"argument_spec": {"name": {"type": "str"}}, "supports_check_mode": True, "required_if": [("a", "b", ["c"])]}
    assert module.ended == ("exit", {"changed": False, "name": "x"})
    assert module.warnings == ["careful"]


def test_a_step_error_fails_with_what_it_gathered():
    def core(call):
        raise StepError("refused", {"changed": False, "journal": ["line"], "warnings": ["w"]})

    module = run(core)
    assert module.ended == ("fail", {"msg": "refused", "changed": False, "journal": ["line"]})
    assert module.warnings == ["w"]


def test_a_named_error_class_fails_with_its_message_and_any_other_propagates():
    def core(call):
        raise CoreError("bad input")

    assert run(core, errors=(CoreError,)).ended == ("fail", {"msg": "bad input"})
    with pytest.raises(CoreError):
        module_entry.run_module({}, core)


def test_the_call_gives_one_host_in_the_modules_check_mode():
    seen = []
    run(lambda call: seen.append((call.host, call.host, call.check_mode, call.diff)) or {"changed": False})
    first, second, check_mode, diff = seen[0]
    assert first is second and first.check_mode is True and (check_mode, diff) == (True, False)
