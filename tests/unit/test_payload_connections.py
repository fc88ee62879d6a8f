"""endpoint_payload_connections reaches the payload gate: roles/endpoint/tasks/payload.yml as
ansible-playbook runs it, fetching a real payload from the Hub emulator (lab/hub_emulator.py). The
inventory's value is the module's `connections` (one stream per file at 1); unset, the module's
own default (8) applies and a file of several pieces is fetched by ranged requests."""

import hashlib
import os
import sys
from pathlib import Path

import pytest
from local_playbook import run_local_playbook

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))
from hub_emulator import HubEmulator

pytestmark = pytest.mark.slow

REPO = "frank/connections-payload"
FILE = "model.gguf"
SIZE = 12 << 20  # three of the fetch's 4 MiB pieces


@pytest.fixture
def hub(tmp_path):
    data = os.urandom(SIZE)
    emulator = HubEmulator()
    emulator.add_file(REPO, FILE, data, "lfs", workdir=tmp_path)
    emulator.start()
    yield emulator, hashlib.sha256(data).hexdigest()
    emulator.stop()


def fetch(tmp_path, emulator, sha256, **inventory):
    """The role's payload gate for an endpoint with these inventory variables: (its fetch task's
    result, the CDN's GET requests for the file)."""
    variables = {
        "endpoint_name": "my-endpoint",
        "endpoint_payload_dir": str(tmp_path / "payload"),
        "endpoint_payload_fetch": True,
        "endpoint_payload_manifest": {
            "repo_id": REPO,
            "revision": emulator.repos[REPO].commit,
            "files": [{"path": FILE, "size": SIZE, "sha256": sha256, "lfs": True}],
        },
        **inventory,
    }
    (tmp_path / "payload").mkdir(exist_ok=True)
    emulator.requests.clear()
    tasks = [{"ansible.builtin.include_role": {"name": "frank.llm_fleet.endpoint", "tasks_from": "payload"}, "vars": variables}]
    proc, ran = run_local_playbook(tmp_path, {"tasks": tasks}, extra_env={"HF_ENDPOINT": emulator.hub_url})
    assert proc.returncode == 0, proc.stdout[-3000:]
    (fetched,) = [task["hosts"]["localhost"] for task in ran if task["task"]["name"].endswith(" : Fetch the payload - my-endpoint")]
    gets = [r for r in emulator.requests if r.server == "lfs" and r.method == "GET"]
    (tmp_path / "payload" / FILE).unlink()
    return fetched, gets


def test_the_inventory_s_connections_reach_the_payload_gate(tmp_path, hub):
    emulator, sha256 = hub
    one, gets = fetch(tmp_path, emulator, sha256, endpoint_payload_connections=1)
    assert one["invocation"]["module_args"]["connections"] == 1
    assert one["files"][0]["action"] == "fetched" and one["files"][0]["sha256"] == sha256
    # One stream: one GET of the whole file, no piece ranges.
    assert len(gets) == 1 and gets[0].headers.get("Range", "bytes=0-").replace(" ", "") == "bytes=0-", [g.headers for g in gets]

    default, gets = fetch(tmp_path, emulator, sha256)
    assert default["invocation"]["module_args"]["connections"] == 8
    assert default["files"][0]["sha256"] == sha256
    # Ranged: one request per 4 MiB piece.
    assert len([g for g in gets if g.headers.get("Range", "").startswith("bytes=")]) >= 3, [g.headers for g in gets]
