"""A key rotation does not cut the streams in flight, for real on the lab host: frank-rotate
(frank-secondary's llama-server settings, one slot of 32,768 tokens, port 7801, a key) streams a
long answer with the old key while a deploy rotates the key. The drain reads /metrics with the
key the running engine holds (the previous one, from the kept last-good secrets), waits for the
stream, and only then restarts: the client gets every token and [DONE]; afterwards the old key
gets 401 and the new one is served. Before the fix the drain read with the new key, got 401,
reported `unknown` and restarted at once (the lab fault matrix cut a 30,000-token stream)."""

import json
import re
import subprocess
import time

import pytest
from lab_host import HOST, env, extra_endpoint_inventory, failures, on_host, playbook, remove_endpoint, require_lab_host

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-rotate"
PORT = 7801
# Long enough to outlast the rotation deploy's way to its drain (about 20 s) on an idle machine:
# the lab's tiny model decodes 3,000 tokens in 1.7 s but slows with depth (32,747 took 259 s), so
# 14,000 take about 50 s. Its trained window caps a slot at 32,768 tokens.
STREAM_TOKENS = 14_000
CTX = 32_768
KEY_OLD = "sk-lab-rotate-old-0123456789abcdef"
KEY_NEW = "sk-lab-rotate-new-fedcba9876543210"
OUT = "/tmp/frank-rotate-stream.out"


@pytest.fixture
def rotate_inventory(tmp_path, request):
    base = {"endpoint_probe": False, "endpoint_drain_timeout": 600}
    shape = {"ctx_size": CTX, "parallel": 1}
    inventory = extra_endpoint_inventory(tmp_path, NAME, PORT, endpoint_shape=shape, endpoint_api_key=KEY_OLD, **base)

    def cleanup() -> None:
        on_host("pkill", "-f", "frank-rotate-stream", check=False)
        remove_endpoint(NAME)
        on_host("rm", "-f", OUT, "/tmp/frank-rotate-stream.sh", f"/etc/llm-fleet/{NAME}.last-good-secrets.json", check=False)

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
    deploy(tmp_path, rotate_inventory)
    assert status_with(KEY_OLD) == "200"

    body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": STREAM_TOKENS, "ignore_eos": True, "stream": True})
    script = tmp_path / "frank-rotate-stream.sh"
    script.write_text(
        f"curl -sN -H 'Authorization: Bearer {KEY_OLD}' -H 'Content-Type: application/json' -d '{body}' "
        f"http://127.0.0.1:{PORT}/v1/chat/completions > {OUT} 2>&1\n"
    )
    subprocess.run(["podman", "cp", str(script), f"{HOST}:/tmp/frank-rotate-stream.sh"], env=env(), check=True)
    subprocess.run(["podman", "exec", "-d", HOST, "sh", "/tmp/frank-rotate-stream.sh"], env=env(), check=True)
    deadline = time.monotonic() + 30
    while "llamacpp:requests_processing 1" not in on_host("curl", "-s", "-H", f"Authorization: Bearer {KEY_OLD}", f"http://127.0.0.1:{PORT}/metrics"):
        assert time.monotonic() < deadline, on_host("cat", OUT, check=False)[-300:]
        time.sleep(0.2)

    # Rotate the key while the stream runs.
    from lab_host import write_endpoint_vars

    write_endpoint_vars(
        rotate_inventory,
        NAME,
        PORT,
        endpoint_shape={"ctx_size": CTX, "parallel": 1},
        endpoint_api_key=KEY_NEW,
        endpoint_probe=False,
        endpoint_drain_timeout=600,
    )
    began = time.monotonic()
    steps = deploy(tmp_path, rotate_inventory)
    took = time.monotonic() - began
    drain = steps["unit"]["drain"]
    print(f"rotation deploy under a {STREAM_TOKENS}-token stream: {took:.1f} s, drain {drain}")
    assert drain["outcome"] == "drained" and drain["cut"] == 0 and drain["in_flight_at_start"] == 1, drain
    out = on_host("cat", OUT)
    assert out.rstrip().endswith("data: [DONE]"), out[-300:]
    assert re.search(rf'"predicted_n":\s*{STREAM_TOKENS}\b', out), out[-300:]  # every token reached the client
    assert status_with(KEY_OLD) == "401" and status_with(KEY_NEW) == "200"
    assert KEY_OLD not in json.dumps(steps) and KEY_NEW not in json.dumps(steps)
