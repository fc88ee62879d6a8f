"""A user's path, end to end: the built tarball installed into ~/.ansible/collections of a fresh
HOME, the example inventory copied out of the installed collection and filled in for the lab's
llama-server endpoint (frank-secondary's lab settings), and the README's "Install from the tarball"
commands run as written from a directory that is not the checkout, with no ansible.cfg: the
budget check, the deploy, a rerun through frank.llm_fleet.deploy_secondary (changed=0), and the
installed CLI's budget."""

import os
import re
import shutil
import subprocess

import pytest
import yaml
from lab_host import BIN, HOST, ROOT, on_host, require_lab_host, served

pytestmark = pytest.mark.lab

require_lab_host()

ENDPOINT = "frank-secondary"
PORT = 7771


def readme_blocks() -> list[list[str]]:
    """The sh blocks of the README's "Install from the tarball" section, one command a line."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Install from the tarball\n", 1)[1].split("\n## ", 1)[0]
    return [[line for line in block.splitlines() if line.strip()] for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def fill(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}: update this test's filling-in"
    path.write_text(text.replace(old, new))


def filled_example(collection, fleet) -> None:
    """The installed example inventory, filled in as a user would for one endpoint: the lab host,
    frank-secondary's lab host_vars, and the model's geometry so the budget prices on the controller."""
    shutil.copytree(collection / "inventories" / "example", fleet)
    fill(fleet / "hosts.yml", "my-llamacpp:", f"{ENDPOINT}:")
    fill(fleet / "hosts.yml", "gpu-host-1.example.invalid", HOST)
    hosts = (fleet / "hosts.yml").read_text()
    # One endpoint only: the vLLM one goes (its machine does not exist here).
    (fleet / "hosts.yml").write_text(re.sub(r"\n +my-vllm:\n +ansible_host: [^\n]*", "", hosts))
    (fleet / "host_vars" / "my-llamacpp.yml").unlink()
    (fleet / "host_vars" / "my-vllm.yml").unlink()
    fill(
        fleet / "group_vars" / "llm_endpoints.yml",
        "ansible_user: root",
        "ansible_connection: containers.podman.podman\nansible_python_interpreter: /usr/bin/python3",
    )
    lab = yaml.safe_load((ROOT / "inventories" / "lab" / "host_vars" / f"{ENDPOINT}.yml").read_text())
    facts = ROOT / ".lab" / "facts"
    lab["endpoint_image"] = (facts / "engine-llamacpp.image").read_text().strip()
    lab["endpoint_image_digest"] = (facts / "engine-llamacpp.digest").read_text().strip()
    # lab/make_tiny_gguf.py: tiny-llama-h4kv2d32 has n_layer=2, n_head_kv=2, head_dim 128 / 4 heads = 32.
    lab["endpoint_shape"]["model_geometry"] = {"n_layer": 2, "n_head_kv": 2, "head_dim": 32}
    (fleet / "host_vars" / f"{ENDPOINT}.yml").write_text(yaml.safe_dump(lab, sort_keys=False))


@pytest.fixture
def user(tmp_path, collection_tarball):
    """A fresh HOME and a working directory outside the checkout holding the tarball; the
    environment carries nothing of the checkout's Ansible settings."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    shutil.copy(collection_tarball, work / collection_tarball.name)
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_") and key != "PYTHONPATH"}
    env.update(
        HOME=str(home),
        PATH=f"{BIN}:{os.environ['PATH']}",
        CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", str(ROOT / "lab" / "containers.conf")),
        ANSIBLE_VAULT_PASSWORD_FILE=str(work / "my-fleet" / ".vault-pass.example"),
    )
    return home, work, env


def run(command: str, work, env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=work, env=env, check=False)


def test_the_readme_install_commands_deploy_from_the_installed_collection(user):
    home, work, env = user
    (install, budget_check, deploy), (cli_budget,) = readme_blocks()

    proc = run(install, work, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collection = home / ".ansible" / "collections" / "ansible_collections" / "frank" / "llm_fleet"
    assert (collection / "MANIFEST.json").is_file()
    listed = run("ansible-galaxy collection list frank.llm_fleet", work, env)
    assert str(home / ".ansible" / "collections") in listed.stdout and str(ROOT) not in listed.stdout, listed.stdout

    filled_example(collection, work / "my-fleet")

    proc = run(budget_check, work, env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert f"{ENDPOINT} -> localhost" in proc.stdout, "the filled example prices on the controller"
    # 8,192 tokens x 2 layers x 2 KV heads x 32 x 2 (K and V) x 2 bytes (f16): 4 MiB.
    assert re.search(r"kv +4\.0\b", proc.stdout), proc.stdout[-4000:]
    assert "fits: yes" in proc.stdout

    proc = run(deploy, work, env)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr
    assert served(PORT) == ENDPOINT
    assert on_host("systemctl", "is-active", f"{ENDPOINT}.service") == "active"

    proc = run("ansible-playbook frank.llm_fleet.deploy_secondary -i my-fleet", work, env)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr
    assert re.search(rf"{ENDPOINT} +: ok=\d+ +changed=0 ", proc.stdout), proc.stdout[-3000:]

    # The CLI line as the README writes it, for this inventory's endpoint.
    proc = run(cli_budget.replace("my-llamacpp", ENDPOINT), work, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"kv +4\.0\b", proc.stdout), proc.stdout
    assert "fits: yes" in proc.stdout
