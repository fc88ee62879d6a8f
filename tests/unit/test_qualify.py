"""The qualification ladder (plugins/module_utils/qualify): the two searches driven against a
hidden largest-passing value, the verdict rules, the result table, the inventory snippet and the
dead-man's switch's argv. Expected values are written out by hand from the seed stories."""

from __future__ import annotations

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify import deadman, ladder, verdicts


def climb(search: ladder.Search, largest_passing: int, refused_above: int | None = None) -> list[tuple[int, str]]:
    """Run the search against an endpoint whose largest passing value is known to the test."""
    history: list[tuple[int, str]] = []
    while (value := ladder.next_value(search, history)) is not None:
        if refused_above is not None and value > refused_above:
            history.append((value, "refused"))
        else:
            history.append((value, "passed" if value <= largest_passing else "boot_failed"))
    return history


def test_the_night_ladder_of_seed_000():
    # 262144 and 245760 failed, 229376 passed, the +4096 bonus rung passed too: the fleet's method
    # with a 16k step. (The seed's own third rung was 237568, a step of 8192; here the step is fixed.)
    search = ladder.Search(key="ctx_size", ceiling=262144, floor=32768, step=16384, bonus=4096)
    history = climb(search, largest_passing=241664)
    assert history == [(262144, "boot_failed"), (245760, "boot_failed"), (229376, "passed"), (233472, "passed")]
    assert ladder.answer(history) == 233472


def test_step_search_stops_after_a_failed_bonus_rung():
    search = ladder.Search(key="ctx_size", ceiling=65536, floor=8192, step=16384, bonus=4096)
    history = climb(search, largest_passing=50000)
    assert history == [(65536, "boot_failed"), (49152, "passed"), (53248, "boot_failed")]
    assert ladder.answer(history) == 49152


def test_bisection_narrows_to_the_resolution():
    search = ladder.Search(key="ctx_size", ceiling=65536, floor=4096, method="bisect", resolution=2048, align=1024)
    # mid of 34816..41984 is 38400, aligned down to 1024: 37888; then 37888..41984 -> 39936; the
    # last gap (2048) is the resolution.
    history = climb(search, largest_passing=40000)
    assert [value for value, _verdict in history] == [65536, 34816, 50176, 41984, 37888, 39936]
    assert ladder.answer(history) == 39936


def test_a_passing_ceiling_ends_the_ladder_in_one_rung():
    search = ladder.Search(key="ctx_size", ceiling=32768, floor=4096)
    assert climb(search, largest_passing=10**9) == [(32768, "passed")]


def test_gate_refusals_are_failures_that_cost_no_boot():
    search = ladder.Search(key="ctx_size", ceiling=65536, floor=8192, step=16384, bonus=4096)
    history = climb(search, largest_passing=10**9, refused_above=40000)
    assert history == [(65536, "refused"), (49152, "refused"), (32768, "passed"), (36864, "passed")]


def test_nothing_passes_down_to_the_floor():
    search = ladder.Search(key="ctx_size", ceiling=40960, floor=8192, step=16384)
    history = climb(search, largest_passing=0)
    assert [value for value, _verdict in history] == [40960, 24576, 8192]
    assert ladder.answer(history) is None


def test_the_rung_budget_caps_the_ladder():
    search = ladder.Search(key="ctx_size", ceiling=262144, floor=4096, step=4096, max_rungs=3)
    assert len(climb(search, largest_passing=1000)) == 3


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"key": "context", "ceiling": 8192}, "'floor' is missing"),
        ({"key": "context", "ceiling": 8192, "floor": 16384}, "lower the floor"),
        ({"key": "context", "ceiling": 8192, "floor": 1024, "stpe": 1}, "unknown field(s) stpe"),
        ({"key": "context", "ceiling": "lots", "floor": 1024}, "'ceiling' must be a whole number"),
        ({"key": "context", "ceiling": 8192, "floor": 1024, "method": "guess"}, "use one of step, bisect"),
        ({"key": "context", "ceiling": 8192, "floor": 1024, "step": 1024, "bonus": 1024}, "'bonus' (1024) must be below 'step'"),
    ],
)
def test_bad_settings_name_the_field_and_the_fix(settings, words):
    with pytest.raises(ladder.LadderError) as error:
        ladder.Search.from_settings(settings, source="-e qualify_ladder")
    assert words in str(error.value) and "-e qualify_ladder" in str(error.value)


