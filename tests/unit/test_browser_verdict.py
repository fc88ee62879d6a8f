"""The browser gate's logic without a browser: the per-link verdict, which errors the way home
may re-issue, the guard's settling, the links the homepage contract yields, the options' errors.

seeds/004_b3255cfc2200b40a.txt: "keeps redirecting the top frame: Chromium cancelled our goto with
net::ERR_ABORTED, outside the try, so the whole crawl died — once as a 420 s timeout in the deploy
gate, once at 5.4 s on the same link. backHome() tolerates that one error class and re-issues; any
other error still propagates, and the per-app verdict (guard settled, hostname, no authentik
uidField, status < 500) is unchanged."
"""

from __future__ import annotations

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.browser import gate
from ansible_collections.frank.llm_fleet.plugins.module_utils.browser.gate import (
    DEFAULT_GUARD_PATTERNS,
    Crawl,
    GateError,
    GateOptions,
    Observation,
    WayHomeError,
    collect_links,
    is_navigation_abort,
    judge,
    return_home,
    same_page,
    wait_guard_settled,
)

HOME = "https://home.example/"
# The seed's error, as Playwright words it for a goto Chromium cancelled.
SEED_ABORT = "Page.goto: net::ERR_ABORTED at https://home.example/"
INTERRUPTED = 'Page.goto: Navigation to "https://home.example/" is interrupted by another navigation to "https://home.example/plex/web/index.html#!/"'


def observed(**changes) -> Observation:
    base = {"url": "https://home.example/plex", "final_url": "https://home.example/plex/web/", "status": 200, "guard_settled": True}
    return Observation(**{**base, **changes})


@pytest.mark.parametrize(
    ("observation", "allowed", "failing", "reason"),
    [
        (observed(), (), [], None),
        (observed(status=499), (), [], None),
        (observed(status=500), (), ["status"], "status: the main response answered 500"),
        (observed(status=503), (), ["status"], "status: the main response answered 503"),
        (observed(status=None), (), ["status"], "status: the link's navigation brought no main response"),
        (observed(guard_settled=False, final_url="https://auth.example/if/flow/login/"), ("auth.example",), ["guard_settled"], "guard_settled: the top frame"),
        (observed(final_url="https://evil.example/"), (), ["hostname"], "hostname: landed on evil.example, expected home.example"),
        (observed(final_url="https://APP.plex.tv/desktop"), ("app.plex.tv",), [], None),
        (observed(login_form_in="https://home.example/plex"), (), ["no_login_form"], "no_login_form: a password or uidField input"),
        (observed(status=None, final_url="about:blank", guard_settled=False, error="net::ERR_CONNECTION_REFUSED"), (), None, "error: net::"),
    ],
)
def test_the_verdict_names_each_failing_check(observation, allowed, failing, reason):
    checks, reasons = judge(observation, allowed)
    if failing is not None:
        assert sorted(name for name, passed in checks.items() if not passed) == failing
    if reason is None:
        assert reasons == []
    else:
        assert reasons[0].startswith(reason)


def test_an_error_is_one_reason_not_a_cascade():
    checks, reasons = judge(observed(status=None, final_url="about:blank", guard_settled=False, error="Timeout 15000ms exceeded."))
    assert reasons == ["error: Timeout 15000ms exceeded."]
    assert checks["loaded"] is False and checks["status"] is False


@pytest.mark.parametrize(
    ("message", "tolerated"),
    [
        (SEED_ABORT, True),
        (INTERRUPTED, True),
        ("Page.goto: net::ERR_CONNECTION_REFUSED at https://home.example/", False),
        ("Page.goto: net::ERR_NAME_NOT_RESOLVED at https://home.example/", False),
        ("Page.goto: net::ERR_CERT_AUTHORITY_INVALID at https://home.example/", False),
        ("Page.goto: net::ERR_TIMED_OUT at https://home.example/", False),
        ("Page.goto: Timeout 15000ms exceeded.", False),
        ("Page.goto: Target page, context or browser has been closed", False),
    ],
)
def test_only_the_navigation_abort_is_tolerated(message, tolerated):
    assert is_navigation_abort(message) is tolerated


