"""The parts playbooks/qualify.yml drives (plugins/module_utils/qualify): a rung judged from what
the playbook measured and the next value named, the result files and their reader, the full client
contract the probe loads, and the dead-man's switch's host steps in order. Expected values are
written out by hand."""

from __future__ import annotations

import json

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify import deadman, probe, results
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

LADDER = {"key": "context", "ceiling": 81920, "floor": 8192, "step": 16384, "bonus": 4096, "align": 2048}
SHAPE = {"runtime": "llamacpp", "launch": "podman", "port": 7771, "model_file": "tiny.gguf", "ctx_size": 8192, "parallel": 2}
GOOD_PROBE = {
    "slots": 2,
    "answered": 2,
    "past_window_refused": True,
    "streams": 2,
    "decoding_together": 2,
    "tokens": 65536,
    "decode_tps": 88.5,
    "free_at_boot": {"host": 3 << 30},
    "free_under_probe": {"host": 2 << 30},
}


def test_the_playbook_steps_the_fleet_ladder_one_rung_at_a_time():
    first = results.step(LADDER, [])
    assert (first["key"], first["next"], first["rungs"], first["max_rungs"]) == ("ctx_size", 81920, [], 12)
    capped = {**GOOD_PROBE, "answered": 0, "tokens": 0, "errors": ["HTTP 400: the request exceeds the available context size"]}
    # A playbook passes yes/no as text when templated: "False" must read as false.
    second = results.step(LADDER, first["rungs"], {"value": 81920, "fits": "True", "booted": "True", "probe": capped})
    assert second["rungs"][0]["verdict"] == "probe_failed"
    assert second["rungs"][0]["why"] == ("0 of 2 full-window requests answered; the engine said: HTTP 400: the request exceeds the available context size")
    assert second["next"] == 65536
    third = results.step(LADDER, second["rungs"], {"value": 65536, "fits": True, "booted": True, "probe": GOOD_PROBE})
    assert third["rungs"][1]["concurrency"] == [2, 2] and third["next"] == 69632 and third["answer"] == 65536
    refused = results.step(LADDER, third["rungs"], {"value": 69632, "fits": "False", "booted": False, "why": "kv over lab-cpu by 12 MiB"})
    assert refused["rungs"][2]["verdict"] == "refused"
    assert refused["rungs"][2]["why"].endswith(": kv over lab-cpu by 12 MiB")
    assert refused["next"] is None and refused["answer"] == 65536


def test_a_rung_without_its_gate_answer_is_refused_naming_the_field():
    with pytest.raises(results.LadderError, match="'fits' is missing"):
        results.step(LADDER, [], {"value": 81920})


def test_the_result_files_are_written_and_read_back(tmp_path):
    rungs = results.step(LADDER, [], {"value": 81920, "fits": True, "booted": False, "why": "health gate timed out"})["rungs"]
    rungs = results.step(LADDER, rungs, {"value": 65536, "fits": True, "booted": True, "probe": GOOD_PROBE})["rungs"]
    out = results.write(str(tmp_path), "frank-secondary", {**LADDER, "ceiling_reason": "n_ctx_train"}, SHAPE, rungs, {"restore_s": 3.2})
    assert out["answer"] == 65536 and out["rungs"] == 2
    assert yaml.safe_load((tmp_path / "frank-secondary.recommended.yml").read_text()) == {"endpoint_shape": {**SHAPE, "ctx_size": 65536}}
    lines = (tmp_path / "frank-secondary.qualify.txt").read_text().splitlines()
    assert lines[1].split()[:3] == ["1", "81,920", "boot_failed"]
    assert lines[2].split()[:8] == ["2", "65,536", "passed", "host=3,072", "host=2,048", "65,536", "2/2", "88.5"]
    back = results.read(str(tmp_path), "frank-secondary")
    assert back["answer"] == 65536 and back["timing"] == {"restore_s": 3.2} and back["table"] == out["table"]
    assert back["snippet"].startswith("# frank-secondary: ctx_size 65536 qualified in 2 rungs")


def test_the_reader_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(results.ResultsError, match="run playbooks/qualify.yml --limit frank-secondary"):
        results.read(str(tmp_path), "frank-secondary")
    (tmp_path / "frank-secondary.qualify.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(results.ResultsError, match="frank-secondary.qualify.json: not a qualification result of format 1"):
        results.read(str(tmp_path), "frank-secondary")


def test_the_contract_is_the_clients_own_max_tokens_at_the_windows_limit():
    # 65536 over 2 slots: a ceiling of 32768 per request; the client's gap for that window is
    # 32768 * 45056 / 200704 = 7356, in 256s 7168: its maxTokens. Prompt + completion = 32768.
    terms = probe.contract(parse_shape({**SHAPE, "ctx_size": 65536, "client_sampler": {"temperature": 0.6, "top_p": 0.95}}, "frank-secondary"))
    assert (terms.ceiling, terms.slots, terms.max_tokens, terms.prompt_tokens) == (32768, 2, 7168, 25600)
    assert terms.sampling == {"temperature": 0.6, "top_p": 0.95}
    bounded = probe.contract(parse_shape({**SHAPE, "ctx_size": 65536, "client_max_tokens": 40000}, "frank-secondary"))
    assert (bounded.max_tokens, bounded.prompt_tokens) == (32767, 1)
    assert probe.contract(parse_shape({**SHAPE, "ctx_size": 65536}, "x"), max_tokens=64).prompt_tokens == 32704


class Recorder:
    """A host whose commands succeed, except those answering `fail` (argv[0] and argv[1])."""

    def __init__(self, fail: dict[tuple[str, str], int] | None = None) -> None:
        self.ran: list[list[str]] = []
        self.fail = fail or {}

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.ran.append(argv)
        return self.fail.get((argv[0], argv[1]), 0), "", "boom"


def test_the_switch_is_armed_again_from_scratch_and_removed_after(tmp_path):
    switch = deadman.DeadMan("frank-secondary.service", 30, str(tmp_path))
    (tmp_path / "frank-secondary.service.qualify-last-good").write_text("[Service]\n")
    run = Recorder()
    deadman.apply(Host(run), switch, "armed")
    assert [argv[:2] for argv in run.ran] == [["systemctl", "stop"], ["systemctl", "reset-failed"], ["systemd-run", "--unit=frank-secondary-qualify-deadman"]]
    run.ran.clear()
    deadman.apply(Host(run), switch, "absent")
    assert [argv[:2] for argv in run.ran] == [["systemctl", "stop"], ["systemctl", "reset-failed"]]
    assert not (tmp_path / "frank-secondary.service.qualify-last-good").exists()


def test_the_switch_refuses_to_save_over_an_open_window_and_to_arm_without_a_copy(tmp_path):
    switch = deadman.DeadMan("frank-secondary.service", 30, str(tmp_path))
    with pytest.raises(StepError, match="an earlier qualification window of frank-secondary.service is still open"):
        deadman.apply(Host(Recorder()), switch, "saved")  # is-active answers 0: the timer is armed
    with pytest.raises(StepError, match=r"qualify-last-good is missing: save the unit \(state: saved\)"):
        deadman.apply(Host(Recorder()), switch, "armed")
    saving = Recorder({("systemctl", "is-active"): 3})
    deadman.apply(Host(saving), switch, "saved")
    assert saving.ran[-1][0] == "/bin/cp"
    with pytest.raises(StepError, match="systemctl restart frank-secondary.service exited 1"):
        deadman.apply(Host(Recorder({("/bin/systemctl", "restart"): 1})), switch, "restored")
