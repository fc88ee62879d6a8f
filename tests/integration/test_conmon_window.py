"""A dead conmon never reads green, for real on the lab host: frank-conmon (frank-secondary's
llama-server settings in podman, port 7803) has its conmon SIGKILLed; the engine serves on,
re-parented, for a window and then dies (the unit restarts it). A deploy started inside that
window must wait or fail, never report the dying engine healthy. The test measures the window
(kill -> engine process gone) and prints it."""

import json
import threading
import time

import pytest
from lab_host import extra_endpoint_inventory, failures, on_host, playbook, remove_endpoint, require_lab_host

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-conmon"
PORT = 7803


@pytest.fixture
def conmon_inventory(tmp_path, request):
    inventory = extra_endpoint_inventory(tmp_path, NAME, PORT, endpoint_probe=False, endpoint_health_timeout=60)
    request.addfinalizer(lambda: remove_endpoint(NAME))
    return inventory


def deploy(tmp_path, inventory):
    rc, _stats, out = playbook(tmp_path, "deploy.yml", inventory=inventory, limit=NAME)
    data = json.loads(out[out.index("{") :])
    results = [
        task["hosts"][NAME]
        for play in data["plays"]
        for task in play["tasks"]
        if "Deploy through the engine" in task["task"]["name"] and NAME in task["hosts"] and not task["hosts"][NAME].get("skipped")
    ]
    return rc, (results[-1] if results else {}), out


def alive(pid: str) -> bool:
    return on_host("sh", "-c", f"test -d /proc/{pid} && echo yes", check=False) == "yes"


def test_a_deploy_inside_the_dead_conmon_window_never_reports_the_engine_healthy(tmp_path, conmon_inventory):
    rc, _result, out = deploy(tmp_path, conmon_inventory)
    assert rc == 0, failures(out) or out[-3000:]
    state = on_host("podman", "inspect", "--format", "{{.State.Pid}} {{.State.ConmonPid}}", NAME).split()
    engine, conmon = state[0], state[1]
    killed = time.monotonic()
    on_host("kill", "-KILL", conmon)
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.update(zip(("rc", "result", "out"), deploy(tmp_path, conmon_inventory))))
    worker.start()
    window = None
    while time.monotonic() - killed < 120:
        if not alive(engine):
            window = time.monotonic() - killed
            break
        time.sleep(0.2)
    worker.join(timeout=300)
    print(f"dead conmon window: the engine (PID {engine}) served on for {window if window is None else round(window, 1)} s after conmon {conmon} was killed")
    health = ((outcome.get("result") or {}).get("steps") or {}).get("unit", {}).get("health") or {}
    if outcome["rc"] == 0:
        # Green only for the engine the unit started again, never for the orphan of the dead conmon.
        assert str(health.get("listener_pid")) != engine, health
        assert window is not None, "the deploy reported healthy while the orphaned engine still lived"
    else:
        assert "conmon" in (outcome["result"].get("msg") or "") or "crash-looping" in (outcome["result"].get("msg") or ""), outcome["result"].get("msg")
