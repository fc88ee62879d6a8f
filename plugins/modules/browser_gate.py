#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: browser_gate
short_description: Crawl a homepage and every service it links with a real Chromium; fail when a link fails
version_added: 0.1.0
description:
  - The post-deploy browser gate. Playwright drives Debian's Chromium (headless) over the homepage
    O(url), every link matching O(selectors) on it (the service cards and the docs page) and judges
    each one.
  - A link passes when the guard settled (its top-frame URL stayed off every O(guard_patterns) for
    O(settle_quiet) seconds within O(settle_timeout)), its final hostname is the link's own or one of
    O(allowed_hosts), no frame shows a login form (a password input or authentik's C(uidField)) and
    its main response answered below 500.
  - Between links the crawl returns to the homepage in a fresh page of the same browser context,
    leaving the judged page behind until the gate ends, since an app that keeps redirecting its top
    frame cancels a navigation issued in its page. A cancel on the way home (C(net::ERR_ABORTED),
    or in Playwright's words for the same cancel C(is interrupted by another navigation)) is the
    only error re-issued, at most O(home_retries) times, each counted in the result. Any other
    error fails the link the crawl was returning from, not the crawl. O(deadline) bounds the whole
    gate.
  - Writes C(report.json) and a PNG screenshot per failing link into O(report_dir), then fails when
    any link failed.
  - Runs on the controller (C(delegate_to=localhost)) with an interpreter that has the Python
    package C(playwright) (C(ansible_python_interpreter={{ ansible_playbook_python }})).
author:
  - frank.llm_fleet maintainers (@frank-ops)
attributes:
  check_mode:
    support: full
    description: The gate only reads the pages, so check mode runs it in full (it still writes its report).
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  idempotent:
    support: full
    description: Never reports a change; each run crawls again.
options:
  url:
    description: The homepage to start from, as the browser reaches it (http or https).
    type: str
    required: true
  selectors:
    description:
      - CSS selectors of the links to crawl on the homepage; each page their C(href)s name is
        crawled once (hrefs differing only in the fragment are one page).
      - The default is the homepage contract, the service cards and the docs link.
    type: list
    elements: str
    default: ['a.card', 'a[href$="/docs"]', 'a.docs-link']
  allowed_hosts:
    description: Hostnames a link may end on besides its own (an app that hands over to its own sign-in host).
    type: list
    elements: str
    default: []
  guard_patterns:
    description:
      - Regular expressions (searched in the full URL) of the auth guard's pages; a link is settled
        once its top frame stays off all of them. The default is authentik's forward auth.
    type: list
    elements: str
    default: ['/outpost\.goauthentik\.io/', '/if/flow/', '/application/o/authorize/']
  report_dir:
    description: Directory on the controller for C(report.json) and the failing links' screenshots (created).
    type: path
    required: true
  navigation_timeout:
    description: Seconds one navigation may take.
    type: float
    default: 15
  settle_timeout:
    description: Seconds a link has to settle off the guard.
    type: float
    default: 10
  settle_quiet:
    description: Seconds the top frame must stay off the guard to count as settled.
    type: float
    default: 1
  deadline:
    description: Seconds for the whole gate; links not reached by then fail.
    type: float
    default: 300
  home_retries:
    description: How many times the way home is re-issued after a navigation abort.
    type: int
    default: 5
  chromium_path:
    description: The Chromium executable (Playwright's own browser download is not used).
    type: path
    default: /usr/bin/chromium
  validate_certs:
    description: Refuse TLS certificates the browser does not trust.
    type: bool
    default: true
  headers:
    description: Extra HTTP headers sent with every request (never returned or written to the report).
    type: dict
    default: {}
notes:
  - The verdict, the way-home rule and the report - docs/browser_gate.md in the collection.
  - Needs the Python package C(playwright) (requirements.txt) and Debian's C(chromium) (scripts/setup.sh).
"""

EXAMPLES = r"""
- name: Gate the deploy on the homepage and every service it links
  frank.llm_fleet.browser_gate:
    url: "{{ homepage_url }}"
    report_dir: "{{ playbook_dir }}/../reports/browser-gate/{{ inventory_hostname }}"
  delegate_to: localhost
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"

- name: A lab homepage behind a self-signed certificate, with Plex handing over to plex.tv
  frank.llm_fleet.browser_gate:
    url: https://home.lab.example/
    report_dir: /tmp/browser-gate
    validate_certs: false
    allowed_hosts: [app.plex.tv]
    deadline: 120
  delegate_to: localhost
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
"""

RETURN = r"""
ok:
  description: Every link passed.
  returned: success or when the gate ran
  type: bool
links:
  description: The verdict of each link, the homepage first.
  returned: success or when the gate ran
  type: list
  elements: dict
  sample:
    - url: https://home.example/plex
      expected_host: home.example
      final_url: https://home.example/plex/web/index.html
      status: 200
      navigations: 14
      checks: {loaded: true, guard_settled: true, hostname: true, no_login_form: true, status: true}
      reasons: []
      home_reissues: ["Page.goto: net::ERR_ABORTED at https://home.example/"]
      seconds: 2.4
      screenshot: ""
      ok: true
links_failed:
  description: How many links failed.
  returned: success or when the gate ran
  type: int
home_reissues:
  description: Navigation aborts met on the way home, summed over the links.
  returned: success or when the gate ran
  type: int
report:
  description: The path of C(report.json).
  returned: success or when the gate ran
  type: str
"""

import traceback

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.frank.llm_fleet.plugins.module_utils.browser.gate import (
    DEFAULT_CHROMIUM,
    DEFAULT_GUARD_PATTERNS,
    DEFAULT_LINK_SELECTORS,
    HAS_PLAYWRIGHT,
    MISSING_PLAYWRIGHT,
    PLAYWRIGHT_IMPORT_ERROR,
    GateError,
    GateOptions,
    run_gate,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import ModuleCall, run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

ARGUMENT_SPEC = {
    "url": {"type": "str", "required": True},
    "selectors": {"type": "list", "elements": "str", "default": list(DEFAULT_LINK_SELECTORS)},
    "allowed_hosts": {"type": "list", "elements": "str", "default": []},
    "guard_patterns": {"type": "list", "elements": "str", "default": list(DEFAULT_GUARD_PATTERNS)},
    "report_dir": {"type": "path", "required": True},
    "navigation_timeout": {"type": "float", "default": 15},
    "settle_timeout": {"type": "float", "default": 10},
    "settle_quiet": {"type": "float", "default": 1},
    "deadline": {"type": "float", "default": 300},
    "home_retries": {"type": "int", "default": 5},
    "chromium_path": {"type": "path", "default": DEFAULT_CHROMIUM},
    "validate_certs": {"type": "bool", "default": True},
    "headers": {"type": "dict", "default": {}, "no_log": True},
}


def options_from(params: dict) -> GateOptions:
    return GateOptions(
        url=params["url"],
        report_dir=params["report_dir"],
        link_selectors=tuple(params["selectors"]),
        allowed_hosts=tuple(params["allowed_hosts"]),
        guard_patterns=tuple(params["guard_patterns"]),
        navigation_timeout_s=params["navigation_timeout"],
        settle_timeout_s=params["settle_timeout"],
        settle_quiet_s=params["settle_quiet"],
        deadline_s=params["deadline"],
        home_retries=params["home_retries"],
        chromium_path=params["chromium_path"],
        validate_certs=params["validate_certs"],
        headers={str(k): str(v) for k, v in params["headers"].items()},
    )


def gate(call: ModuleCall) -> dict:
    if not HAS_PLAYWRIGHT:
        raise StepError(missing_required_lib("playwright", reason=MISSING_PLAYWRIGHT), {"exception": PLAYWRIGHT_IMPORT_ERROR})
    try:
        report = run_gate(options_from(call.params))
    except GateError:
        raise
    except Exception as exc:  # Chromium failed to start or died: the gate did not run, say why
        raise StepError(f"the browser gate did not run: {exc}", {"exception": traceback.format_exc()}) from None
    summary = report.as_dict()
    result = {
        "changed": False,
        "ok": summary["ok"],
        "links": summary["links"],
        "links_failed": summary["links_failed"],
        "home_reissues": summary["home_reissues"],
        "report": report.report_path,
    }
    if not report.ok:
        failing = "; ".join(f"{link.url}: {', '.join(link.reasons)}" for link in report.failed[:10])
        raise StepError(f"browser gate: {len(report.failed)} of {len(report.links)} links fail: {failing} (report: {report.report_path})", result)
    return {"msg": f"browser gate: all {len(report.links)} links pass ({summary['home_reissues']} re-issued ways home)", **result}


def main() -> None:
    run_module(ARGUMENT_SPEC, gate, errors=(GateError,))


if __name__ == "__main__":
    main()
