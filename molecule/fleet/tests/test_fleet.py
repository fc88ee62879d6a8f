"""After deploy_fleet.yml: each host serves its endpoint, under its own unit."""

import json

ENDPOINTS = {
    "llm-fleet-molecule-fleet-a": ("frank-primary.service", 7770, "frank-primary"),
    "llm-fleet-molecule-fleet-b": ("frank-secondary.service", 7771, "frank-secondary"),
}


def test_each_host_serves_its_endpoint(host):
    unit, port, served = ENDPOINTS[host.backend.name]
    assert host.check_output(f"systemctl show -p ActiveState --value {unit}") == "active"
    models = json.loads(host.check_output(f"curl -s http://127.0.0.1:{port}/v1/models"))
    assert [m["id"] for m in models["data"]] == [served]
    record = json.loads(host.file(f"/var/lib/llm-fleet/{served}/last-good.json").content_string)
    assert record["shape"]["served_id"] == served


def test_llamacpp_metrics_are_on(host):
    _unit, port, _served = ENDPOINTS[host.backend.name]
    assert "llamacpp:" in host.check_output(f"curl -s http://127.0.0.1:{port}/metrics")


def test_hosts_run_only_their_own_endpoint(host):
    mine, _port, _served = ENDPOINTS[host.backend.name]
    for unit, _p, _s in ENDPOINTS.values():
        if unit != mine:
            assert not host.file(f"/etc/systemd/system/{unit}").exists
