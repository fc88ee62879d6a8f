"""A dead conmon never reads green, for real on the lab host: frank-conmon (frank-secondary's
llama-server settings in podman, port 7803) has its conmon SIGKILLed; the engine serves on,
re-parented, for a window and then dies (the unit restarts it). A deploy started inside that
window must wait or fail, never report the dying engine healthy.

The test proves the deploy really looked inside the window, by the clock: the kill, the orphaned
engine's death (sampled every 0.2 s), the no-op check's task (start and end, from the playbook's
own record) and the health gate's first look and green look (its report's wall-clock times). A try
whose deploy looked at the engine only after the window closed tested nothing: it is repeated
(killing the new engine's conmon), at most three times. The window and every look are printed."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime

import pytest
from lab_host import extra_endpoint_inventory, failures, on_host, playbook, remove_endpoint, require_lab_host

# A fault-matrix row: `make fault-matrix` runs it, `make test` does not (pytest.ini, fault_row).
pytestmark = [pytest.mark.lab, pytest.mark.fault_row]

require_lab_host()

NAME = "frank-conmon"
PORT = 7803
TRIES = 3


@pytest.fixture
def conmon_inventory(tmp_path, request):
    inventory = extra_endpoint_inventory(tmp_path, NAME, PORT, endpoint_probe=False, endpoint_health_timeout=60)
    request.addfinalizer(lambda: remove_endpoint(NAME))
    return inventory


def _epoch(stamp: str) -> float:
    """The JSON callback's task times: ISO 8601 in UTC, with a trailing Z."""
    return datetime.fromisoformat(stamp.rstrip("Z")).replace(tzinfo=UTC).timestamp()


def deploy(tmp_path, inventory) -> dict:
    """One deploy.yml run: its exit status, the deploy task's result, and the no-op check's
    task (its result, start and end)."""
    rc, _stats, out = playbook(tmp_path, "deploy.yml", inventory=inventory, limit=NAME)
    data = json.loads(out[out.index("{") :])
    tasks = [task for play in data["plays"] for task in play["tasks"] if NAME in task["hosts"] and not task["hosts"][NAME].get("skipped")]
    deploys = [task["hosts"][NAME] for task in tasks if "Deploy through the engine" in task["task"]["name"]]
    noop = next((task for task in tasks if "Prove whether this deploy is a no-op" in task["task"]["name"]), None)
    found = {"rc": rc, "result": deploys[-1] if deploys else {}, "out": out}
    if noop is not None:
        span = noop["task"]["duration"]
        found["noop"] = {"result": noop["hosts"][NAME], "start": _epoch(span["start"]), "end": _epoch(span["end"])}
    return found


def alive(pid: str) -> bool:
    return on_host("sh", "-c", f"test -d /proc/{pid} && echo yes", check=False) == "yes"


def kill_conmon_and_deploy(tmp_path, inventory) -> dict:
    """SIGKILL the engine container's conmon, start a deploy at once, time the engine's death."""
    engine, conmon = on_host("podman", "inspect", "--format", "{{.State.Pid}} {{.State.ConmonPid}}", NAME).split()[:2]
    killed_at = time.time()
    on_host("kill", "-KILL", conmon)
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.update(deploy(tmp_path, inventory)))
    worker.start()
    gone_at = None
    while time.time() - killed_at < 120:
        if not alive(engine):
            gone_at = time.time()
            break
        time.sleep(0.2)
    worker.join(timeout=600)
    assert not worker.is_alive(), "the deploy inside the dead-conmon window did not end within 600 s"
    return {**outcome, "engine": engine, "conmon": conmon, "killed_at": killed_at, "gone_at": gone_at}


def looks_inside(run: dict) -> list[str]:
    """The deploy's looks at the engine that fell inside the window [kill, engine gone]."""
    closes = run["gone_at"] if run["gone_at"] is not None else float("inf")
    inside = []
    noop = run.get("noop")
    if noop and run["killed_at"] <= noop["start"] and noop["end"] <= closes:
        inside.append("the no-op check")
    first = ((run["result"].get("steps") or {}).get("unit", {}).get("health") or run["result"].get("health") or {}).get("first_check_at") or 0
    if run["killed_at"] <= first <= closes:
        inside.append("the health gate's first look")
    return inside


def describe(run: dict) -> str:
    def at(stamp: float | None) -> str:
        return "never" if stamp is None else f"+{stamp - run['killed_at']:.1f} s"

    health = (run["result"].get("steps") or {}).get("unit", {}).get("health") or run["result"].get("health") or {}
    noop = run.get("noop") or {}
    return (
        f"dead conmon window: conmon {run['conmon']} killed at +0.0 s, its engine (PID {run['engine']}) gone at {at(run['gone_at'])}; "
        f"no-op check {at(noop.get('start'))} to {at(noop.get('end'))}; health gate first look {at(health.get('first_check_at') or None)} "
        f"({health.get('first_reason') or '-'}), green {at(health.get('healthy_at') or None)} on PID {health.get('listener_pid')}; deploy rc {run['rc']}"
        + (f" ({str(run['result'].get('msg'))[:300]})" if run["rc"] else "")
    )


def test_a_deploy_inside_the_dead_conmon_window_never_reports_the_engine_healthy(tmp_path, conmon_inventory):
    first = deploy(tmp_path, conmon_inventory)
    assert first["rc"] == 0, failures(first["out"]) or first["out"][-3000:]
    runs = []
    for _try in range(TRIES):
        run = kill_conmon_and_deploy(tmp_path, conmon_inventory)
        runs.append(run)
        print(describe(run))
        if looks_inside(run):
            break
        # The deploy looked only after the engine had died: nothing was tested. Wait for the unit's
        # new engine, then try again.
        on_host("sh", "-c", f"for i in $(seq 120); do curl -sf http://127.0.0.1:{PORT}/health >/dev/null && exit 0; sleep 1; done; exit 1")
    else:
        pytest.fail(f"in {TRIES} tries no deploy looked at the engine inside the dead-conmon window: " + " | ".join(describe(r) for r in runs))

    print(f"looked inside the window: {', '.join(looks_inside(run))}")
    noop = run.get("noop")
    if noop and "the no-op check" in looks_inside(run):
        # Inside the window the no-op proof does not hold: the orphan is no proof of a healthy unit.
        assert noop["result"].get("noop") is False and "conmon" in noop["result"].get("full_path_reason", ""), noop["result"]
    health = (run["result"].get("steps") or {}).get("unit", {}).get("health") or {}
    if run["rc"] == 0:
        # Green only for the engine the unit started again, never for the orphan of the dead conmon,
        # and only once the orphan had died.
        assert str(health.get("listener_pid")) != run["engine"], health
        assert run["gone_at"] is not None and health.get("healthy_at", 0) >= run["gone_at"], describe(run)
    else:
        message = run["result"].get("msg") or ""
        assert "conmon" in message or "crash-looping" in message, message
