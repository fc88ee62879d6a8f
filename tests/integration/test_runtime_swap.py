"""A runtime swap on the lab host, container -> native -> container, one inventory edit each:
frank-swap (frank-secondary's llama-server settings, port 7807) runs in podman, then natively
(llama-server from the engine image's userland unpacked under /opt/llama-root, `RootDirectory=`,
as user llm, as molecule's fleet scenario runs it), then in podman again. Each swap keeps the
unit's name, copies the unit file it replaces into the dated archive (`steps.retire.swap` names
the swap), and the engine serves the endpoint's id on /v1/models from the new launch."""

from __future__ import annotations

import json

import pytest
from lab_host import ROOT, extra_endpoint_inventory, failures, on_host, playbook, remove_endpoint, require_lab_host, served, unit_property, write_endpoint_vars

# A fault-matrix row: `make fault-matrix` runs it, `make test` does not (pytest.ini, fault_row).
pytestmark = [pytest.mark.lab, pytest.mark.fault_row]

require_lab_host()

NAME = "frank-swap"
PORT = 7807
UNIT = f"{NAME}.service"
LLAMA_ROOT = "/opt/llama-root"
NATIVE = {
    "endpoint_model_root": "/models",
    "endpoint_user": "llm",
    "endpoint_unit_extra": {"RootDirectory": LLAMA_ROOT, "BindReadOnlyPaths": "/srv/lab-models:/models"},
}


def exists(path: str) -> bool:
    return on_host("sh", "-c", f"test -e {path} && echo yes", check=False) == "yes"


@pytest.fixture
def native_userland(request):
    """The engine image's userland under /opt/llama-root and the user llm, made here when missing
    and removed afterwards (only what this test made)."""
    made_root = not exists(f"{LLAMA_ROOT}/usr/bin/llama-server")
    made_user = on_host("id", "-u", "llm", check=False) == ""
    if made_root:
        image = (ROOT / ".lab" / "facts" / "engine-llamacpp.image").read_text().strip()
        on_host(
            "sh",
            "-c",
            f"mkdir -p {LLAMA_ROOT} && podman create --name llm-fleet-swap-extract {image} >/dev/null "
            f"&& podman export llm-fleet-swap-extract | tar -x -C {LLAMA_ROOT}; podman rm -f llm-fleet-swap-extract >/dev/null",
        )
    if made_user:
        on_host("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "llm")

    def cleanup() -> None:
        remove_endpoint(NAME)
        on_host("sh", "-c", f"rm -rf /var/lib/llm-fleet/archive/*/{UNIT}")
        on_host("find", "/var/lib/llm-fleet/archive", "-mindepth", "1", "-maxdepth", "1", "-type", "d", "-empty", "-delete", check=False)
        if made_root:
            on_host("rm", "-rf", LLAMA_ROOT)
        if made_user:
            on_host("userdel", "llm", check=False)

    request.addfinalizer(cleanup)


def deploy(tmp_path, inventory) -> dict:
    rc, _stats, out = playbook(tmp_path, "deploy.yml", inventory=inventory, limit=NAME)
    assert rc == 0, failures(out) or out[-3000:]
    data = json.loads(out[out.index("{") :])
    return next(
        task["hosts"][NAME]["steps"]
        for play in data["plays"]
        for task in play["tasks"]
        if "Deploy through the engine" in task["task"]["name"] and "steps" in task["hosts"].get(NAME, {})
    )


def test_a_swap_to_native_and_back_archives_each_replaced_unit_and_serves_each_time(tmp_path, native_userland):
    inventory = extra_endpoint_inventory(tmp_path, NAME, PORT, endpoint_probe=False)
    deploy(tmp_path, inventory)
    assert served(PORT) == NAME and "/usr/bin/podman run" in unit_property(UNIT, "ExecStart")

    write_endpoint_vars(inventory, NAME, PORT, endpoint_shape={"launch": "native"}, endpoint_probe=False, **NATIVE)
    steps = deploy(tmp_path, inventory)
    assert steps["retire"]["swap"] == "llamacpp/podman -> llamacpp/native", steps["retire"]
    assert "/usr/bin/podman run" in on_host("cat", steps["retire"]["archived_to"])  # the container unit, kept
    assert unit_property(UNIT, "RootDirectory") == LLAMA_ROOT and "/usr/bin/llama-server" in unit_property(UNIT, "ExecStart")
    assert served(PORT) == NAME
    assert NAME not in on_host("podman", "ps", "--format", "{{.Names}}").split()

    write_endpoint_vars(inventory, NAME, PORT, endpoint_probe=False)
    steps = deploy(tmp_path, inventory)
    assert steps["retire"]["swap"] == "llamacpp/native -> llamacpp/podman", steps["retire"]
    assert f"RootDirectory={LLAMA_ROOT}" in on_host("cat", steps["retire"]["archived_to"])  # the native unit, kept
    assert "/usr/bin/podman run" in unit_property(UNIT, "ExecStart") and unit_property(UNIT, "RootDirectory") == ""
    assert served(PORT) == NAME
    assert NAME in on_host("podman", "ps", "--format", "{{.Names}}").split()