class FakePage:
    """Answers each goto from a script: None lands on the URL, a string raises it as Playwright
    would; `lands_anyway` makes the page arrive home after an abort (ours landed late); each URL
    of `drifts` is where another navigation takes the frame after one landing, in turn."""

    def __init__(self, script: list[str | None], url: str = "https://home.example/plex/web/", lands_anyway: bool = False, drifts=()) -> None:
        self.script = list(script)
        self.url = url
        self.lands_anyway = lands_anyway
        self.drifts = list(drifts)
        self.gotos: list[str] = []

    def goto(self, url: str, *, timeout: float, wait_until: str):
        self.gotos.append(url)
        step = self.script.pop(0)
        if step is not None:
            if self.lands_anyway:
                self.url = url
            raise gate.PlaywrightError(step)
        self.url = url

    def wait_for_url(self, predicate, *, wait_until: str, timeout: float) -> None:
        if not predicate(self.url):
            raise gate.PlaywrightError(f"Timeout {timeout:.0f}ms exceeded.")

    def wait_for_timeout(self, timeout: float) -> None:
        if self.drifts:
            self.url = self.drifts.pop(0)


def test_the_way_home_reissues_each_abort_and_counts_it():
    page = FakePage([SEED_ABORT, INTERRUPTED, None])
    assert return_home(page, HOME, 15, retries=5) == [SEED_ABORT, INTERRUPTED]
    assert page.gotos == [HOME] * 3 and page.url == HOME


def test_an_abort_whose_navigation_landed_home_is_not_reissued():
    page = FakePage([INTERRUPTED], lands_anyway=True)
    assert return_home(page, HOME, 15, retries=5) == [INTERRUPTED]
    assert page.gotos == [HOME]


def test_a_landing_the_page_left_behind_navigates_over_is_reissued():
    loop = "https://home.example/plex/web/index.html#!/signin"
    page = FakePage([None, None], drifts=[loop])
    (reissue,) = return_home(page, HOME, 15, retries=5)
    assert reissue == f"landed home, then another navigation took the frame to {loop}"
    assert page.gotos == [HOME, HOME] and page.url == HOME


def test_a_landing_taken_back_before_the_first_look_is_reissued():
    loop = "https://home.example/plex/web/index.html#!/signin"
    page = FakePage([None, None])
    landings = iter([loop, HOME])
    page.goto = lambda url, **_: (page.gotos.append(url), setattr(page, "url", next(landings)))
    assert return_home(page, HOME, 15, retries=5) == [f"landed home, then another navigation took the frame to {loop}"]
    assert page.gotos == [HOME, HOME]


def test_a_homepage_that_redirects_once_is_home_where_it_landed():
    page = FakePage([None])
    page.goto = lambda url, **_: setattr(page, "url", "https://home.example/index.html")
    assert return_home(page, HOME, 15, retries=0, landed_url="https://home.example/index.html") == []


@pytest.mark.parametrize(
    ("script", "retries", "error", "reissued"),
    [
        (["Page.goto: net::ERR_CONNECTION_REFUSED at https://home.example/"], 5, "net::ERR_CONNECTION_REFUSED", 0),
        ([SEED_ABORT, "Page.goto: Timeout 15000ms exceeded."], 5, "Timeout 15000ms", 1),
        ([SEED_ABORT] * 6, 5, "(still, after 5 re-issues)", 6),
        ([SEED_ABORT], 0, "(still, after 0 re-issues)", 1),
    ],
)
def test_any_other_error_or_an_endless_abort_fails_the_link(script, retries, error, reissued):
    page = FakePage(script)
    with pytest.raises(WayHomeError, match=error.replace("(", r"\(").replace(")", r"\)")) as caught:
        return_home(page, HOME, 15, retries=retries)
    assert len(caught.value.reissues) == reissued
    assert len(page.gotos) == len(script)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def settle(urls: list[str], quiet_s: float = 1.0, timeout_s: float = 10.0) -> tuple[bool, str]:
    """wait_guard_settled over a URL per 0.1 s poll; the last URL repeats."""
    clock = FakeClock()
    samples = iter(urls)
    last = [urls[0]]

    def current() -> str:
        last[0] = next(samples, last[0])
        return last[0]

    return wait_guard_settled(current, DEFAULT_GUARD_PATTERNS, quiet_s, timeout_s, clock, clock.sleep)


GUARD = "https://home.example/outpost.goauthentik.io/start?rd=https://home.example/plex"
FLOW = "https://auth.example/if/flow/default-authentication-flow/?next=/application/o/authorize/"
APP = "https://home.example/plex/web/index.html"


def test_a_page_that_leaves_the_guard_settles():
    assert settle([GUARD, FLOW, APP]) == (True, APP)


def test_an_app_redirecting_itself_forever_off_the_guard_is_settled():
    loop = [f"{APP}?n={n}" for n in range(200)]
    settled, last = settle(loop)
    assert settled and last.startswith(APP)


def test_a_page_bouncing_through_the_guard_never_settles():
    assert settle([GUARD, APP] * 100)[0] is False
    assert settle([FLOW]) == (False, FLOW)


