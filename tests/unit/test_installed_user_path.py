"""A new user's path, end to end, from the built tarball: installed into an empty collections path,
then used from the user's own directory with its own ansible.cfg (collections path, plan callback,
a RELATIVE vault password file). A two-endpoint fleet whose first endpoint names a misspelt model
file and whose second has no geometry at all, only its Hub repo (the Hub emulator, lab/hub_emulator.py):
- the fleet plan refuses the first naming the manifest's file, still prices the second from the Hub
  before any download (its ledger printed), and exits non-zero;
- the CLI, by its documented command (the installed collection's bin/llm-fleet), reads the
  inventory through the user's ansible.cfg (the vaulted key decrypts with the relative password
  file) and prices the second endpoint from the Hub too.
The shipped docs' links are tests/unit/test_shipped_docs.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "lab"))

import make_tiny_gguf  # noqa: E402
from hub_emulator import HubEmulator  # noqa: E402

REPO = "example-org/tiny-llama-GGUF"
VAULT_PASSWORD = "user-path-vault-password"
API_KEY = "sk-user-path-0b6f1d"
DEVICES = [{"name": "gpu0", "memory": "24,576 MiB"}]


def user_env(home: Path, hub_url: str) -> dict[str, str]:
    """The user's shell: nothing of the checkout on any path, no ANSIBLE_* variable."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_") and key not in ("PYTHONPATH", "HF_TOKEN")}
    env.update(HOME=str(home), PATH=f"{BIN}:{os.environ['PATH']}", HF_ENDPOINT=hub_url)
    return env


def vaulted(value: str, workdir: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        # The user's ansible.cfg names the password file (a relative path), as for every later run.
        [str(BIN / "ansible-vault"), "encrypt_string", value],
        capture_output=True, text=True, cwd=workdir, env=env, check=True,
    )  # fmt: skip
    return proc.stdout.split("!vault |", 1)[1]


def test_a_new_user_prices_a_fleet_from_the_hub_with_the_installed_collection(collection_tarball, tmp_path):
    model = tmp_path / "hub-files" / "tiny.gguf"
    model.parent.mkdir()
    make_tiny_gguf.write_model(make_tiny_gguf.GEOMETRIES[0], model)
    emulator = HubEmulator().start()
    try:
        emulator.add_file(REPO, "tiny.gguf", model, "lfs")
        commit = emulator.repos[REPO].commit
        user = tmp_path / "my-fleet-repo"
        user.mkdir()
        env = user_env(tmp_path / "home", emulator.hub_url)
        (tmp_path / "home").mkdir()

        install = [str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p", "collections", str(collection_tarball)]
        proc = subprocess.run(install, capture_output=True, text=True, cwd=user, env=env, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (user / "ansible.cfg").write_text(
            "[defaults]\ncollections_path = ./collections\ninventory = ./inventory\n"
            "vault_password_file = vault-pass\ncallbacks_enabled = frank.llm_fleet.deploy_plan\n"
        )
        (user / "vault-pass").write_text(VAULT_PASSWORD + "\n")

        inventory = user / "inventory"
        (inventory / "host_vars").mkdir(parents=True)
        (inventory / "hosts.yml").write_text(
            yaml.safe_dump({"all": {"children": {"llm_endpoints": {"hosts": {
                "my-misnamed": {"ansible_host": "gpu-a.unreachable.invalid"},
                "my-hub": {"ansible_host": "gpu-b.unreachable.invalid"},
            }}}}}, sort_keys=False)
        )  # fmt: skip
        manifest = {
            "repo_id": REPO,
            "revision": commit,
            "files": [{"path": "tiny.gguf", "size": model.stat().st_size, "sha256": "0" * 64, "lfs": True}],
        }
        shape = {"runtime": "llamacpp", "launch": "native", "ctx_size": 4096, "parallel": 1, "type_k": "f16", "type_v": "f16"}
        misnamed = {
            "endpoint_shape": {**shape, "port": 8080, "model_file": "tiny.ggfu", "model_geometry": {"n_layer": 4, "n_head_kv": 2, "head_dim": 32}},
            "endpoint_devices": DEVICES,
            "endpoint_payload_dir": "/srv/models/my-misnamed",
            "endpoint_payload_manifest": manifest,
        }
        (inventory / "host_vars" / "my-misnamed.yml").write_text(yaml.safe_dump(misnamed))
        hub = {
            "endpoint_shape": {**shape, "port": 8081, "model_file": "tiny.gguf"},
            "endpoint_devices": DEVICES,
            "endpoint_payload_dir": "/srv/models/my-hub",
            "endpoint_payload_manifest": manifest,
        }
        (inventory / "host_vars" / "my-hub.yml").write_text(yaml.safe_dump(hub) + "endpoint_api_key: !vault |" + vaulted(API_KEY, user, env))

        served_before = sum(emulator.bytes_served.values())
        plan = subprocess.run([str(BIN / "ansible-playbook"), "frank.llm_fleet.plan"], capture_output=True, text=True, cwd=user, env=env, check=False)
        out = plan.stdout
        assert plan.returncode == 2, out[-3000:] + plan.stderr
        assert "UNREACHABLE" not in out and API_KEY not in out + plan.stderr
        table = out[out.index("Fleet plan (priced only") :].split("\n\n")[1].splitlines()
        rows = {line.split()[0]: " ".join(line.split()[1:]) for line in table[1:]}
        assert list(rows) == ["my-misnamed", "my-hub"], rows
        assert rows["my-misnamed"].startswith("refused by a gate (budget)") and "did you mean 'tiny.gguf'?" in rows["my-misnamed"]
        assert rows["my-hub"].startswith("fits"), rows
        ledger = out[out.index("TASK [frank.llm_fleet.endpoint : Show the ledger - my-hub]") :]
        assert '"fits: yes"' in ledger and '"weights        1.4"' in ledger, ledger[:1500]
        # Priced from the Hub: the emulator served the header, and nothing downloaded it to disk.
        assert sum(emulator.bytes_served.values()) > served_before
        assert not Path("/srv/models/my-hub").exists()

        # The CLI by its documented command, from the user's directory.
        cli = user / "collections" / "ansible_collections" / "frank" / "llm_fleet" / "bin" / "llm-fleet"
        budget = subprocess.run([str(cli), "budget", "--endpoint", "my-hub"], capture_output=True, text=True, cwd=user, env=env, check=False)
        assert budget.returncode == 0, budget.stdout[-3000:] + budget.stderr
        assert "fits: yes" in budget.stdout and "Traceback" not in budget.stderr and API_KEY not in budget.stdout + budget.stderr
    finally:
        emulator.stop()
