"""A key rotation does not cut the streams in flight, for real on the lab host: frank-rotate
(frank-secondary's llama-server settings, one slot of 32,768 tokens, port 7801, a key) streams a
long answer with the old key while a deploy rotates the key. The drain reads /metrics with the
key the running engine holds (the previous one, from the kept last-good secrets), waits for the
stream, and only then restarts: the client gets every token and [DONE]; afterwards the old key
gets 401 and the new one is served. Before the fix the drain read with the new key, got 401,
reported `unknown` and restarted at once (the lab fault matrix cut a 30,000-token stream).

The stream must outlast the rotation deploy's way to its drain: its length follows the machine
(lab_stream.tokens_lasting, from the engine's own decode timings, for about 1.5 times the first
deploy's time, at least 40 s, at most a quarter of the drain's timeout), and a try whose stream
ended before the drain (the drain saw nothing in flight: a precondition, not a verdict) rotates
again, to a third key, under a stream meant to last twice as long (still at most that quarter)."""

import json
import re
import time

import pytest
from lab_host import extra_endpoint_inventory, failures, on_host, playbook, remove_endpoint, require_lab_host, write_endpoint_vars
from lab_stream import ONE_DECODE_THREAD, longer_stream, start_stream, stop_streams, stream_seconds, tokens_lasting, wait_streams_ended

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-rotate"
PORT = 7801
CTX = 32_768  # the tiny model's trained window caps a slot here
TRIES = 3
KEYS = ["sk-lab-rotate-old-0123456789abcdef", "sk-lab-rotate-new-fedcba9876543210", "sk-lab-rotate-3rd-00112233445566778", "sk-lab-rotate-4th-99aabbccddeeff00"]
OUT = "/tmp/frank-rotate-stream.out"
DRAIN_TIMEOUT = 600
SHAPE = {"ctx_size": CTX, "parallel": 1, "extra_args": ONE_DECODE_THREAD}
BASE = {"endpoint_probe": False, "endpoint_drain_timeout": DRAIN_TIMEOUT}


@pytest.fixture
def rotate_inventory(tmp_path, request):
    inventory = extra_endpoint_inventory(tmp_path, NAME, PORT, endpoint_shape=SHAPE, endpoint_api_key=KEYS[0], **BASE)

    def cleanup() -> None:
        stop_streams(NAME, OUT)
        remove_endpoint(NAME)
        on_host("rm", "-f", f"/etc/llm-fleet/{NAME}.last-good-secrets.json", check=False)

    request.addfinalizer(cleanup)
    return inventory


def deploy(tmp_path, inventory):
    rc, _stats, out = playbook(tmp_path, "deploy.yml", inventory=inventory, limit=NAME)
    assert rc == 0, failures(out) or out[-3000:]
    data = json.loads(out[out.index("{") :])
    return next(
        task["hosts"][NAME]["steps"]
        for play in data["plays"]
        for task in play["tasks"]
        if "Deploy through the engine" in task["task"]["name"] and "steps" in task["hosts"].get(NAME, {})
    )


def status_with(key: str) -> str:
    return on_host("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Authorization: Bearer {key}", f"http://127.0.0.1:{PORT}/v1/models")


def test_a_key_rotation_waits_for_the_stream_it_would_cut(tmp_path, rotate_inventory):
    began = time.monotonic()
    deploy(tmp_path, rotate_inventory)
    seconds = stream_seconds(time.monotonic() - began, DRAIN_TIMEOUT)
    assert status_with(KEYS[0]) == "200"

    seen = []
    for attempt in range(TRIES):
        old, new = KEYS[attempt], KEYS[attempt + 1]
        tokens = tokens_lasting(PORT, NAME, seconds, CTX - 64, key=old)
        start_stream(tmp_path, NAME, PORT, tokens, OUT, key=old)
        # Rotate the key while the stream runs.
        write_endpoint_vars(rotate_inventory, NAME, PORT, endpoint_shape=SHAPE, endpoint_api_key=new, **BASE)
        began = time.monotonic()
        steps = deploy(tmp_path, rotate_inventory)
        took = time.monotonic() - began
        drain = steps["unit"]["drain"]
        seen.append(f"rotation deploy under a {tokens}-token stream (~{seconds} s): {took:.1f} s, drain {drain}")
        if drain.get("in_flight_at_start"):
            break
        # The stream ended before the drain: nothing was tested; rotate again under a longer one.
        seconds = longer_stream(seconds, DRAIN_TIMEOUT)
        wait_streams_ended(NAME)
    else:
        pytest.fail(f"in {TRIES} tries every stream ended before the rotation's drain: {seen}")
    print("; ".join(seen))
    assert drain["outcome"] == "drained" and drain["cut"] == 0 and drain["in_flight_at_start"] == 1, drain
    out = on_host("cat", OUT)
    assert out.rstrip().endswith("data: [DONE]"), out[-300:]
    assert re.search(rf'"predicted_n":\s*{tokens}\b', out), out[-300:]  # every token reached the client
    assert status_with(old) == "401" and status_with(new) == "200"
    assert old not in json.dumps(steps) and new not in json.dumps(steps)
