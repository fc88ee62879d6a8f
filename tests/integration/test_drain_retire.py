"""Deploys that never cut a client, for real on the lab host: frank-drain (frank-secondary's
llama-server settings, one slot of 32,768 tokens, port 7794) streams a long answer while a shape
change restarts it.
- With the drain (endpoint_drain_timeout 120), the restart waits until the stream has finished:
  the drain reports `drained` with 0 cut, and the client got every token and [DONE].
- With a 2 s drain, the restart goes ahead: `forced`, 1 cut, and the stream ends without [DONE].
- A description-only change rewrites the unit and reloads systemd, with the same engine process.
- An old runtime's unit listed in endpoint_retired_units is stopped, archived, masked, and
  restored by the documented commands."""

import json
import re
import subprocess
import time

import pytest
from lab_host import HOST, env, extra_endpoint_inventory, failures, on_host, playbook, remove_endpoint, require_lab_host, unit_property, write_endpoint_vars

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-drain"
PORT = 7794
UNIT = f"{NAME}.service"
OLD = "frank-drain-old.service"
STREAM_TOKENS = 12000


def remove_drain_endpoint() -> None:
    on_host("pkill", "-f", "frank-drain-stream", check=False)
    remove_endpoint(NAME)
    on_host("systemctl", "unmask", OLD, check=False)
    on_host("systemctl", "disable", "--now", OLD, check=False)
    on_host("rm", "-rf", f"/etc/systemd/system/{OLD}", "/var/lib/llm-fleet/archive", "/tmp/frank-drain-stream.out", "/tmp/frank-drain-stream.sh")
    on_host("systemctl", "daemon-reload")


@pytest.fixture
def drain_inventory(tmp_path, request):
    base = {"endpoint_probe": False}
    shape = {"ctx_size": 32768, "parallel": 1}
    inventory = extra_endpoint_inventory(tmp_path, NAME, PORT, endpoint_shape=shape, **base)
    request.addfinalizer(remove_drain_endpoint)

    def write(**changes) -> None:
        write_endpoint_vars(inventory, NAME, PORT, endpoint_shape={**shape, **changes.pop("shape", {})}, **base, **changes)

    return inventory, write


def deploy(tmp_path, inventory):
    rc, stats, out = playbook(tmp_path, "deploy.yml", inventory=inventory, limit=NAME)
    assert rc == 0, failures(out) or out[-3000:]
    data = json.loads(out[out.index("{") :])
    steps = next(
        task["hosts"][NAME]["steps"]
        for play in data["plays"]
        for task in play["tasks"]
        if "Deploy through the engine" in task["task"]["name"] and "steps" in task["hosts"].get(NAME, {})
    )
    return stats, steps


def start_stream(tmp_path) -> None:
    """A long streamed answer from the lab host itself, in the background (podman exec -d)."""
    body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": STREAM_TOKENS, "ignore_eos": True, "stream": True})
    script = tmp_path / "frank-drain-stream.sh"
    script.write_text(
        f"curl -sN -H 'Content-Type: application/json' -d '{body}' http://127.0.0.1:{PORT}/v1/chat/completions > /tmp/frank-drain-stream.out 2>&1\n"
    )
    subprocess.run(["podman", "cp", str(script), f"{HOST}:/tmp/frank-drain-stream.sh"], env=env(), check=True)
    subprocess.run(["podman", "exec", "-d", HOST, "sh", "/tmp/frank-drain-stream.sh"], env=env(), check=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = on_host("curl", "-s", f"http://127.0.0.1:{PORT}/metrics", check=False)
        if "llamacpp:requests_processing 1" in metrics:
            return
        time.sleep(0.2)
    raise AssertionError(f"the stream never showed as in flight: {on_host('cat', '/tmp/frank-drain-stream.out', check=False)[-300:]}")


def stream_output() -> str:
    return on_host("cat", "/tmp/frank-drain-stream.out")


def test_the_drain_waits_for_a_stream_and_cosmetic_and_retired_units_behave(tmp_path, drain_inventory):
    inventory, write = drain_inventory
    deploy(tmp_path, inventory)
    assert unit_property(UNIT, "ActiveState") == "active"

    # A shape change (RestartSec) while a stream is in flight: the restart waits for it.
    start_stream(tmp_path)
    write(shape={"restart_sec": 3}, endpoint_drain_timeout=120)
    _stats, steps = deploy(tmp_path, inventory)
    drain = steps["unit"]["drain"]
    assert drain["outcome"] == "drained" and drain["cut"] == 0 and drain["in_flight_at_start"] == 1, drain
    out = stream_output()
    assert out.rstrip().endswith("data: [DONE]"), out[-300:]
    assert re.search(rf'"predicted_n":\s*{STREAM_TOKENS}\b', out), out[-300:]  # every token reached the client

    # A 2 s drain gives up: the restart cuts the stream, and says so.
    start_stream(tmp_path)
    write(shape={"restart_sec": 4}, endpoint_drain_timeout=2)
    _stats, steps = deploy(tmp_path, inventory)
    drain = steps["unit"]["drain"]
    assert drain["outcome"] == "forced" and drain["cut"] == 1, drain
    time.sleep(1)
    assert "data: [DONE]" not in stream_output()

    # Documentation only: the unit file and systemd change, the engine process does not.
    pid = unit_property(UNIT, "MainPID")
    write(shape={"restart_sec": 4}, endpoint_drain_timeout=2, endpoint_description="drain test endpoint")
    stats, steps = deploy(tmp_path, inventory)
    assert steps["unit"]["cosmetic"] and stats["changed"] > 0
    assert unit_property(UNIT, "MainPID") == pid
    assert unit_property(UNIT, "Description") == f"{NAME} (llamacpp, podman): drain test endpoint"

    # An old runtime's unit: retired (stopped, archived, masked) by the next deploy, then restored by hand.
    old_unit = "[Unit]\\nDescription=old runtime\\n[Service]\\nExecStart=/bin/sleep infinity\\n[Install]\\nWantedBy=multi-user.target\\n"
    on_host("sh", "-c", f"printf '{old_unit}' > /etc/systemd/system/{OLD}")
    on_host("systemctl", "daemon-reload")
    on_host("systemctl", "enable", "--now", OLD)
    write(shape={"restart_sec": 4}, endpoint_drain_timeout=2, endpoint_description="drain test endpoint", endpoint_retired_units=[OLD])
    _stats, steps = deploy(tmp_path, inventory)
    retired = steps["retire"]["units"][0]
    assert retired["state"] == "retired", retired
    assert unit_property(OLD, "ActiveState") == "inactive" and unit_property(OLD, "UnitFileState") == "masked"
    archived = retired["archived_to"]
    assert "ExecStart=/bin/sleep infinity" in on_host("cat", archived)
    assert unit_property(UNIT, "MainPID") == pid, "retiring another unit does not restart this one"
    # The restore docs/engine_units.md gives.
    directory = archived.rsplit("/", 1)[0]
    on_host("sh", "-c", f"systemctl unmask {OLD} && mv {directory}/{OLD} /etc/systemd/system/ && systemctl daemon-reload && systemctl enable --now {OLD}")
    assert unit_property(OLD, "ActiveState") == "active"