def test_the_quiet_period_must_be_whole():
    # Off the guard for 0.5 s of a 1 s quiet period, then back on it: not settled yet.
    settled = settle([APP] * 5 + [GUARD] + [APP] * 200, quiet_s=1.0, timeout_s=1.2)[0]
    assert not settled


def test_the_homepage_contract_yields_each_link_once_resolved():
    hrefs = ["/plex", "https://chat.example/", "/plex", "/docs#models", "mailto:ops@example", "javascript:void(0)", " /docs ", "/docs#frank-large", "/admin"]
    assert collect_links(HOME, hrefs) == [
        "https://home.example/plex",
        "https://chat.example/",
        "https://home.example/docs#models",
        "https://home.example/admin",
    ]


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("https://home.example", HOME, True),
        ("https://home.example/#top", HOME, True),
        ("https://home.example/?x=1", HOME, False),
        ("http://home.example/", HOME, False),
    ],
)
def test_same_page_ignores_fragment_and_empty_path(a, b, same):
    assert same_page(a, b) is same


def test_without_playwright_the_gate_names_the_package_and_the_setup_step(monkeypatch, tmp_path):
    monkeypatch.setattr(gate, "HAS_PLAYWRIGHT", False)
    with pytest.raises(GateError) as caught:
        gate.run_gate(GateOptions(url=HOME, report_dir=str(tmp_path)))
    assert "playwright" in str(caught.value) and "scripts/setup.sh" in str(caught.value)


class FakeSitePage(FakePage):
    """Enough of a Playwright page for Crawl: each URL answers a status; every goto costs 1 s."""

    class Response:
        def __init__(self, status: int) -> None:
            self.status = status

    def __init__(self, statuses: dict[str, int], hrefs: list[str], clock: FakeClock) -> None:
        super().__init__([], url="about:blank")
        self.statuses, self.hrefs, self.clock = statuses, hrefs, clock
        self.frames: list = []
        self.main_frame = object()
        self.screenshots: list[str] = []
        self.events: list[str] = []  # gotos and page swaps, in order

    @property
    def context(self):
        return self  # new_page() hands back this fake, which keeps recording

    def new_page(self):
        self.events.append("new page")
        return self

    def goto(self, url: str, *, timeout: float, wait_until: str):
        self.clock.sleep(1.0)
        self.gotos.append(url)
        self.events.append(url)
        self.url = url
        return self.Response(self.statuses.get(url, 200))

    def on(self, event, handler) -> None:
        pass

    def remove_listener(self, event, handler) -> None:
        pass

    def wait_for_timeout(self, timeout: float) -> None:
        self.clock.sleep(timeout / 1000)

    def eval_on_selector_all(self, selector: str, script: str) -> list[str]:
        return self.hrefs if selector == "a.card" else []

    def screenshot(self, path: str, timeout: float) -> None:
        self.screenshots.append(path)


def test_a_failing_link_does_not_stop_the_crawl_and_the_deadline_bounds_it(tmp_path):
    clock = FakeClock()
    page = FakeSitePage({"https://home.example/b": 502}, ["/a", "/b", "/c", "/d"], clock)
    # Each link costs 1 s out, 0.5 s settling, 1 s home and 0.3 s staying there: /d would start at 9.9 s.
    options = GateOptions(url=HOME, report_dir=str(tmp_path), settle_quiet_s=0.5, deadline_s=9)
    report = Crawl(page, options, clock).run()
    verdicts = {link.url: link for link in report.links}
    assert [url for url, link in verdicts.items() if link.ok] == [HOME, "https://home.example/a", "https://home.example/c"]
    assert verdicts["https://home.example/b"].reasons == ["status: the main response answered 502"]
    assert verdicts["https://home.example/d"].reasons == ["deadline: the gate's 9 s passed before this link"]
    assert page.screenshots == [str(tmp_path / "link-02.png")]
    assert "https://home.example/d" not in page.gotos


def test_each_judged_page_is_left_behind_for_the_way_home(tmp_path):
    """A page that keeps redirecting its top frame would cancel a goto home issued in it (seed 004)
    or land over it: the crawl goes home in a fresh page. The judged page is never closed: a close
    racing its own navigation can hang forever (a Chromium bug), so it goes with the browser."""
    clock = FakeClock()
    page = FakeSitePage({}, ["/a", "/b"], clock)
    report = Crawl(page, GateOptions(url=HOME, report_dir=str(tmp_path), settle_quiet_s=0.2), clock).run()
    assert report.ok
    a, b = "https://home.example/a", "https://home.example/b"
    assert page.events == [HOME, a, "new page", HOME, b, "new page", HOME]
