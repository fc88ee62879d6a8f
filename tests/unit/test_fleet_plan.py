"""The fleet plan (playbooks/plan.yml) as an operator runs it: ansible-playbook on a fleet whose
first endpoint is refused. The second is still priced and its ledger printed, one table names
both verdicts, the run exits non-zero, and no host is contacted (the machines do not exist, and an
`ssh` on PATH that records being run stays unrun) nor any vaulted value read (no vault password
is given, and both endpoints carry a vaulted key)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Every test here runs ansible-playbook: the slow tier.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FIXTURE = ROOT / "tests" / "unit" / "fixtures" / "plan_fleet"


@pytest.fixture
def fleet(tmp_path):
    copy = tmp_path / "fleet"
    shutil.copytree(FIXTURE, copy)
    return copy


def plan(tmp_path, *argv, playbook="playbooks/plan.yml", config=ROOT / "ansible.cfg"):
    """ansible-playbook with an `ssh` (and `scp`, `sftp`) first on PATH that only leaves a mark."""
    fake = tmp_path / "fake-bin"
    fake.mkdir(exist_ok=True)
    marks = tmp_path / "ssh-attempts"
    for tool in ("ssh", "scp", "sftp"):
        (fake / tool).write_text(f'#!/bin/sh\necho "$0 $*" >> {marks}\nexit 255\n')
        (fake / tool).chmod(0o755)
    env = {**os.environ, "ANSIBLE_CONFIG": str(config), "PATH": f"{fake}:{BIN}:{os.environ['PATH']}"}
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)
    proc = subprocess.run([str(BIN / "ansible-playbook"), playbook, *argv], capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    return proc, marks


def table(stdout):
    """The FLEET PLAN table's rows: endpoint -> (verdict and detail)."""
    lines = stdout[stdout.index("Fleet plan (priced only") :].splitlines()
    rows = {}
    for line in lines[3:]:
        if not line.strip():
            break
        name, rest = line.split(None, 1)
        rows[name] = rest
    return rows


def test_a_refused_first_endpoint_leaves_the_second_priced_and_the_run_failed(tmp_path, fleet):
    proc, marks = plan(tmp_path, "-i", str(fleet))
    out = proc.stdout
    assert proc.returncode == 2, out[-3000:] + proc.stderr
    assert not marks.exists(), marks.read_text()
    assert "UNREACHABLE" not in out and "unreachable=0" in out
    rows = table(out)
    assert list(rows) == ["plan-refused", "plan-fits"]
    assert rows["plan-refused"].startswith("refused by a gate (budget)")
    assert "model_file: 'Qwen3-8B-Q4_K_M.ggfu' is not in the manifest; did you mean 'Qwen3-8B-Q4_K_M.gguf'?" in rows["plan-refused"]
    assert rows["plan-fits"].startswith("fits") and "payload identity checked" in rows["plan-fits"]
    # The second endpoint's ledger, printed in full: its split parts and projector were found in its manifest.
    ledger = out[out.index("TASK [frank.llm_fleet.endpoint : Show the ledger - plan-fits]") :]
    assert "ok: [plan-fits]" in ledger and "projector" in ledger and "'fits: yes'" in ledger
    assert "(model_file, projector: 3 paths) is in the" in " ".join(ledger.split())


def test_a_shape_over_its_card_is_refused_by_the_budget_and_the_next_still_priced(tmp_path, fleet):
    host_vars = fleet / "host_vars" / "plan-refused.yml"
    data = yaml.safe_load(host_vars.read_text().split("# Vaulted", 1)[0])
    data["endpoint_shape"]["model_file"] = "Qwen3-8B-Q4_K_M.gguf"
    data["endpoint_shape"]["ctx_size"] = 1048576
    host_vars.write_text(yaml.safe_dump(data))
    proc, marks = plan(tmp_path, "-i", str(fleet))
    assert proc.returncode == 2 and not marks.exists(), proc.stdout[-3000:]
    rows = table(proc.stdout)
    assert rows["plan-refused"].startswith("refused by a gate (budget)") and "gpu0" in rows["plan-refused"] and "MiB" in rows["plan-refused"]
    assert rows["plan-fits"].startswith("fits")


def test_a_shape_the_controller_cannot_price_is_refused_naming_what_to_declare(tmp_path, fleet):
    host_vars = fleet / "host_vars" / "plan-refused.yml"
    text = host_vars.read_text()
    data = yaml.safe_load(text.split("# Vaulted", 1)[0])
    del data["endpoint_shape"]["model_geometry"]
    # Its model file named as the manifest lists it: a misnamed file is refused first, by the
    # identity check (the test above), whatever else the shape lacks.
    data["endpoint_shape"]["model_file"] = data["endpoint_shape"]["model_file"].replace(".ggfu", ".gguf")
    # Not from the Hub either (the next test prices such a shape from the Hub emulator).
    data["endpoint_hub_pricing"] = "never"
    host_vars.write_text(yaml.safe_dump(data))
    proc, marks = plan(tmp_path, "-i", str(fleet))
    assert proc.returncode == 2 and not marks.exists(), proc.stdout[-3000:]
    rows = table(proc.stdout)
    assert rows["plan-refused"].startswith("refused by a gate (budget)")
    assert "never contacts plan-refused.unreachable.invalid" in rows["plan-refused"] and "give model_geometry" in rows["plan-refused"]
    assert rows["plan-fits"].startswith("fits")


