"""The example inventory's pinned manifests (inventories/example/manifests/): every endpoint names
one, beside the inventory, that the budget reads on the controller; the files each shape names are
in it; and a misnamed model file is refused before any host is contacted, naming the file and the
closest manifest name (issue 30's first trial: `...Q4_K_M.ggfu` priced `fits: yes`)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import parse_manifest
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import payload_identity

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventories" / "example"
BIN = Path(sys.executable).parent


def host_vars(endpoint: str) -> dict:
    return yaml.safe_load((EXAMPLE / "host_vars" / f"{endpoint}.yml").read_text().replace("!vault", ""))


@pytest.mark.parametrize("endpoint", ["my-llamacpp", "my-vllm"])
def test_each_example_endpoint_reads_its_manifest_beside_the_inventory_and_its_shape_is_in_it(endpoint):
    data = host_vars(endpoint)
    expression = data["endpoint_payload_manifest"]
    # The form docs/plan.md gives: a mapping read on the controller, so the plan checks it too.
    assert re.fullmatch(r"\{\{ lookup\('ansible\.builtin\.file', inventory_dir ~ '/manifests/([\w.-]+)'\) \| from_yaml \}\}", expression), expression
    name = re.search(r"/manifests/([\w.-]+)'", expression).group(1)
    pinned = parse_manifest(yaml.safe_load((EXAMPLE / "manifests" / name).read_text()))
    report = payload_identity(data["endpoint_shape"], pinned)
    assert report.ok and report.checked, report.summary


@pytest.mark.slow
def test_the_example_refuses_a_misnamed_model_file_before_any_host_is_contacted(tmp_path):
    # Issue 30's repro as a user runs it: the example copied, its model file misspelt, the budget check.
    fleet = tmp_path / "my-fleet"
    shutil.copytree(EXAMPLE, fleet)
    llamacpp = fleet / "host_vars" / "my-llamacpp.yml"
    text = llamacpp.read_text()
    assert "model_file: model.Q4_K_M.gguf " in text
    llamacpp.write_text(text.replace("model_file: model.Q4_K_M.gguf ", "model_file: model.Q4_K_M.ggfu ", 1))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
    argv = [str(BIN / "ansible-playbook"), "playbooks/deploy.yml", "-i", str(fleet), "--check", "--tags", "budget"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    out = proc.stdout
    assert proc.returncode == 2, out[-3000:] + proc.stderr
    # The key, the file and line that set it, the name the manifest lacks, its closest name, the fix.
    refusal = (
        "payload identity: endpoint_shape.model_file: 'model.Q4_K_M.ggfu' is not in the manifest; "
        f"did you mean 'model.Q4_K_M.gguf'? (set in {llamacpp}:10); manifest your-org/your-model-GGUF@000000000000; "
        "fix: name each file as the manifest lists it (relative to endpoint_payload_dir), or pin a manifest that holds it"
    )
    assert f"[ERROR]: Task failed: Action failed: {refusal}\n" in out, out[-4000:]
    table = out[out.index("Fleet plan (priced only") :]
    row = "my-llamacpp  refused by a gate (budget)  payload identity: endpoint_shape.model_file: 'model.Q4_K_M.ggfu' is not in the manifest;"
    assert f"{row} did you mean 'model.Q4_K_M.gguf'?" in table, table
    # Refused on the controller, never reaching the machines (which do not exist), and never priced.
    assert "my-llamacpp -> localhost" in out and "UNREACHABLE" not in out
    assert "TASK [frank.llm_fleet.endpoint : Show the ledger - my-llamacpp]" not in out
    # The other endpoint is still priced, its identity checked against its own manifest.
    assert re.search(r"my-vllm +fits +gpu0: [\d,.]+ of 81,920.0 MiB, [\d,.]+ free; payload identity checked", table), table


@pytest.mark.slow
def test_the_cli_reads_the_example_manifest_as_the_play_does_and_refuses_the_misnamed_file(tmp_path):
    # The same repro through `llm-fleet budget` (its exit 2: input it cannot use, named with the fix),
    # by inventory and by host_vars file: the manifest lookup is rendered as the play renders it.
    fleet = tmp_path / "my-fleet"
    shutil.copytree(EXAMPLE, fleet)
    llamacpp = fleet / "host_vars" / "my-llamacpp.yml"
    llamacpp.write_text(llamacpp.read_text().replace("model_file: model.Q4_K_M.gguf ", "model_file: model.Q4_K_M.ggfu ", 1))
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env["PATH"] = f"{BIN}:{os.environ['PATH']}"
    refusal = (
        "payload identity: endpoint_shape.model_file: 'model.Q4_K_M.ggfu' is not in the manifest; "
        "did you mean 'model.Q4_K_M.gguf'? (set in my-fleet/host_vars/my-llamacpp.yml:10)"
    )
    for argv in (["-i", "my-fleet", "--endpoint", "my-llamacpp"], ["--shape", "my-fleet/host_vars/my-llamacpp.yml"]):
        proc = subprocess.run([str(ROOT / "bin" / "llm-fleet"), "budget", *argv], capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
        assert proc.returncode == 2 and refusal in proc.stderr and "fits: yes" not in proc.stdout, argv + [proc.stdout, proc.stderr]
    # The other endpoint's identity is checked against its own manifest.
    proc = subprocess.run(
        [str(ROOT / "bin" / "llm-fleet"), "budget", "-i", "my-fleet", "--endpoint", "my-vllm"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert proc.returncode == 0 and "payload identity: the shape's payload (model_file: 1 paths) is in the manifest your-org/your-model@" in proc.stdout, (
        proc.stderr
    )
    # A manifest file the lookup cannot read is named with the host, the expression and the fix; no traceback.
    (fleet / "manifests" / "my-vllm.yml").unlink()
    proc = subprocess.run(
        [str(ROOT / "bin" / "llm-fleet"), "budget", "-i", "my-fleet", "--endpoint", "my-vllm"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(
        "llm-fleet: host my-vllm: endpoint_payload_manifest: cannot render {{ lookup('ansible.builtin.file', inventory_dir ~ '/manifests/my-vllm.yml')"
    )
    assert proc.stderr.rstrip().endswith("fix the expression or the manifest file it reads, or give --manifest FILE"), proc.stderr
