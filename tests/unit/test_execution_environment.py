"""The execution environment definition (execution-environment.yml): ansible-builder accepts it and
writes a build context without building, and it carries what the collection really needs - every
third-party module the plugins import, every other collection the roles, playbooks and inventories
name - at the toolchain's pins. The image build and the navigator run are `make ee` / `make ee-check`."""

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DEFINITION = yaml.safe_load((ROOT / "execution-environment.yml").read_text())
BASE_SPEC = (ROOT / "lab" / "images" / "ee-base.sh").read_text()
# This collection and the ones every Ansible has; anything else must be installed in the EE.
BUILT_IN = {"ansible.builtin", "ansible.legacy", "frank.llm_fleet"}


def ee_python_requirements() -> dict[str, Requirement]:
    deps = DEFINITION["dependencies"]
    lines = [deps["ansible_core"]["package_pip"], deps["ansible_runner"]["package_pip"], *deps["python"]]
    return {canonicalize_name(req.name): req for req in map(Requirement, lines)}


def toolchain_pins() -> dict[str, Requirement]:
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    return {canonicalize_name(req.name): req for req in map(Requirement, filter(None, lines))}


def ee_collections() -> set[str]:
    """Collection names of the galaxy entries: scripts/ee.sh puts the collection's tarball in as
    NAMESPACE-NAME.tar.gz and an installed collection as its NAMESPACE.NAME directory."""
    names = set()
    for entry in DEFINITION["dependencies"]["galaxy"]["collections"]:
        base = Path(entry["name"]).name
        names.add(base.removesuffix(".tar.gz").replace("-", ".", 1) if entry["type"] == "file" else base)
    return names


def third_party_imports() -> set[str]:
    """Top-level modules the collection's Python imports that are neither the standard library nor
    Ansible itself."""
    found = set()
    for path in (ROOT / "plugins").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"ansible", "ansible_collections", "__future__"}


FQCN = r"([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+"


class TaggedLoader(yaml.SafeLoader):
    """Reads the tree's YAML whatever its tags (!vault values name no collection)."""


TaggedLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def named_collections() -> set[str]:
    """Collections the tree names: task keywords (modules), connections, and filters and lookups
    in templates."""
    found = set()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and (match := re.fullmatch(FQCN, key)):
                    found.add(match[1])
                if key in ("ansible_connection", "connection") and isinstance(value, str) and (match := re.fullmatch(FQCN, value)):
                    found.add(match[1])
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, str):
            found.update(re.findall(r"\|\s*" + FQCN, node))
            found.update(re.findall(r"(?:lookup|query)\(\s*['\"]" + FQCN, node))

    for top in ("roles", "playbooks", "inventories"):
        for path in (ROOT / top).rglob("*.yml"):
            for document in yaml.load_all(path.read_text(), Loader=TaggedLoader):  # a SafeLoader
                walk(document)
    return found - BUILT_IN


def test_the_scan_finds_the_lab_connection():
    # inventories/lab/group_vars/all.yml: `ansible_connection: containers.podman.podman`; a scan
    # that misses it would let the next test pass on nothing.
    assert "containers.podman" in named_collections()


def test_every_collection_the_tree_names_is_in_the_ee():
    missing = sorted(named_collections() - ee_collections())
    assert missing == [], f"add these to dependencies.galaxy in execution-environment.yml (and build them in scripts/ee.sh): {missing}"


def test_the_ee_installs_this_collection():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert f"{galaxy['namespace']}.{galaxy['name']}" in ee_collections()


def test_every_third_party_import_is_in_the_ee():
    imports = third_party_imports()
    # plugins/plugin_utils/plots.py imports matplotlib and payload/manifest.py yaml: the scan sees them.
    assert {"matplotlib", "yaml"} <= imports
    by_module = importlib.metadata.packages_distributions()
    wanted = {canonicalize_name(dist) for module in imports for dist in by_module.get(module, [module])}
    missing = sorted(wanted - set(ee_python_requirements()))
    assert missing == [], f"add these to dependencies.python in execution-environment.yml: {missing}"


def test_the_ee_pins_match_the_toolchain():
    pins = toolchain_pins()
    drifted = {
        name: (str(req.specifier), str(pins[name].specifier))
        for name, req in ee_python_requirements().items()
        if name in pins and req.specifier != pins[name].specifier
    }
    assert drifted == {}, f"execution-environment.yml and requirements.txt disagree (ee, requirements.txt): {drifted}"
    assert "ansible-core" in pins and "ansible-core" in ee_python_requirements()