def test_the_production_fleet_plan_and_its_budget_check_contact_no_host(tmp_path):
    proc, marks = plan(tmp_path, "-i", "inventories/production")
    assert proc.returncode == 0 and not marks.exists(), proc.stdout[-3000:]
    assert [row.split()[0] for row in table(proc.stdout).values()] == ["fits", "fits", "fits"]
    # The documented check through deploy_fleet.yml: the companions' fact gathering is skipped too.
    proc, marks = plan(tmp_path, "-i", "inventories/production", "--check", "--tags", "budget", playbook="playbooks/deploy_fleet.yml")
    assert proc.returncode == 0 and not marks.exists(), proc.stdout[-3000:]
    assert "UNREACHABLE" not in proc.stdout and re.search(r"TASK \[Gathering Facts\] \**\nskipping: \[webhook-relay\]", proc.stdout)


def test_the_installed_collection_plans_the_fleet_by_its_fqcn(collection_tarball, tmp_path, fleet):
    # Installed as a user installs it, run from outside the checkout with nothing of it on the paths
    # (no ansible.cfg: the plan table is the callback enabled as its documentation says).
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_") and key != "PYTHONPATH"}
    env.update(HOME=str(tmp_path), PATH=f"{BIN}:{os.environ['PATH']}")
    install = [str(BIN / "ansible-galaxy"), "collection", "install", "--offline", str(collection_tarball)]
    assert subprocess.run(install, capture_output=True, text=True, cwd=tmp_path, env=env, check=False).returncode == 0
    env["ANSIBLE_CALLBACKS_ENABLED"] = "frank.llm_fleet.deploy_plan"
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "frank.llm_fleet.plan", "-i", str(fleet)], capture_output=True, text=True, cwd=tmp_path, env=env, check=False
    )
    assert proc.returncode == 2 and "UNREACHABLE" not in proc.stdout, proc.stdout[-3000:] + proc.stderr
    rows = table(proc.stdout)
    assert rows["plan-refused"].startswith("refused by a gate (budget)") and "did you mean 'Qwen3-8B-Q4_K_M.gguf'?" in rows["plan-refused"]
    assert rows["plan-fits"].startswith("fits")


def test_a_shape_with_no_geometry_is_priced_from_the_hub_before_any_download(tmp_path, fleet, monkeypatch):
    """The refused endpoint of the fixture loses its model_geometry and names a model the Hub
    emulator serves: the plan reads its header by range requests (roles/endpoint/tasks/hub_geometry.yml)
    and prices it on the controller, with no payload anywhere and no host contacted."""
    sys.path.insert(0, str(ROOT / "lab"))
    import make_tiny_gguf
    from hub_emulator import HubEmulator

    model = tmp_path / "tiny.gguf"
    make_tiny_gguf.write_model(make_tiny_gguf.GEOMETRIES[0], model)
    emulator = HubEmulator().start()
    try:
        emulator.add_file("lab/tiny-models", "tiny.gguf", model, "lfs")
        host_vars = fleet / "host_vars" / "plan-refused.yml"
        data = yaml.safe_load(host_vars.read_text().split("# Vaulted", 1)[0])
        del data["endpoint_shape"]["model_geometry"]
        data["endpoint_shape"].update(model_file="tiny.gguf", ctx_size=4096)
        data["endpoint_payload_manifest"] = {
            "repo_id": "lab/tiny-models",
            "revision": emulator.repos["lab/tiny-models"].commit,
            "files": [{"path": "tiny.gguf", "size": model.stat().st_size, "sha256": "0" * 64, "lfs": True}],
        }
        host_vars.write_text(yaml.safe_dump(data))
        monkeypatch.setenv("HF_ENDPOINT", emulator.hub_url)
        proc, marks = plan(tmp_path, "-i", str(fleet))
        served = sum(emulator.bytes_served.values())
    finally:
        emulator.stop()
    out = proc.stdout
    assert proc.returncode == 0 and not marks.exists(), out[-3000:] + proc.stderr
    rows = table(out)
    assert rows["plan-refused"].startswith("fits"), rows
    assert rows["plan-fits"].startswith("fits"), rows
    ledger = out[out.index("TASK [frank.llm_fleet.endpoint : Show the ledger - plan-refused]") :]
    assert "'fits: yes'" in ledger, ledger[:2000]
    # The geometry came from the Hub: the emulator sent the header's bytes.
    assert served > 0


def test_without_the_callback_the_plan_prints_its_own_table(tmp_path, fleet, monkeypatch):
    # A user who never enabled frank.llm_fleet.deploy_plan: the checkout's ansible.cfg without that line.
    config = tmp_path / "ansible.cfg"
    lines = (ROOT / "ansible.cfg").read_text().splitlines()
    config.write_text("\n".join(line for line in lines if not line.startswith("callbacks_enabled")).replace("./.collections", str(ROOT / ".collections")))
    monkeypatch.delenv("ANSIBLE_CALLBACKS_ENABLED", raising=False)
    monkeypatch.setenv("ANSIBLE_CALLBACK_RESULT_FORMAT", "json")
    proc, marks = plan(tmp_path, "-i", str(fleet), config=config)
    out = proc.stdout
    assert proc.returncode == 2 and not marks.exists(), out[-3000:]
    shown = out[out.index("TASK [The fleet plan]") :].split("TASK [", 2)[1]
    # The debug output in the json result format: one JSON string per line.
    lines = [json.loads(line.strip().rstrip(",")) for line in shown.splitlines() if line.strip().startswith('"') and not line.strip().startswith('"msg"')]
    assert "Fleet plan (priced only: nothing was changed)" in lines
    refused = next(line for line in lines if line.startswith("plan-refused"))
    assert " refused by a gate " in refused and "did you mean 'Qwen3-8B-Q4_K_M.gguf'?" in refused
    fits = next(line for line in lines if line.startswith("plan-fits"))
    assert fits.split()[1] == "fits" and "gpu1: 7,400.0 of 24,576.0 MiB" in fits
    assert "1 refused by a gate, 1 fits" in lines
