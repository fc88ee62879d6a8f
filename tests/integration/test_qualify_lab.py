"""Qualification on the lab's frank-secondary through the harness the benchmarks time
(tests/integration/lab_qualify.py): the dead-man's switch with the controller killed mid-rung
(the candidate boots as the service, nothing re-arms or disarms the switch, and the host alone
puts the last-good unit back within the switch's timeout plus one boot). The ladder itself is
proven through its playbook (test_qualify_playbook.py)."""

import pytest
from lab_host import require_lab_host, served
from lab_qualify import PORT, killed_controller

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