def test_the_issue_words_map_to_shape_keys():
    assert ladder.Search.from_settings({"key": "context", "ceiling": "8192", "floor": 1024}).key == "ctx_size"
    assert ladder.Search.from_settings({"key": "slots", "ceiling": 8, "floor": 1}).key == "parallel"


def test_verdicts_in_order_gate_boot_probe():
    good = {"slots": 2, "answered": 2, "past_window_refused": True, "streams": 2, "decoding_together": 2}
    assert verdicts.judge(False, False, None)[0] == "refused"
    assert verdicts.judge(True, False, None)[0] == "boot_failed"
    assert verdicts.judge(True, True, good)[0] == "passed"
    verdict, why = verdicts.judge(True, True, {**good, "answered": 1, "past_window_refused": False})
    assert verdict == "probe_failed"
    assert why == "1 of 2 full-window requests answered; a prompt past the window was not refused"
    assert verdicts.judge(True, True, {**good, "decoding_together": 1}) == ("probe_failed", "1 of 2 streams decoded together")


def test_the_table_has_a_line_per_rung_with_its_figures():
    rungs = [
        verdicts.Rung(1, 65536, "refused", "gate"),
        verdicts.Rung(2, 32768, "passed", "ok", {"lab-cpu": 1536 << 20}, {"lab-cpu": 1024 << 20}, 32768, (2, 2), 41.25),
    ]
    lines = verdicts.table(rungs).splitlines()
    assert len(lines) == 3
    assert lines[0].split()[:3] == ["rung", "value", "verdict"]
    assert lines[1].split()[:3] == ["1", "65,536", "refused"]
    assert lines[2].split() == ["2", "32,768", "passed", "lab-cpu=1,536", "lab-cpu=1,024", "32,768", "2/2", "41.2", "ok"]


def test_the_snippet_is_the_shape_with_the_qualified_value_and_reads_as_yaml():
    shape = {"runtime": "llamacpp", "ctx_size": 8192, "parallel": 2, "free_floor": "256 MiB", "extra_args": ["--log-verbosity", "4"]}
    text = verdicts.snippet("frank-secondary", shape, "ctx_size", 32768, 3, "the model's trained window (n_ctx_train 32768)")
    assert text.startswith("# frank-secondary: ctx_size 32768 qualified in 3 rungs (the qualification ladder)")
    assert yaml.safe_load(text) == {"endpoint_shape": {**shape, "ctx_size": 32768}}
    assert yaml.safe_load(verdicts.snippet("frank-secondary", shape, "ctx_size", None, 3, "")) is None


def test_the_dead_mans_switch_restores_the_saved_unit_then_restarts_it():
    switch = deadman.DeadMan("frank-secondary.service", 90)
    assert switch.save_argv() == [
        "/bin/cp",
        "--preserve=mode",
        "/etc/systemd/system/frank-secondary.service",
        "/etc/systemd/system/frank-secondary.service.qualify-last-good",
    ]
    argv = switch.arm_argv()
    assert argv[:3] == ["systemd-run", "--unit=frank-secondary-qualify-deadman", "--on-active=90s"]
    unit = "/etc/systemd/system/frank-secondary.service"
    assert f"--property=ExecStartPre=/bin/cp --preserve=mode {unit}.qualify-last-good {unit}" in argv
    assert argv[-3:] == ["/bin/systemctl", "restart", "frank-secondary.service"]
    assert switch.disarm_argv() == ["systemctl", "stop", "frank-secondary-qualify-deadman.timer", "frank-secondary-qualify-deadman.service"]
    with pytest.raises(ValueError, match="ending in .service"):
        deadman.DeadMan("../etc/passwd", 90)
    with pytest.raises(ValueError, match="below 10"):
        deadman.DeadMan("frank-secondary.service", 3)