def test_the_package_manager_is_the_base_images_shim():
    # ansible-builder calls $PKGMGR even with no system packages (`clean all`); Debian has no dnf.
    path = DEFINITION["options"]["package_manager_path"]
    assert f'cat >"$rootfs{path}"' in BASE_SPEC
    assert f'chmod 0755 "$rootfs{path}"' in BASE_SPEC


def shim_text() -> str:
    return BASE_SPEC.split("<<'SHIM'\n", 1)[1].split("\nSHIM\n", 1)[0] + "\n"


def run_shim(tmp_path, *args):
    """The base image's apt-dnf with apt-get replaced by a recorder of its arguments."""
    shim, fake_bin, calls = tmp_path / "apt-dnf", tmp_path / "bin", tmp_path / "calls"
    shim.write_text(shim_text())
    shim.chmod(0o755)
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "apt-get").write_text(f'#!/bin/sh\necho "$*" >>{calls}\n')
    (fake_bin / "apt-get").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    result = subprocess.run([str(shim), *args], env=env, capture_output=True, text=True, check=False)
    recorded = calls.read_text().splitlines() if calls.exists() else []
    calls.unlink(missing_ok=True)
    return result, recorded


def test_the_shim_answers_ansible_builders_calls_with_apt(tmp_path):
    # install-from-bindep: "$PKGMGR install -y $PKGMGR_OPTS $PACKAGES"; options are dnf's, dropped.
    result, calls = run_shim(tmp_path, "install", "-y", "--nodocs", "openssh-client", "git")
    assert result.returncode == 0, result.stderr
    assert len(calls) == 2
    assert calls[0].endswith(" update")
    assert calls[1].endswith("install -y --no-install-recommends openssh-client git")
    result, calls = run_shim(tmp_path, "clean", "all")
    assert (result.returncode, calls) == (0, ["clean"])
    # No packages (an empty bindep list) installs nothing.
    assert run_shim(tmp_path, "install", "-y")[1] == []
    result, calls = run_shim(tmp_path, "makecache")
    assert result.returncode == 2 and calls == []
    assert "makecache" in result.stderr


def test_the_base_has_what_ansible_builder_runs():
    # assemble makes a venv (python3-venv); skip_pip_install relies on python3-pip.
    packages = re.search(r"^PACKAGES=(\S+)", BASE_SPEC, re.M)[1].split(",")
    assert {"python3", "python3-pip", "python3-venv"} <= set(packages)
    assert DEFINITION["options"]["skip_pip_install"] is True
    assert DEFINITION["dependencies"]["python_interpreter"]["python_path"] == "/usr/bin/python3"


def ansible_builder() -> str:
    found = shutil.which("ansible-builder") or str(Path(sys.executable).parent / "ansible-builder")
    if not os.access(found, os.X_OK):
        pytest.skip("ansible-builder is not installed (requirements.txt): run 'make setup'")
    return found


@pytest.mark.slow  # spawns ansible-builder
def test_ansible_builder_writes_the_build_context(tmp_path):
    context = tmp_path / "context"
    result = subprocess.run(
        [ansible_builder(), "create", "-f", str(ROOT / "execution-environment.yml"), "-c", str(context), "--output-filename", "Containerfile"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    containerfile = (context / "Containerfile").read_text()
    assert 'ARG PKGMGR="/usr/local/bin/apt-dnf"' in containerfile
    assert 'ARG ANSIBLE_GALAXY_CLI_COLLECTION_OPTS="--offline"' in containerfile
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core==2.19.14 ansible-runner==2.4.3"' in containerfile
    # The build-only CA bundle and pip configuration do not reach the final image.
    assert containerfile.index("RUN rm -f /etc/pip.conf /etc/ssl/build-ca.crt") > containerfile.index("FROM base AS final")
    galaxy = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    assert {entry["name"] for entry in galaxy["collections"]} == {"collections/frank-llm_fleet.tar.gz", "collections/containers.podman"}
    python = {canonicalize_name(Requirement(line).name) for line in (context / "_build" / "requirements.txt").read_text().split()}
    assert {"pyyaml", "jinja2", "matplotlib"} <= python
