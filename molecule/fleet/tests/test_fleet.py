"""After deploy_fleet.yml: each host serves its endpoints, each under its own unit."""

import json
import shlex

import pytest

# platform -> [(endpoint, port)]; the endpoint's unit is ENDPOINT.service (molecule.yml's inventory).
ENDPOINTS = {
    "llm-fleet-molecule-fleet-a": [("frank-primary", 7770)],
    "llm-fleet-molecule-fleet-b": [("frank-secondary", 7771), ("frank-large", 7772)],
}
LARGE_HOST, LARGE_PORT = "llm-fleet-molecule-fleet-b", 7772
# lab/make_tiny_gguf.py: Geometry.n_ctx_train, the longest context the tiny models allow.
TINY_N_CTX_TRAIN = 32768


def _get(host, port, path):
    return json.loads(host.check_output(f"curl -sf http://127.0.0.1:{port}{path}"))


def test_each_host_serves_its_endpoints(host):
    for served, port in ENDPOINTS[host.backend.name]:
        assert host.check_output(f"systemctl show -p ActiveState --value {served}.service") == "active"
        assert [m["id"] for m in _get(host, port, "/v1/models")["data"]] == [served]
        record = json.loads(host.file(f"/var/lib/llm-fleet/{served}/last-good.json").content_string)
        assert record["shape"]["served_id"] == served


def test_llamacpp_metrics_are_on(host):
    for _served, port in ENDPOINTS[host.backend.name]:
        assert "llamacpp:" in host.check_output(f"curl -s http://127.0.0.1:{port}/metrics")


def test_hosts_run_only_their_own_endpoints(host):
    mine = {served for served, _port in ENDPOINTS[host.backend.name]}
    for endpoints in ENDPOINTS.values():
        for served, _port in endpoints:
            if served not in mine:
                assert not host.file(f"/etc/systemd/system/{served}.service").exists


def test_frank_large_is_one_native_slot_with_a_drafter(host):
    if host.backend.name != LARGE_HOST:
        pytest.skip(f"frank-large runs on {LARGE_HOST}")
    # Native: the root unit runs the binary itself, no container.
    exec_start = host.check_output("systemctl show -p ExecStart --value frank-large.service")
    assert "path=/usr/bin/llama-server" in exec_start and "podman" not in exec_start
    props = _get(host, LARGE_PORT, "/props")
    assert props["total_slots"] == 1
    slots = _get(host, LARGE_PORT, "/slots")
    assert len(slots) == 1
    assert slots[0]["n_ctx"] == TINY_N_CTX_TRAIN
    assert slots[0]["speculative"] is True  # the drafter loaded


def test_frank_large_answers_a_chat_completion(host):
    if host.backend.name != LARGE_HOST:
        pytest.skip(f"frank-large runs on {LARGE_HOST}")
    # Random weights: ignore_eos keeps greedy decoding from stopping at once.
    body = json.dumps({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "ignore_eos": True})
    answer = json.loads(
        host.check_output(f"curl -sf -H 'Content-Type: application/json' -d {shlex.quote(body)} http://127.0.0.1:{LARGE_PORT}/v1/chat/completions")
    )
    assert answer["model"] == "frank-large"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 4
