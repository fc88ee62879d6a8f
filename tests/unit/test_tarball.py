"""The tarball a user installs (ansible-galaxy collection build): what the collection needs and
nothing of the development tree."""

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

BIN = Path(sys.executable).parent

# Every top-level path a user gets; anything else is the development tree leaking in.
ALLOWED_TOP_LEVEL = {
    "MANIFEST.json",
    "FILES.json",
    "README.md",
    "LICENSE",
    "bin",
    "CHANGELOG.md",
    "changelogs",
    "docs",
    "inventories",
    "meta",
    "observability",
    "playbooks",
    "plugins",
    "roles",
}
# What the collection cannot work without, by path in the tarball.
REQUIRED = [
    "README.md",
    "meta/runtime.yml",
    "roles/endpoint/tasks/main.yml",
    "roles/endpoint/meta/argument_specs.yml",
    "plugins/modules/vram_budget.py",
    "plugins/module_utils/shape/model.py",
    "plugins/plugin_utils/cli.py",
    "plugins/plugin_utils/fleet_artifacts.py",
    # `llm-fleet generate` checks rules and panels against the series the runtimes export.
    "observability/exported/llamacpp.metrics",
    "observability/exported/vllm.metrics",
    "docs/shape.md",
    "docs/index.md",
    "inventories/example/hosts.yml",
    "inventories/example/host_vars/my-llamacpp.yml",
    "inventories/example/host_vars/my-vllm.yml",
    "inventories/example/.vault-pass.example",
]
# The collection playbooks, called as frank.llm_fleet.NAME.
PLAYBOOKS = {
    "companions",
    "deploy",
    "deploy_primary",
    "deploy_secondary",
    "deploy_large",
    "deploy_fleet",
    "plan",
    "rollback",
    "payload_purge",
    "probe",
    "bench",
    "browser_gate",
    "qualify",
    "spec_ab",
    "sweep",
    "quality_gate",
    "retired_served_ids",
    "observability",
}


def members(tarball):
    with tarfile.open(tarball) as tar:
        return {m.name.removeprefix("./"): m for m in tar.getmembers()}


def test_the_tarball_holds_nothing_outside_the_allowlist(collection_tarball):
    leaked = sorted({name.split("/")[0] for name in members(collection_tarball)} - ALLOWED_TOP_LEVEL)
    assert leaked == [], f"add these to build_ignore in galaxy.yml (or to ALLOWED_TOP_LEVEL if a user needs them): {leaked}"


def test_the_tarball_holds_no_lab_or_maintainer_fleet(collection_tarball):
    names = members(collection_tarball)
    inventories = {name.split("/")[1] for name in names if name.startswith("inventories/") and name.count("/") >= 1}
    assert inventories == {"example"}
    assert not [name for name in names if name.startswith("docs/fleet/")], "docs/fleet is generated from the maintainers' inventory"
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def test_the_tarball_holds_what_a_user_needs(collection_tarball):
    names = members(collection_tarball)
    missing = [path for path in REQUIRED if path not in names or not names[path].isfile()]
    assert missing == []


def test_every_shipped_playbook_is_callable_by_fqcn(collection_tarball):
    # A collection playbook's name must be a Python identifier: frank.llm_fleet.deploy-primary is not found.
    # Links count too: the checkout's hyphenated links stay out.
    playbooks = [name for name, member in members(collection_tarball).items() if name.startswith("playbooks/") and not member.isdir()]
    shipped = {name.removeprefix("playbooks/").removesuffix(".yml") for name in playbooks}
    assert shipped == PLAYBOOKS
    assert all(re.fullmatch(r"[a-z_][a-z0-9_]*", name) for name in shipped)


def test_the_installed_cli_prices_the_example_from_the_installed_collection(collection_tarball, tmp_path):
    # Installed as a user installs it, run from outside the checkout with nothing of it on the paths.
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_") and key != "PYTHONPATH"}
    env.update(HOME=str(tmp_path), PATH=f"{BIN}:{os.environ['PATH']}")
    install = [str(BIN / "ansible-galaxy"), "collection", "install", "--offline", str(collection_tarball)]
    assert subprocess.run(install, capture_output=True, text=True, cwd=tmp_path, env=env, check=False).returncode == 0
    collections = tmp_path / ".ansible" / "collections"
    installed = collections / "ansible_collections" / "frank" / "llm_fleet"
    shutil.copytree(installed / "inventories" / "example", tmp_path / "my-fleet")
    cli = [sys.executable, "-m", "ansible_collections.frank.llm_fleet.plugins.plugin_utils.cli", "budget", "-i", "my-fleet", "--endpoint", "my-llamacpp"]
    proc = subprocess.run(cli, capture_output=True, text=True, cwd=tmp_path, env={**env, "PYTHONPATH": str(collections)}, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 65,536 tokens x 32 layers x 8 KV heads x 128 x 2 (K and V) q8_0 elements at 34 bytes per 32: 4,352 MiB.
    assert re.search(r"kv +4,352\.0\b", proc.stdout), proc.stdout
    probe = [sys.executable, "-c", "import ansible_collections.frank.llm_fleet.plugins.plugin_utils.cli as cli; print(cli.ROOT)"]
    root = subprocess.run(probe, capture_output=True, text=True, cwd=tmp_path, env={**env, "PYTHONPATH": str(collections)}, check=True).stdout.strip()
    assert root == str(installed.resolve()), "the CLI reads its tree (observability/exported) from the installed collection"
