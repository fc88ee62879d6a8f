"""The browser gate with a real Chromium over a local site served from a thread (no lab needed):
the homepage contract (cards, docs link), each verdict, the way home past a page that redirects
its top frame forever, and playbooks/browser_gate.yml run by ansible-playbook.

Seed 004_b3255cfc2200b40a.txt: "returned to the homepage between links with a bare page.goto,
and Plex Web (signed out ...) keeps redirecting the top frame: Chromium cancelled our goto with
net::ERR_ABORTED, outside the try, so the whole crawl died — once as a 420 s timeout in the deploy
gate, once at 5.4 s on the same link."
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from browser_site import Site, serve_site

from ansible_collections.frank.llm_fleet.plugins.module_utils.browser.gate import (
    DEFAULT_CHROMIUM,
    Crawl,
    GateOptions,
    chromium_args,
    is_navigation_abort,
    run_gate,
)

# Chromium and ansible-playbook: seconds each, no lab.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

if not os.access(DEFAULT_CHROMIUM, os.X_OK):
    if os.environ.get("CI"):
        pytest.fail(f"{DEFAULT_CHROMIUM} is missing: scripts/setup.sh installs Debian's chromium, which CI must have", pytrace=False)
    pytest.skip(f"{DEFAULT_CHROMIUM} is missing here (scripts/setup.sh installs it); CI fails instead of skipping", allow_module_level=True)


@pytest.fixture(scope="module")
def site():
    with serve_site() as url:
        yield url


@pytest.fixture
def browser_page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=DEFAULT_CHROMIUM, headless=True, args=chromium_args())
        try:
            # The crawl goes on in new pages of this page's context, as run_gate's does.
            yield browser.new_context().new_page()
        finally:
            browser.close()


def test_gate_judges_every_card_of_the_local_site(site, tmp_path):
    report = run_gate(GateOptions(url=f"{site}/", report_dir=str(tmp_path), settle_quiet_s=0.5))
    links = {link.url.removeprefix(site): link for link in report.links}
    assert list(links) == ["/", "/ok", "/loop", "/broken", "/login", "/elsewhere", "/docs"]
    assert [path for path, link in links.items() if link.ok] == ["/", "/ok", "/loop", "/docs"]
    assert links["/broken"].status == 500 and links["/broken"].reasons == ["status: the main response answered 500"]
    assert links["/login"].checks["no_login_form"] is False and links["/login"].checks["status"] is True
    assert links["/elsewhere"].checks["hostname"] is False and "landed on localhost, expected 127.0.0.1" in links["/elsewhere"].reasons[0]
    assert links["/loop"].final_url.startswith(f"{site}/loop?n=") and links["/loop"].navigations >= 5
    assert not report.ok
    stored = json.loads((tmp_path / "report.json").read_text())
    assert stored["links_failed"] == 3 and stored["links_total"] == 7 and stored["ok"] is False
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["link-03.png", "link-04.png", "link-05.png"]
    assert all((tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in pngs)


def test_a_credential_header_goes_to_the_homepage_origin_only(site, tmp_path):
    """/elsewhere redirects to the same server under another hostname: the bearer token sent to
    the homepage's origin must not follow it there."""
    Site.requests.clear()
    run_gate(GateOptions(url=f"{site}/", report_dir=str(tmp_path), settle_quiet_s=0.3, headers={"Authorization": "Bearer gate-token"}))
    home_host = site.split("//", 1)[1]
    to_home = [auth for host, auth in Site.requests if host == home_host]
    elsewhere = [auth for host, auth in Site.requests if host.startswith("localhost")]
    assert to_home and all(auth == "Bearer gate-token" for auth in to_home)
    assert elsewhere and not any(elsewhere), elsewhere


def test_an_empty_homepage_fails(site, tmp_path):
    report = run_gate(GateOptions(url=f"{site}/empty/", report_dir=str(tmp_path), settle_quiet_s=0.2))
    (home,) = report.links
    assert not report.ok and "links: no element matches" in home.reasons[0]


def test_bare_goto_home_dies_on_the_redirect_loop(site, browser_page):
    """The old crawl: a bare goto home after the loop page. The page's own navigation cancels ours
    within a few round trips (measured: 23 of 100 trips); before the rule that error ended the
    whole crawl. Playwright 1.65 with Chromium 156 words this cancel "is interrupted by another
    navigation" when the page's navigation is announced first, net::ERR_ABORTED (the seed's words)
    when our request is cancelled first: either is the class the way home re-issues."""
    errors = []
    for _trip in range(60):
        # Both gotos are bare: the loop page left behind by the last trip may still be navigating
        # when we go back to it, and that cancel is the same class as the one on the way home.
        try:
            browser_page.goto(f"{site}/loop", wait_until="commit")
            time.sleep(0.2)
            browser_page.goto(f"{site}/", wait_until="load", timeout=10000)
        except Exception as exc:  # the bare goto had no handler; the test records what killed it
            errors.append(str(exc).splitlines()[0])
            break
    assert errors, "60 bare returns home from the loop page all survived"
    assert is_navigation_abort(errors[0]), errors[0]


