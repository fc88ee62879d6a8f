"""The browser gate against bad input: options that would make it judge nothing or the wrong
thing, a homepage whose links point at the controller's own files or the browser's pages, and a
credential in the extra headers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_browser_verdict import FakeClock, FakeSitePage

from ansible_collections.frank.llm_fleet.plugins.module_utils.browser.gate import Crawl, GateError, GateOptions, collect_links, write_report

HOME = "https://home.example/"
SECRET = "Bearer s3cret-gate-token"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"url": "home.example"}, "url:"),
        ({"url": "file:///etc/passwd"}, "url:"),
        ({"url": "javascript:alert(1)"}, "url:"),
        ({"link_selectors": ()}, "selectors:"),
        ({"guard_patterns": ("(unclosed",)}, "guard_patterns:"),
        ({"deadline_s": 0}, "deadline_s:"),
        ({"navigation_timeout_s": -1}, "navigation_timeout_s:"),
        ({"settle_quiet_s": 20.0}, "settle_quiet_s:"),
        ({"home_retries": -1}, "home_retries:"),
    ],
)
def test_bad_options_are_refused_naming_the_field(changes, field):
    with pytest.raises(GateError, match=f"^{field}"):
        GateOptions(**{"url": HOME, "report_dir": "/tmp/r", **changes})


def test_links_to_the_controllers_files_or_the_browsers_pages_are_never_crawled():
    hrefs = ["file:///etc/shadow", "chrome://settings", "javascript:fetch('/admin')", "data:text/html,<h1>x</h1>", "view-source:https://x/", "/ok"]
    assert collect_links(HOME, hrefs) == ["https://home.example/ok"]


def test_a_header_credential_never_reaches_the_report_or_a_repr(tmp_path):
    options = GateOptions(url=HOME, report_dir=str(tmp_path), settle_quiet_s=0.2, headers={"Authorization": SECRET})
    clock = FakeClock()
    report = Crawl(FakeSitePage({"https://home.example/b": 500}, ["/a", "/b"], clock), options, clock).run()
    text = Path(write_report(report, str(tmp_path))).read_text(encoding="utf-8")
    assert json.loads(text)["links_failed"] == 1
    assert "s3cret" not in text
    assert "s3cret" not in repr(options) and "s3cret" not in repr(report)
