"""inventories/example, the starting inventory a new user copies out of the installed collection:
one llama.cpp and one vLLM endpoint, every key to fill marked, the secret vaulted, and a filled
copy that passes the budget gate on the controller without contacting a host."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventories" / "example"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
VAULT_PASSWORD_FILE = EXAMPLE / ".vault-pass.example"


def ansible(tool, *argv, cwd=ROOT):
    return subprocess.run([str(BIN / tool), *argv], capture_output=True, text=True, cwd=cwd, env=ENV, check=False)


def test_the_example_has_one_llamacpp_and_one_vllm_endpoint_in_llm_endpoints():
    proc = ansible("ansible-inventory", "-i", str(EXAMPLE), "--list", "--vault-password-file", str(VAULT_PASSWORD_FILE))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    hosts = data["llm_endpoints"]["hosts"]
    runtimes = sorted(data["_meta"]["hostvars"][host]["endpoint_shape"]["runtime"] for host in hosts)
    assert runtimes == ["llamacpp", "vllm"]


def test_every_endpoint_marks_what_a_user_must_fill():
    for host_vars in sorted((EXAMPLE / "host_vars").glob("*.yml")):
        text = host_vars.read_text()
        data = yaml.safe_load(text.replace("!vault", ""))
        for key in ("endpoint_shape", "endpoint_devices", "endpoint_payload_dir", "endpoint_payload_manifest"):
            assert key in data, f"{host_vars.name}: {key} missing"
        for key in ("served_id", "port", "model_file", "model_geometry"):
            assert key in data["endpoint_shape"], f"{host_vars.name}: endpoint_shape.{key} missing"
        assert text.count("# FILL") >= 6, f"{host_vars.name}: mark each value a user must set with '# FILL'"


def test_the_secret_is_vaulted_with_the_throwaway_password_and_holds_a_placeholder():
    text = (EXAMPLE / "host_vars" / "my-vllm.yml").read_text()
    assert "HF_TOKEN: !vault |" in text
    assert "HF_TOKEN: hf_" not in text
    proc = ansible(
        "ansible",
        "my-vllm",
        "-i",
        str(EXAMPLE),
        "-m",
        "ansible.builtin.debug",
        "-a",
        "msg={{ endpoint_secret_environment.HF_TOKEN }}",
        "--vault-password-file",
        str(VAULT_PASSWORD_FILE),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "msg: hf_REPLACE_ME" in proc.stdout


def test_a_filled_copy_passes_the_budget_gate_on_the_controller(tmp_path):
    # A copy outside the checkout, filled: the endpoint renamed, its port and pool changed.
    fleet = tmp_path / "my-fleet"
    shutil.copytree(EXAMPLE, fleet)
    hosts = fleet / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("my-llamacpp:", "chat-small:").replace("gpu-host-1.example.invalid", "gpu1.invalid"))
    filled = (fleet / "host_vars" / "my-llamacpp.yml").read_text().replace("port: 8080", "port: 8081").replace("ctx_size: 65536", "ctx_size: 32768")
    (fleet / "host_vars" / "chat-small.yml").write_text(filled)
    (fleet / "host_vars" / "my-llamacpp.yml").unlink()
    proc = ansible(
        "ansible-playbook",
        "frank.llm_fleet.deploy",
        "-i",
        str(fleet),
        "--check",
        "--tags",
        "budget",
        "--vault-password-file",
        str(fleet / ".vault-pass.example"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    # Both priced on the controller (the hosts do not exist), both fit.
    assert "chat-small -> localhost" in proc.stdout and "my-vllm -> localhost" in proc.stdout
    assert proc.stdout.count("fits: yes") == 2
    # 32,768 tokens x 32 layers x 8 KV heads x 128 x 2 (K and V) q8_0 elements at 34 bytes per 32: 2,176 MiB.
    assert "kv         2,176.0" in proc.stdout
