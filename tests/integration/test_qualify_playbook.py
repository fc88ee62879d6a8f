"""playbooks/qualify.yml on the lab's frank-secondary, through the real ansible-playbook: the ladder
over its context (each rung priced by the budget gate, booted as the service through the endpoint
role, its boot ledger stored as calibration, probed at the full client contract), the results
written, and the last-known-good shape serving afterwards; then the same window with the
controller killed mid-rung, the host's dead-man's switch alone bringing the last-good shape back."""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import yaml
from lab_host import BIN, ROOT, env, failures, lab_shape, on_host, playbook, require_lab_host, served
from lab_qualify import PORT, UNIT_PATH, deployed, exists, slot_ctx, wait_ctx

pytestmark = pytest.mark.lab

require_lab_host()

ENDPOINT = "frank-secondary"
# 81920 over 2 slots asks 40960 per slot, past the tiny model's n_ctx_train (32768): the engine
# boots but caps the slot, so the window leg's prompt is refused; 65536 (32768 per slot) survives;
# the +4096 bonus rung (34816 per slot) is capped again and its decode cannot reach the window.
LADDER = {
    "key": "context",
    "ceiling": 81920,
    "floor": 8192,
    "step": 16384,
    "bonus": 4096,
    "align": 2048,
    "ceiling_reason": "the tiny model's trained window (n_ctx_train 32768 per slot)",
}
# The client contract the probe loads: the fragment's maxTokens and sampler come from the shape's
# client keys. The lab's 2 shared cores decode about 9 tokens/s per slot at 25k tokens of depth
# (measured), so the lab's clients are given a small maxTokens; production's default is the gap.
CLIENT = {"client_max_tokens": 64, "client_sampler": {"temperature": 0.6, "top_p": 0.95}}
SWITCH_S = 30
# The restore's boot after the switch fired (podman start and the tiny model's load on a loaded lab).
BOOT_BOUND_S = 45


def stores(tmp_path):
    """A copy of the lab's calibration store (the gate reads the same boots) and an empty results dir."""
    calibration = tmp_path / "calibration"
    shutil.copytree(ROOT / ".lab" / "calibration", calibration, dirs_exist_ok=True)
    return calibration, tmp_path / "results"


def stored_contexts(calibration) -> set[int]:
    found = set()
    for path in (calibration / ENDPOINT).glob("*.json"):
        for boot in json.loads(path.read_text()).get("boots", []):
            found.add(int(boot["shape"]["ctx_size"]))
    return found


def test_the_ladder_finds_the_largest_surviving_context_and_the_endpoint_serves_its_last_good_shape(tmp_path):
    deployed()
    good_ctx, good_unit = slot_ctx(), on_host("cat", UNIT_PATH)
    calibration, results = stores(tmp_path)
    before = stored_contexts(calibration)
    started = time.monotonic()
    rc, _stats, out = playbook(
        tmp_path,
        "qualify.yml",
        limit=ENDPOINT,
        extra_vars={
            "endpoint_shape": {**lab_shape(ENDPOINT), **CLIENT},
            "qualify_ladder": LADDER,
            "qualify_results_dir": str(results),
            "llm_fleet_calibration_dir": str(calibration),
            "qualify_deadman_seconds": 300,
        },
    )
    wall = time.monotonic() - started
    assert rc == 0, failures(out)
    document = json.loads((results / f"{ENDPOINT}.qualify.json").read_text())
    rungs = document["rungs"]
    print(f"\n{(results / f'{ENDPOINT}.qualify.txt').read_text()}")
    print(f"largest surviving context {document['answer']} in {len(rungs)} rungs; playbook {wall:.0f} s; restore {document['timing']['restore_s']} s")
    assert [(r["value"], r["verdict"]) for r in rungs] == [(81920, "probe_failed"), (65536, "passed"), (69632, "probe_failed")]
    assert document["answer"] == 65536
    # Every slot at once at the window's limit (32704 prompt + 64 decoded): 2 x 32768 tokens, both
    # decoding together.
    assert rungs[1]["tokens"] == 65536 and rungs[1]["concurrency"] == [2, 2], rungs[1]
    assert set(rungs[1]["free_under_probe"]) == set(rungs[1]["free_at_boot"]) == {"host"}, rungs[1]
    assert "refused" not in rungs[0]["why"] and "answered" in rungs[0]["why"], rungs[0]
    snippet = yaml.safe_load((results / f"{ENDPOINT}.recommended.yml").read_text())
    assert snippet["endpoint_shape"]["ctx_size"] == 65536
    # Every rung that booted left its boot ledger in the calibration store the budget reads.
    assert {81920, 65536, 69632} <= stored_contexts(calibration), (before, stored_contexts(calibration))
    # The last-known-good shape serves again, from its own unit; the switch is gone.
    assert slot_ctx() == good_ctx and served(PORT) == ENDPOINT
    assert on_host("cat", UNIT_PATH) == good_unit
    assert not exists(f"{UNIT_PATH}.qualify-last-good")


def test_a_killed_controller_mid_rung_leaves_the_host_to_restore_the_last_good_shape(tmp_path):
    deployed()
    good_ctx, good_unit = slot_ctx(), on_host("cat", UNIT_PATH)
    candidate = 4 * good_ctx * 2  # four times the window per slot, over the shape's 2 slots
    calibration, results = stores(tmp_path)
    vars_file = tmp_path / "extra-vars.yml"
    ladder = {**LADDER, "ceiling": candidate, "floor": candidate}
    vars_file.write_text(
        yaml.safe_dump(
            {"qualify_ladder": ladder, "qualify_results_dir": str(results), "llm_fleet_calibration_dir": str(calibration), "qualify_deadman_seconds": SWITCH_S}
        )
    )
    controller = subprocess.Popen(
        [str(BIN / "ansible-playbook"), "playbooks/qualify.yml", "--limit", ENDPOINT, "-e", f"@{vars_file}"],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        booted = wait_ctx(candidate // 2, 240)
        assert booted is not None, "the candidate never served"
    finally:
        os.killpg(controller.pid, signal.SIGKILL)  # the controller and its connections, mid-rung
        controller.wait()
    killed = time.monotonic()
    back = wait_ctx(good_ctx, SWITCH_S + BOOT_BOUND_S + 30)
    serving_again_s = None if back is None else time.monotonic() - killed
    try:
        print(f"\ncandidate n_ctx {candidate // 2} per slot served; controller killed; last-good serving again after {serving_again_s} s (switch {SWITCH_S} s)")
        assert serving_again_s is not None, "the switch did not restore the last-good shape"
        assert serving_again_s <= SWITCH_S + BOOT_BOUND_S, serving_again_s
        assert on_host("cat", UNIT_PATH) == good_unit
        assert served(PORT) == ENDPOINT
    finally:
        on_host("rm", "-f", f"{UNIT_PATH}.qualify-last-good", check=False)
        if slot_ctx() != good_ctx:
            subprocess.run([str(BIN / "ansible-playbook"), "playbooks/rollback.yml", "-e", f"endpoint={ENDPOINT}"], cwd=ROOT, env=env(), check=False)
