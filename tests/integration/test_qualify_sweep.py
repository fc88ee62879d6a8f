"""playbooks/sweep.yml on the lab's frank-secondary through the real ansible-playbook: three
ubatch cells, the middle one past what the budget gate admits; the refused cell is recorded with
the gate's words and skipped, the cells after it are still measured (prefill, decode, memory), the
table is written, and the last-known-good shape serves afterwards."""

import json

import pytest
from lab_host import failures, on_host, playbook, require_lab_host, served
from lab_qualify import PORT, UNIT_PATH, deployed, exists, slot_ctx

pytestmark = pytest.mark.lab

require_lab_host()

ENDPOINT = "frank-secondary"
# At a 65536-token context a 65536-token micro-batch needs 4,432 MiB of compute buffers on the
# lab's 2 GiB device: the gate refuses it before anything boots.
CELLS = [{"ctx_size": 65536, "ubatch": 128}, {"ctx_size": 65536, "batch": 65536, "ubatch": 65536}, {"ctx_size": 65536, "ubatch": 512}]


def test_an_infeasible_cell_is_recorded_and_skipped_and_the_service_comes_back(tmp_path):
    deployed()
    good_ctx, good_unit = slot_ctx(), on_host("cat", UNIT_PATH)
    results = tmp_path / "results"
    rc, _stats, out = playbook(
        tmp_path,
        "sweep.yml",
        limit=ENDPOINT,
        extra_vars={
            "qualify_sweep_cells": CELLS,
            "qualify_results_dir": str(results),
            "qualify_deadman_seconds": 300,
            "qualify_sweep_prompt_tokens": 1024,
            "qualify_sweep_reps": 2,
        },
    )
    assert rc == 0, failures(out)
    print(f"\n{(results / f'{ENDPOINT}.sweep.txt').read_text()}")
    cells = json.loads((results / f"{ENDPOINT}.sweep.json").read_text())["cells"]
    assert [c["cell"] for c in cells] == CELLS
    assert [c["verdict"] for c in cells] == ["measured", "refused", "measured"], cells
    assert "at term 'compute'" in cells[1]["why"] and "prefill_tps" not in cells[1], cells[1]
    for cell in (cells[0], cells[2]):
        assert cell["prefill_tps"] > 0 and cell["decode_tps"] > 0 and set(cell["free_under_load"]) == {"host"}, cell
    assert slot_ctx() == good_ctx and served(PORT) == ENDPOINT
    assert on_host("cat", UNIT_PATH) == good_unit and not exists(f"{UNIT_PATH}.qualify-last-good")