def fail_way_home(browser_page, site: str, leaving: str, times: int, error: str) -> None:
    """The first `times` returns home (to /good/) after a visit to a page whose path starts with
    `leaving` fail with Chromium's `error` (route.abort's name for it); every other request goes
    through. Routed on the context: the crawl goes home in a fresh page of it."""
    last_visit, failed = [""], []

    def handler(route):
        url = route.request.url
        if url != f"{site}/good/":
            last_visit[0] = url
            route.continue_()
        elif last_visit[0].startswith(f"{site}{leaving}") and len(failed) < times:
            failed.append(last_visit[0])
            route.abort(error)
        else:
            route.continue_()

    browser_page.context.route(f"{site}/**", handler)


def test_way_home_reissues_err_aborted_and_the_loop_passes(site, browser_page, tmp_path):
    """Chromium's net::ERR_ABORTED on the way home from the loop page (the seed's message, here
    made certain on the first two tries instead of waiting on the race) is re-issued and counted,
    and the loop page passes."""
    fail_way_home(browser_page, site, "/loop", times=2, error="aborted")
    report = Crawl(browser_page, GateOptions(url=f"{site}/good/", report_dir=str(tmp_path), settle_quiet_s=0.5)).run()
    links = {link.url.removeprefix(site): link for link in report.links}
    assert report.ok, [link.reasons for link in report.links]
    # Exactly the two forced aborts: the loop page is closed before the way home, so its own
    # redirects no longer race it (they did, in one run of the lab test out of a few dozen).
    assert links["/loop"].home_reissues == [f"Page.goto: net::ERR_ABORTED at {site}/good/"] * 2
    assert links["/ok"].home_reissues == [] and report.as_dict()["home_reissues"] == 2


def test_any_other_error_on_the_way_home_fails_that_link_only(site, browser_page, tmp_path):
    fail_way_home(browser_page, site, "/ok", times=1, error="connectionrefused")
    report = Crawl(browser_page, GateOptions(url=f"{site}/good/", report_dir=str(tmp_path), settle_quiet_s=0.3)).run()
    links = {link.url.removeprefix(site): link for link in report.links}
    assert list(links) == ["/good/", "/ok", "/loop", "/docs"]
    assert links["/ok"].reasons == ["way home: Page.goto: net::ERR_CONNECTION_REFUSED at " + f"{site}/good/"]
    assert links["/ok"].home_reissues == [] and links["/ok"].screenshot.endswith("link-01.png")
    assert links["/loop"].ok and links["/docs"].ok


def run_playbook(tmp_path: Path, inventory: dict) -> subprocess.CompletedProcess:
    inventory_path = tmp_path / "inventory.yml"
    inventory_path.write_text(yaml.safe_dump(inventory))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory_path), str(ROOT / "playbooks" / "browser_gate.yml")]
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=120)


def test_playbook_gates_each_homepage(site, tmp_path):
    hosts = {
        "home-good": {"homepage_url": f"{site}/good/", "browser_gate_report_dir": str(tmp_path / "good")},
        "home-mixed": {"homepage_url": f"{site}/", "browser_gate_report_dir": str(tmp_path / "mixed")},
    }
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {name: {**host_vars, **local} for name, host_vars in hosts.items()}
    proc = run_playbook(tmp_path, {"all": {"children": {"homepages": {"hosts": hosts}}}})
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert re.search(r"home-good\s*: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", proc.stdout), proc.stdout[-3000:]
    assert re.search(r"home-mixed\s*: ok=\d+\s+changed=0\s+unreachable=0\s+failed=1", proc.stdout), proc.stdout[-3000:]
    good = json.loads((tmp_path / "good" / "report.json").read_text())
    mixed = json.loads((tmp_path / "mixed" / "report.json").read_text())
    assert good["ok"] is True and good["links_total"] == 4
    assert mixed["ok"] is False and mixed["links_failed"] == 3
    assert "3 of 7 links fail" in proc.stdout


def test_playbook_skips_clearly_without_homepages(tmp_path):
    proc = run_playbook(tmp_path, {"all": {"children": {"homepages": {"hosts": {}}}}})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "no host in group homepages" in proc.stdout
