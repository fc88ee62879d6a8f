"""Two rows of the lab fault matrix (docs/lab.md, "Fault matrix") on one endpoint, for real on the
lab host: frank-fault (frank-secondary's llama-server settings, port 7809) serves its model from a
payload directory of its own (a copy of the lab model and its manifest), with a hostile value in
endpoint_environment.
- A hostile environment value (quotes, `$HOME`, backticks, `$(id)`, a backslash, runs of spaces)
  reaches the engine byte for byte (/proc/PID/environ of the engine); one with a newline is
  refused before the host changes, naming the key and never the value, and the engine serves on.
- A truncated payload (the model file replaced by its first half, as an interrupted copy leaves
  it) is refused by the next deploy's payload gate, naming the file and both sizes, before the host
  changes: the engine that serves keeps serving, under the same MainPID."""

from __future__ import annotations

import json

import pytest
from lab_host import extra_endpoint_inventory, failures, on_host, playbook, remove_endpoint, require_lab_host, served, unit_property, write_endpoint_vars

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-fault"
PORT = 7809
UNIT = f"{NAME}.service"
MODEL = "tiny-llama-h4kv2d32.gguf"
PAYLOAD = f"/var/lib/llm-fleet-tests/{NAME}-payload"
MANIFEST = f"{PAYLOAD}/{MODEL.removesuffix('.gguf')}.manifest.json"
HOSTILE = "a\"b 'c' `id` $(id) $HOME ${PATH} back\\slash  two  spaces; rm -rf / & | > <"
BASE = {
    "endpoint_probe": False,
    "endpoint_payload_dir": PAYLOAD,
    "endpoint_payload_manifest": MANIFEST,
    "endpoint_payload_check_hash": False,  # sizes are what a truncation breaks
    "endpoint_environment": {"LAB_HOSTILE": HOSTILE},
}


@pytest.fixture(scope="module")
def fault_endpoint(tmp_path_factory):
    on_host("sh", "-c", f"mkdir -p {PAYLOAD} && cp /srv/lab-models/{MODEL} /srv/lab-models/{MODEL.removesuffix('.gguf')}.manifest.json {PAYLOAD}/")
    root = tmp_path_factory.mktemp("fault")
    inventory = extra_endpoint_inventory(root, NAME, PORT, **BASE)
    rc, _stats, out = playbook(root, "deploy.yml", inventory=inventory, limit=NAME)
    assert rc == 0, failures(out) or out[-3000:]
    yield root, inventory
    remove_endpoint(NAME)
    on_host("rm", "-rf", PAYLOAD)


def engine_environ() -> dict[str, str]:
    pid = on_host("podman", "inspect", "--format", "{{.State.Pid}}", NAME)
    raw = on_host("sh", "-c", f"tr '\\0' '\\n' < /proc/{pid}/environ")
    return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


def failed_deploy(root, inventory) -> str:
    rc, _stats, out = playbook(root, "deploy.yml", inventory=inventory, limit=NAME)
    assert rc != 0, out[-2000:]
    return "\n".join(failures(out))


def test_a_hostile_environment_value_reaches_the_engine_byte_for_byte_and_a_newline_is_refused(fault_endpoint):
    root, inventory = fault_endpoint
    assert engine_environ()["LAB_HOSTILE"] == HOSTILE
    pid = unit_property(UNIT, "MainPID")

    write_endpoint_vars(inventory, NAME, PORT, **{**BASE, "endpoint_environment": {"LAB_HOSTILE": "first line\nExecStartPre=/bin/sh -c id"}})
    message = failed_deploy(root, inventory)
    assert "LAB_HOSTILE" in message and "ExecStartPre" not in message and "first line" not in message, message
    assert unit_property(UNIT, "MainPID") == pid and served(PORT) == NAME
    write_endpoint_vars(inventory, NAME, PORT, **BASE)


def test_a_truncated_payload_is_refused_by_name_and_the_engine_serves_on(fault_endpoint):
    root, inventory = fault_endpoint
    pid = unit_property(UNIT, "MainPID")
    size = json.loads(on_host("cat", MANIFEST))["files"][0]["size"]
    # An interrupted copy: a new file holding the first half (the engine keeps its mapped inode).
    on_host("sh", "-c", f"head -c {size // 2} {PAYLOAD}/{MODEL} > {PAYLOAD}/{MODEL}.part && mv {PAYLOAD}/{MODEL}.part {PAYLOAD}/{MODEL}")
    message = failed_deploy(root, inventory)
    assert f"{MODEL}: wrong_size" in message and "Verify the payload" in message, message
    assert unit_property(UNIT, "MainPID") == pid and served(PORT) == NAME
