"""A no-op redeploy costs clients nothing, measured with the load harness (benchmarks/load_harness.py,
the openai client streaming at a steady rate): frank-load (llama-server on the lab host, bound to the
LAN with a key, the controller its one allowed client) serves a steady load while the same shape is
deployed again; not one request may be refused, cut or failed."""

import sys

import pytest
from lab_host import ROOT, extra_endpoint_inventory, failures, lab_addresses, playbook, remove_endpoint, require_lab_host

sys.path.insert(0, str(ROOT / "benchmarks"))
from load_harness import LoadHarness

pytestmark = pytest.mark.lab

require_lab_host()

NAME = "frank-load"
PORT = 7796
KEY = "sk-lab-load-harness"


@pytest.fixture
def load_inventory(tmp_path, request):
    _own, controller = lab_addresses()
    request.addfinalizer(lambda: remove_endpoint(NAME))
    return extra_endpoint_inventory(
        tmp_path,
        NAME,
        PORT,
        endpoint_shape={"bind": "0.0.0.0", "parallel": 4},
        endpoint_allowed_networks=[f"{controller}/32"],
        endpoint_api_key=KEY,
        endpoint_probe=False,
    )


def test_a_noop_redeploy_under_load_refuses_cuts_and_fails_nothing(tmp_path, load_inventory):
    rc, _stats, out = playbook(tmp_path, "deploy.yml", inventory=load_inventory, limit=NAME)
    assert rc == 0, failures(out)
    own, _controller = lab_addresses()
    with LoadHarness(f"http://{own}:{PORT}/v1", NAME, KEY, rate_per_s=4, max_tokens=200) as harness:
        rc, stats, out = playbook(tmp_path, "deploy.yml", inventory=load_inventory, limit=NAME)
    report = harness.report.summary()
    assert rc == 0 and stats["changed"] == 0, failures(out)
    assert report["ok"] >= 10 and report["ok"] == report["requests"], report
    assert (report["truncated"], report["refused"], report["failed"]) == (0, 0, 0), report
