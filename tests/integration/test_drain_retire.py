"""Deploys that never cut a client, for real on the lab host: frank-drain (frank-secondary's
llama-server settings, one slot of 32,768 tokens, port 7794) streams a long answer while a shape
change restarts it.
- With the drain (endpoint_drain_timeout 600), the restart waits until the stream has finished:
  the drain reports `drained` with 0 cut, and the client got every token and [DONE].
- With a 2 s drain, the restart goes ahead: `forced`, 1 cut, and the stream ends without [DONE].
- A description-only change rewrites the unit and reloads systemd, with the same engine process.
- An old runtime's unit listed in endpoint_retired_units is stopped, archived, masked, and
  restored by the documented commands.

The stream's length follows the machine (lab_stream.tokens_lasting: the engine's own decode
timings, measured first) so it outlasts the deploy's way to its drain; a try whose stream ended
before the drain (the drain saw nothing in flight: a precondition, not a verdict) repeats with a
stream meant to last twice as long. A stream is never meant to last more than a quarter of the
drain's timeout, so a slow machine drains later, never `forced`."""

import json
import re
import time

import pytest
from lab_host import extra_endpoint_inventory, failures, on_host, playbook, remove_endpoint, require_lab_host, unit_property, write_endpoint_vars
from lab_stream import ONE_DECODE_THREAD, STREAM_MIN_S, longer_stream, start_stream, stop_streams, stream_seconds, tokens_lasting, wait_streams_ended

# A fault-matrix row: `make fault-matrix` runs it, `make test` does not (pytest.ini, fault_row).
pytestmark = [pytest.mark.lab, pytest.mark.fault_row]

require_lab_host()

NAME = "frank-drain"
PORT = 7794
UNIT = f"{NAME}.service"
OLD = "frank-drain-old.service"
CTX = 32768
OUT = "/tmp/frank-drain-stream.out"
TRIES = 3
DRAIN_TIMEOUT = 600
SHAPE = {"ctx_size": CTX, "parallel": 1, "extra_args": ONE_DECODE_THREAD}


def remove_drain_endpoint() -> None:
    stop_streams(NAME, OUT)
    remove_endpoint(NAME)
    on_host("systemctl", "unmask", OLD, check=False)
    on_host("systemctl", "disable", "--now", OLD, check=False)
    on_host("rm", "-rf", f"/etc/systemd/system/{OLD}", "/var/lib/llm-fleet/archive")
    on_host("systemctl", "daemon-reload")


@pytest.fixture
def drain_inventory(tmp_path, request):
    base = {"endpoint_probe": False}
    inventory = extra_endpoint_inventory(tmp_path, NAME, PORT, endpoint_shape=SHAPE, **base)
    request.addfinalizer(remove_drain_endpoint)

    def write(**changes) -> None:
        write_endpoint_vars(inventory, NAME, PORT, endpoint_shape={**SHAPE, **changes.pop("shape", {})}, **base, **changes)

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


def stream_output() -> str:
    return on_host("cat", OUT)


def restart_under_a_stream(tmp_path, inventory, write, drain_timeout: int, restart_sec: int, deploy_s: float) -> tuple[dict, int, list[str]]:
    """A shape change (RestartSec) while a stream is in flight: (the unit step's drain, the
    stream's tokens, what each try saw). The stream is meant to last lab_stream.stream_seconds at
    the engine's measured speed; a try whose stream ended on its own first (before the drain, or
    inside a drain meant to give up) repeats with lab_stream.longer_stream, and RestartSec one
    more, so the deploy is a change again."""
    seen = []
    seconds = stream_seconds(deploy_s, DRAIN_TIMEOUT)
    for attempt in range(TRIES):
        tokens = tokens_lasting(PORT, NAME, seconds, CTX - 64)
        start_stream(tmp_path, NAME, PORT, tokens, OUT)
        began = time.monotonic()
        write(shape={"restart_sec": restart_sec + attempt}, endpoint_drain_timeout=drain_timeout)
        _stats, steps = deploy(tmp_path, inventory)
        drain = steps["unit"]["drain"]
        seen.append(f"{tokens} tokens (~{seconds} s): drain {drain}, deploy {time.monotonic() - began:.1f} s")
        # A try says nothing when the stream ended on its own first: before the drain began, or, for
        # a drain meant to give up (shorter than any stream), inside its few seconds (the stream
        # got [DONE], so no cut was due).
        ended_itself = not drain.get("in_flight_at_start") or (
            drain_timeout < STREAM_MIN_S and drain.get("outcome") == "drained" and stream_output().rstrip().endswith("data: [DONE]")
        )
        if not ended_itself:
            return drain, tokens, seen
        seconds = longer_stream(seconds, DRAIN_TIMEOUT)
        wait_streams_ended(NAME)
    raise AssertionError(f"in {TRIES} tries every stream ended on its own before the drain could judge it: {seen}")


def test_the_drain_waits_for_a_stream_and_cosmetic_and_retired_units_behave(tmp_path, drain_inventory):
    inventory, write = drain_inventory
    began = time.monotonic()
    deploy(tmp_path, inventory)
    deploy_s = time.monotonic() - began
    assert unit_property(UNIT, "ActiveState") == "active"

    # A shape change (RestartSec) while a stream is in flight: the restart waits for it.
    drain, tokens, seen = restart_under_a_stream(tmp_path, inventory, write, DRAIN_TIMEOUT, 3, deploy_s)
    print(f"drained restart: {seen}")
    assert drain["outcome"] == "drained" and drain["cut"] == 0 and drain["in_flight_at_start"] == 1, drain
    out = stream_output()
    assert out.rstrip().endswith("data: [DONE]"), out[-300:]
    assert re.search(rf'"predicted_n":\s*{tokens}\b', out), out[-300:]  # every token reached the client

    # A 2 s drain gives up: the restart cuts the stream, and says so.
    drain, _tokens, seen = restart_under_a_stream(tmp_path, inventory, write, 2, 6, deploy_s)
    print(f"forced restart: {seen}")
    assert drain["outcome"] == "forced" and drain["cut"] == 1, drain
    time.sleep(1)
    assert "data: [DONE]" not in stream_output()
    restart_sec = 6 + len(seen) - 1

    # Documentation only: the unit file and systemd change, the engine process does not.
    pid = unit_property(UNIT, "MainPID")
    write(shape={"restart_sec": restart_sec}, endpoint_drain_timeout=2, endpoint_description="drain test endpoint")
    stats, steps = deploy(tmp_path, inventory)
    assert steps["unit"]["cosmetic"] and stats["changed"] > 0
    assert unit_property(UNIT, "MainPID") == pid
    assert unit_property(UNIT, "Description") == f"{NAME} (llamacpp, podman): drain test endpoint"

    # An old runtime's unit: retired (stopped, archived, masked) by the next deploy, then restored by hand.
    old_unit = "[Unit]\\nDescription=old runtime\\n[Service]\\nExecStart=/bin/sleep infinity\\n[Install]\\nWantedBy=multi-user.target\\n"
    on_host("sh", "-c", f"printf '{old_unit}' > /etc/systemd/system/{OLD}")
    on_host("systemctl", "daemon-reload")
    on_host("systemctl", "enable", "--now", OLD)
    write(shape={"restart_sec": restart_sec}, endpoint_drain_timeout=2, endpoint_description="drain test endpoint", endpoint_retired_units=[OLD])
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
