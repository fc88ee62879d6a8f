"""The browser gate against the lab's homepage (inventories/lab, group homepages: the homepage role
served by Debian's caddy on the lab host), as playbooks/companions.yml runs it after the deploy.

Two more cards point at pages the controller serves from a thread (tests/integration/browser_site.py):
one that redirects its top frame forever, as Plex signed out does (seeds/004: "keeps redirecting
the top frame: Chromium cancelled our goto with net::ERR_ABORTED, outside the try, so the whole
crawl died — once as a 420 s timeout in the deploy gate"), which must pass, and one answering 500,
which must fail the deploy play. Without them the lab homepage passes, by the deploy and alone."""

from __future__ import annotations

import json

import pytest
import yaml
from browser_site import serve_site
from lab_host import LAB_INVENTORY, failures, playbook, require_lab_host

pytestmark = pytest.mark.lab

require_lab_host()

SERVICES = yaml.safe_load((LAB_INVENTORY / "group_vars" / "homepages" / "main.yml").read_text())["homepage_services"]


def report(directory) -> dict:
    return json.loads((directory / "report.json").read_text())


def test_the_deploy_fails_on_a_500_card_and_passes_the_redirect_loop(tmp_path):
    with serve_site() as site:
        cards = [
            {"name": "Plex (signed out)", "url": f"{site}/loop", "audience": "user", "description": "Redirects its top frame forever."},
            {"name": "Broken", "url": f"{site}/broken", "audience": "user", "description": "Answers 500."},
        ]
        gate_dir = tmp_path / "with-cards"
        extra = {"homepage_services": SERVICES + cards, "browser_gate_report_dir": str(gate_dir)}
        rc, stats, out = playbook(tmp_path, "companions.yml", extra_vars=extra, limit="homepage")
    assert rc != 0 and stats["failures"] == 1, failures(out) or str(stats)
    links = {link["url"]: link for link in report(gate_dir)["links"]}
    assert links[f"{site}/loop"]["ok"] and links[f"{site}/loop"]["navigations"] >= 5
    assert links[f"{site}/broken"]["reasons"] == ["status: the main response answered 500"]
    assert (gate_dir / links[f"{site}/broken"]["screenshot"].rsplit("/", 1)[1]).exists()
    assert [url for url, link in links.items() if not link["ok"]] == [f"{site}/broken"]
    assert any(url.endswith(":8088/") for url in links) and any("/docs" in url for url in links)


def test_the_lab_homepage_passes_by_the_deploy_and_alone(tmp_path):
    rc, stats, out = playbook(tmp_path, "companions.yml", extra_vars={"browser_gate_report_dir": str(tmp_path / "deploy")}, limit="homepage")
    assert rc == 0, failures(out) or out[-3000:]
    deployed = report(tmp_path / "deploy")
    assert deployed["ok"] and deployed["links_total"] >= 2, deployed
    rc, stats, out = playbook(tmp_path, "browser_gate.yml", extra_vars={"browser_gate_report_dir": str(tmp_path / "alone")}, limit="homepage")
    assert rc == 0 and stats["changed"] == 0, failures(out) or out[-3000:]
    assert report(tmp_path / "alone")["ok"]
