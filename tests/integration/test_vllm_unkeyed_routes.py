"""A keyed vLLM endpoint on the LAN answers nothing but /health, /ping and /metrics without its
key, for real on the lab host: a copy of inventories/lab gains frank-vkeyed (frank-primary's vLLM
settings on its own port) with a vaulted key, bind 0.0.0.0 and the controller as its one allowed
network. vLLM 0.32's own key check covers only /v1, /v2, /inference and /cohere; the collection's
key guard (--middleware) covers the rest. From the controller, over the LAN:
- without the key, /tokenize, /detokenize, /invocations and /v1/models get 401 (without the guard
  /tokenize answers 200 with the prompt's tokens);
- with the key, /tokenize and /invocations answer 200;
- /health and /metrics answer without the key (the health gate and Prometheus read them);
- the guard file on the host is root's and read-only, and the container sees it read-only."""

import json
import subprocess
import urllib.error
import urllib.request

import pytest
from lab_host import BIN, env, extra_endpoint_inventory, failures, lab_addresses, on_host, playbook, remove_endpoint, require_lab_host, unit_property

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-vkeyed"
PORT = 7793
UNIT = f"{NAME}.service"
KEY = "sk-lab-vkeyed-4b9e2a7c31"
GUARD = "/usr/local/lib/llm-fleet/engine-python/llm_fleet_vllm_key_guard.py"


def vaulted(key: str, password_file) -> str:
    proc = subprocess.run(
        [str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(password_file), "--stdin-name", "endpoint_api_key"],
        input=key,
        capture_output=True,
        text=True,
        env=env(),
        check=True,
    )
    return proc.stdout


@pytest.fixture
def keyed_vllm(tmp_path, request):
    password = tmp_path / "vault-pass"
    password.write_text("lab-throwaway-vault-password\n")
    _own, controller = lab_addresses()
    inventory = extra_endpoint_inventory(
        tmp_path, NAME, PORT, template="frank-primary", endpoint_shape={"bind": "0.0.0.0"}, endpoint_allowed_networks=[f"{controller}/32"]
    )
    request.addfinalizer(lambda: remove_endpoint(NAME))
    with open(inventory / "host_vars" / f"{NAME}.yml", "a", encoding="utf-8") as host_vars:
        host_vars.write(vaulted(KEY, password))
    return inventory, password


def request(url: str, body: dict | None = None, key: str = "") -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=120) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def test_a_keyed_vllm_endpoint_serves_no_route_without_the_key(tmp_path, keyed_vllm):
    inventory, password = keyed_vllm
    rc, _stats, out = playbook(tmp_path, "deploy.yml", "--vault-password-file", str(password), inventory=inventory, limit=NAME)
    assert rc == 0, failures(out) or out[-3000:]
    assert unit_property(UNIT, "ActiveState") == "active"
    own, _controller = lab_addresses()
    base = f"http://{own}:{PORT}"
    tokenize = {"model": NAME, "prompt": "hello there"}
    invocation = {"model": NAME, "prompt": "hello", "max_tokens": 2, "temperature": 0}

    unkeyed = {
        "/tokenize": request(f"{base}/tokenize", tokenize)[0],
        "/detokenize": request(f"{base}/detokenize", {"model": NAME, "tokens": [1, 2]})[0],
        "/invocations": request(f"{base}/invocations", invocation)[0],
        "/v1/models": request(f"{base}/v1/models")[0],
    }
    assert unkeyed == dict.fromkeys(unkeyed, 401), unkeyed
    assert request(f"{base}/tokenize", tokenize, key="sk-wrong")[0] == 401

    status, body = request(f"{base}/tokenize", tokenize, key=KEY)
    assert status == 200 and json.loads(body)["count"] > 0, body[:300]
    assert request(f"{base}/invocations", invocation, key=KEY)[0] == 200
    assert request(f"{base}/health")[0] == 200
    status, body = request(f"{base}/metrics")
    assert status == 200 and b"vllm:num_requests_running" in body

    assert on_host("stat", "-c", "%U:%G %a", GUARD) == "root:root 644"
    mounts = json.loads(on_host("podman", "inspect", NAME, "--format", "{{json .Mounts}}"))
    [guard_mount] = [m for m in mounts if m["Destination"] == "/usr/local/lib/llm-fleet/engine-python"]
    assert guard_mount["RW"] is False
