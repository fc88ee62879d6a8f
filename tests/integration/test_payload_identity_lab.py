"""The payload identity on the lab host: frank-secondary's budget runs on the host (its shape
gives no geometry), which reads the endpoint's manifest file there. A misspelt model file is
refused by the budget gate, naming the closest manifest name, before anything on the host changes
(the engine keeps its process); the shape as the inventory holds it passes, the ledger saying the
identity was checked."""

import pytest
from lab_host import lab_shape, playbook, require_lab_host, unit_property

pytestmark = pytest.mark.lab

require_lab_host()

UNIT = "frank-secondary.service"
LAB_SHAPE = lab_shape("frank-secondary")


def test_a_misspelt_model_file_is_refused_on_the_host_before_anything_changes(tmp_path):
    # Converged first (a lab another checkout deployed to may differ), so the refused run changes nothing.
    rc, _stats, out = playbook(tmp_path / "converge", "deploy.yml", limit="frank-secondary")
    assert rc == 0, out[-3000:]
    before = unit_property(UNIT, "MainPID")
    misspelt = {**LAB_SHAPE, "model_file": LAB_SHAPE["model_file"].replace(".gguf", ".ggfu")}
    rc, stats, out = playbook(tmp_path, "deploy.yml", extra_vars={"endpoint_shape": misspelt}, limit="frank-secondary")
    assert rc != 0 and stats["changed"] == 0, out[-3000:]
    # The preflight finds it first where the payload is on the host (the file is not there); the
    # budget's identity check where it is not fetched yet (the name is not in the manifest).
    on_host_dir = f"{misspelt['model_file']} is not in the payload directory"
    in_manifest = f"model_file: '{misspelt['model_file']}' is not in the manifest; did you mean '{LAB_SHAPE['model_file']}'?"
    assert (on_host_dir in out and f"did you mean {LAB_SHAPE['model_file']}?" in out) or in_manifest in out, out[-3000:]
    assert unit_property(UNIT, "MainPID") == before
    rc, _stats, out = playbook(tmp_path / "as-is", "deploy.yml", "--check", "--tags", "budget", limit="frank-secondary")
    assert rc == 0 and "payload identity: the shape's payload (model_file: 1 paths) is in the manifest" in out, out[-3000:]
