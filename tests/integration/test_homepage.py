"""The homepage role for real on the lab host (inventories/lab, group homepages): Debian's caddy
serves the site generated from the lab endpoints' shapes on the host's own address, the
controller reads the same docs page a user's browser would, a second run changes nothing, and a
shape change shows in check mode without touching the served file."""

from __future__ import annotations

import urllib.request

import pytest
import yaml
from lab_host import LAB_INVENTORY, failures, inventory_with_shape, lab_addresses, lab_shape, on_host, playbook, require_lab_host

from ansible_collections.frank.llm_fleet.plugins.filter.fleet_site import fleet_endpoints, homepage_site

pytestmark = pytest.mark.lab

require_lab_host()

PORT = 8088
ROOT = "/var/www/frank-homepage"


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        return answer.read().decode()


def _expected(inventory=LAB_INVENTORY) -> dict[str, str]:
    names = ["frank-primary", "frank-secondary"]
    hostvars = {n: {"ansible_host": "llm-fleet-lab-host1", "endpoint_shape": lab_shape(n, inventory)} for n in names}
    services = yaml.safe_load((LAB_INVENTORY / "group_vars" / "homepages" / "main.yml").read_text())["homepage_services"]
    return homepage_site(fleet_endpoints(names, hostvars), services, "frank fleet (lab)")


def test_homepage_serves_the_generated_site_and_reruns_clean(tmp_path):
    rc, stats, out = playbook(tmp_path, "companions.yml", limit="homepage")
    assert rc == 0, failures(out) or out[-3000:]
    own = lab_addresses()[0]
    expected = _expected()
    # What the controller (a user's browser) reads through Caddy is the generated file, byte for byte.
    assert _fetch(f"http://{own}:{PORT}/docs") == expected["docs.html"]
    assert _fetch(f"http://{own}:{PORT}/") == expected["index.html"]
    assert _fetch(f"http://{own}:{PORT}/admin") == expected["admin.html"]
    assert 'id="model-frank-secondary"' in expected["docs.html"]
    # Caddy's site file is imported once, however often the role runs.
    assert on_host("grep", "-c", "frank-homepage.caddy", "/etc/caddy/Caddyfile") == "1"

    rc, stats, out = playbook(tmp_path, "companions.yml", limit="homepage")
    assert rc == 0 and stats["changed"] == 0, failures(out) or out[-3000:]


def test_a_shape_change_shows_in_check_mode_and_touches_nothing(tmp_path):
    rc, _stats, out = playbook(tmp_path, "companions.yml", limit="homepage")
    assert rc == 0, failures(out) or out[-3000:]
    before = on_host("sha256sum", f"{ROOT}/docs.html")
    shape = {**lab_shape("frank-secondary"), "ctx_size": 4096}
    inventory = inventory_with_shape(tmp_path, "frank-secondary", shape)
    rc, stats, out = playbook(tmp_path, "companions.yml", "--check", "--diff", limit="homepage", inventory=inventory)
    assert rc == 0, failures(out) or out[-3000:]
    assert stats["changed"] >= 1
    assert on_host("sha256sum", f"{ROOT}/docs.html") == before
