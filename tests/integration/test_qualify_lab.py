"""Qualification on the lab's frank-secondary (tests/integration/lab_qualify.py): the ladder over
ctx_size (gate, boot as the service, full-contract probe), and the dead-man's switch with the
controller killed mid-rung (the candidate boots as the service, nothing re-arms or disarms the
switch, and the host alone puts the last-good unit back within the switch's timeout plus one
boot). A finally leaves the endpoint serving its last-good shape either way."""

import pytest
from lab_host import lab_shape, require_lab_host, served
from lab_qualify import PORT, killed_controller, run_ladder, slot_ctx

from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify import ladder

pytestmark = pytest.mark.lab

require_lab_host()

SWITCH_S = 20
# Restore and boot after the timer fired: measured 1.0 s on the lab (docs/bench.md); the bound
# leaves a loaded lab room for a slow podman start.
BOOT_BOUND_S = 30


def test_a_killed_controller_leaves_the_host_to_restore_the_last_good_unit():
    result = killed_controller(SWITCH_S, candidate_ctx=16384)
    assert result["candidate_boot_s"] is not None and result["candidate_ctx"] == 16384 // 2, result
    assert result["unit_restored_by_switch"] is True, result
    assert result["serving_again_s"] is not None, result
    assert SWITCH_S <= result["serving_again_s"] <= SWITCH_S + BOOT_BOUND_S, result
    assert result["serving_after"] is True
    assert served(PORT) == "frank-secondary"


def test_the_ladder_finds_the_trained_window_and_leaves_the_last_good_shape_serving():
    # 81920 over 2 slots asks 40960 per slot, past the tiny model's n_ctx_train (32768): the engine
    # caps the slot, so the rung fails; 65536 (32768 per slot) passes; the +4096 bonus fails again.
    shape = lab_shape("frank-secondary")
    devices = [{"name": "lab-cpu", "memory": "2 GiB"}]
    search = ladder.Search(key="ctx_size", ceiling=81920, floor=8192, step=16384, bonus=4096, align=2048)
    before = slot_ctx()
    rungs, timing = run_ladder(search, shape, devices, max_tokens=16)
    assert [(r.value, r.verdict) for r in rungs] == [(81920, "probe_failed"), (65536, "passed"), (69632, "probe_failed")]
    assert "capped" in rungs[0].why and rungs[1].concurrency == (2, 2) and rungs[1].tokens == 65536
    assert ladder.answer([(r.value, r.verdict) for r in rungs]) == 65536
    assert timing["serving_again_s"] is not None
    assert slot_ctx() == before and served(PORT) == "frank-secondary"
