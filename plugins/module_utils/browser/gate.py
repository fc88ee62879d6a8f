# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The post-deploy browser gate: Playwright driving a real Chromium over the homepage.

The homepage contract (what the gate expects of the page it starts from):
  - the gate starts at one homepage URL and judges that page itself;
  - every element matching one of the link selectors (default ``a.card`` for the service cards,
    ``a[href$="/docs"]`` and ``a.docs-link`` for the docs page) is a link to crawl; its ``href`` is
    resolved against the homepage and each page is crawled once (hrefs differing only in the
    fragment are one page), in the selectors' order, then page order;
  - a homepage where no selector matches fails (an empty page must not pass the gate).

The per-link verdict (``judge``), each check named as the report names it:
  - guard_settled: within ``settle_timeout_s`` the top frame's URL stayed off every guard pattern
    (the forward-auth redirect: authentik's outpost, flow and authorize paths by default) for
    ``settle_quiet_s`` without a break. An app that keeps redirecting itself off the guard (Plex
    signed out) is settled; a page still bouncing through the guard is not.
  - hostname: the final top-frame hostname is the link's own hostname or one of ``allowed_hosts``.
  - no_login_form: no frame holds a password input or authentik's ``uidField`` input (a login page
    that leaked past the guard).
  - status: the main response (the link's own navigation, after HTTP redirects) answered < 500.

Between links the crawl returns to the homepage. An app that keeps redirecting its top frame can
cancel that navigation; Chromium reports it as ``net::ERR_ABORTED`` (seed 004: the bare goto died
outside the try, once as a 420 s timeout of the deploy gate). So the crawl leaves each judged
page behind and goes home in a fresh page of the same browser context (cookies, routes and
headers kept), where the left page's scripts cannot reach the navigation. A cancel may still
come (a homepage that redirects itself): only that class is re-issued, at most ``home_retries``
times, each re-issue counted in the report; Playwright names the same cancel "is interrupted by
another navigation" when the other navigation is announced before our request is cancelled, so
that wording is the same class, and so is a landing taken back a moment later (return_home). Any
other error fails the link being returned from, never the whole crawl, and ``deadline_s`` bounds
the whole gate.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    HAS_PLAYWRIGHT = True
    PLAYWRIGHT_IMPORT_ERROR = ""
except ImportError as exc:  # ansible-test's import sanity and hosts without the gate's toolchain
    HAS_PLAYWRIGHT = False
    PLAYWRIGHT_IMPORT_ERROR = str(exc)
    PlaywrightError = Exception  # type: ignore[misc,assignment]

MISSING_PLAYWRIGHT = (
    "the browser gate needs the Python package playwright (requirements.txt pins playwright==1.65.2; "
    "scripts/setup.sh installs it with Debian's chromium): run it on the controller with the interpreter "
    "that has it (delegate_to: localhost, ansible_python_interpreter: '{{ ansible_playbook_python }}')"
)

DEFAULT_LINK_SELECTORS = ("a.card", 'a[href$="/docs"]', "a.docs-link")
# authentik's forward auth: the outpost's start/callback, the flow executor, the OAuth authorize step.
DEFAULT_GUARD_PATTERNS = (r"/outpost\.goauthentik\.io/", r"/if/flow/", r"/application/o/authorize/")
LOGIN_FORM_SELECTOR = 'input[type="password"], input[name="uidField"]'
# The one error class the way home tolerates (see the module docstring).
NAVIGATION_ABORT_MARKERS = ("net::ERR_ABORTED", "is interrupted by another navigation")
DEFAULT_CHROMIUM = "/usr/bin/chromium"
POLL_S = 0.1


class GateError(Exception):
    """Invalid options or a missing toolchain: the gate did not run."""


class WayHomeError(Exception):
    """The homepage could not be reached again after a link; fails that link, not the crawl."""

    def __init__(self, message: str, reissues: list[str]) -> None:
        super().__init__(message)
        self.reissues = reissues


@dataclass(frozen=True)
class GateOptions:
    url: str
    report_dir: str
    link_selectors: tuple[str, ...] = DEFAULT_LINK_SELECTORS
    allowed_hosts: tuple[str, ...] = ()
    guard_patterns: tuple[str, ...] = DEFAULT_GUARD_PATTERNS
    navigation_timeout_s: float = 15.0
    settle_timeout_s: float = 10.0
    settle_quiet_s: float = 1.0
    deadline_s: float = 300.0
    home_retries: int = 5
    chromium_path: str = DEFAULT_CHROMIUM
    validate_certs: bool = True
    # Sent with every request; never written to the report or a result (it may carry a credential).
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if urlsplit(self.url).scheme not in ("http", "https") or not urlsplit(self.url).hostname:
            raise GateError(f"url: {self.url!r} is not an http(s) URL with a host; give the homepage, e.g. https://home.example.org/")
        if not self.link_selectors:
            raise GateError("selectors: empty; give at least one CSS selector for the links to crawl, e.g. a.card")
        for pattern in self.guard_patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise GateError(f"guard_patterns: {pattern!r} is not a regular expression ({exc}); fix or remove it") from None
        for name in ("navigation_timeout_s", "settle_timeout_s", "deadline_s"):
            if getattr(self, name) <= 0:
                raise GateError(f"{name}: {getattr(self, name)} must be above 0 seconds")
        if self.settle_quiet_s < 0 or self.settle_quiet_s > self.settle_timeout_s:
            raise GateError(f"settle_quiet_s: {self.settle_quiet_s} must lie between 0 and settle_timeout_s ({self.settle_timeout_s})")
        if self.home_retries < 0:
            raise GateError(f"home_retries: {self.home_retries} is below 0; give 0 (no re-issue) or more")


@dataclass
class Observation:
    """What the browser saw of one link, before any judgement."""

    url: str
    final_url: str = ""
    status: int | None = None
    guard_settled: bool = False
    login_form_in: str = ""  # the URL of the frame holding a login form; empty when none
    error: str = ""
    navigations: int = 0  # top-frame documents committed after the link's own (its redirects)


@dataclass
class LinkVerdict:
    url: str
    expected_host: str
    final_url: str
    status: int | None
    checks: dict[str, bool]
    reasons: list[str]
    navigations: int = 0
    home_reissues: list[str] = field(default_factory=list)  # each abort the way home met
    seconds: float = 0.0
    screenshot: str = ""

    @property
    def ok(self) -> bool:
        return not self.reasons

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


@dataclass
class GateReport:
    url: str
    links: list[LinkVerdict]
    seconds: float
    report_path: str = ""

    @property
    def ok(self) -> bool:
        return all(link.ok for link in self.links)

    @property
    def failed(self) -> list[LinkVerdict]:
        return [link for link in self.links if not link.ok]

    def as_dict(self) -> dict:
        return {
            "url": self.url,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "links_total": len(self.links),
            "links_failed": len(self.failed),
            "home_reissues": sum(len(link.home_reissues) for link in self.links),
            "links": [link.as_dict() for link in self.links],
        }


def hostname(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def on_guard(url: str, guard_patterns: tuple[str, ...]) -> bool:
    return any(re.search(pattern, url) for pattern in guard_patterns)


def is_navigation_abort(message: str) -> bool:
    """True only for the cancel a page's own top-frame navigation inflicts on ours."""
    return any(marker in message for marker in NAVIGATION_ABORT_MARKERS)


def judge(observation: Observation, allowed_hosts: tuple[str, ...] = ()) -> tuple[dict[str, bool], list[str]]:
    """The per-link verdict: each check's outcome and, for each failing one, the reason."""
    expected = hostname(observation.url)
    landed = hostname(observation.final_url)
    checks = {
        "loaded": not observation.error,
        "guard_settled": observation.guard_settled,
        "hostname": bool(landed) and (landed == expected or landed in {h.lower() for h in allowed_hosts}),
        "no_login_form": not observation.login_form_in,
        "status": observation.status is not None and observation.status < 500,
    }
    reasons = []
    if observation.error:
        reasons.append(f"error: {observation.error}")
    if not checks["guard_settled"] and not observation.error:
        reasons.append(f"guard_settled: the top frame did not stay off the auth guard (last at {observation.final_url})")
    if not checks["hostname"] and landed:
        allowed = f" or one of allowed_hosts {list(allowed_hosts)}" if allowed_hosts else ""
        reasons.append(f"hostname: landed on {landed}, expected {expected}{allowed}")
    if observation.login_form_in:
        reasons.append(f"no_login_form: a password or uidField input in the frame at {observation.login_form_in}")
    if observation.status is None:
        if not observation.error:
            reasons.append("status: the link's navigation brought no main response")
    elif observation.status >= 500:
        reasons.append(f"status: the main response answered {observation.status}")
    return checks, reasons


def wait_guard_settled(
    current_url: Callable[[], str],
    guard_patterns: tuple[str, ...],
    quiet_s: float,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, str]:
    """(settled, last URL): settled once the URL stayed off the guard for quiet_s, within timeout_s."""
    start = clock()
    off_guard_since = None
    while True:
        now = clock()
        url = current_url()
        if on_guard(url, guard_patterns):
            off_guard_since = None
        elif off_guard_since is None:
            off_guard_since = now
        if off_guard_since is not None and now - off_guard_since >= quiet_s:
            return True, url
        if now - start >= timeout_s:
            return False, url
        sleep(POLL_S)


class Page(Protocol):
    """The part of Playwright's Page the way home uses (a fake stands in for it in the unit tests)."""

    url: str

    def goto(self, url: str, *, timeout: float, wait_until: str): ...

    def wait_for_url(self, url: Callable[[str], bool], *, wait_until: str, timeout: float) -> None: ...

    def wait_for_timeout(self, timeout: float) -> None: ...


def same_page(a: str, b: str) -> bool:
    """Equal up to the fragment and an empty path ('http://h' is 'http://h/')."""
    left, right = urlsplit(a), urlsplit(b)
    return (left.scheme, left.netloc, left.path or "/", left.query) == (right.scheme, right.netloc, right.path or "/", right.query)


def return_home(page: Page, home_url: str, timeout_s: float, retries: int, landed_url: str = "", landing_s: float = 2.0, stay_s: float = 0.3) -> list[str]:
    """Navigate back to the homepage, re-issuing only a navigation abort, at most `retries` times.
    Returns the abort each try met; any other error (and an abort past the retries) raises
    WayHomeError, which fails the link the crawl was returning from.

    Playwright also reports the abort when another document commits while ours is still on its
    way, and ours may then land after all: each abort first waits up to landing_s for the
    homepage, so that a late landing is not raced by a re-issue (nor later by the next link).
    A landing is kept only once the page stayed home for stay_s: another navigation (the
    homepage's own; the crawl calls this in a fresh page, see Crawl._leave_page) may still commit
    over ours, the same cancel arriving late, counted and re-issued. landed_url is where the
    homepage's first visit ended (a homepage may redirect once)."""

    def at_home(url: str) -> bool:
        return same_page(url, home_url) or (bool(landed_url) and same_page(url, landed_url))

    reissues: list[str] = []
    while True:
        try:
            page.goto(home_url, timeout=timeout_s * 1000, wait_until="load")
            message = ""
        except PlaywrightError as exc:
            message = _first_line(exc)
            if not is_navigation_abort(message):
                raise WayHomeError(message, reissues) from exc
            with contextlib.suppress(PlaywrightError):  # not home in time: ours was cancelled for good
                page.wait_for_url(at_home, wait_until="load", timeout=min(landing_s, timeout_s) * 1000)
        landed = at_home(page.url)
        if landed:
            page.wait_for_timeout(stay_s * 1000)
            if at_home(page.url):
                if message:
                    reissues.append(message)
                return reissues
        if landed or not message:  # Playwright saw ours land; another navigation took the frame back
            message = f"{message or 'landed home'}, then another navigation took the frame to {page.url}"
        reissues.append(message)
        if len(reissues) > retries:
            raise WayHomeError(f"{message} (still, after {retries} re-issues)", reissues)


def collect_links(home_url: str, hrefs: list[str]) -> list[str]:
    """The links to crawl: hrefs resolved against the homepage, http(s) only, one per page (the
    first href of a page is kept, fragment and all: model cards all pointing into /docs#models
    are one crawl of /docs)."""
    links: list[str] = []
    for href in hrefs:
        link = urljoin(home_url, href.strip())
        if urlsplit(link).scheme in ("http", "https") and not any(same_page(link, kept) for kept in links):
            links.append(link)
    return links


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _login_form_frame(page, attempts: int = 20) -> str:
    """The URL of a frame holding a login form ('' when none). A page that keeps navigating destroys
    the frame's context under a query, so the look is repeated; never seen whole, it counts as
    a leak (the gate fails closed)."""
    last_error = ""
    for _attempt in range(attempts):
        try:
            for frame in page.frames:
                if frame.locator(LOGIN_FORM_SELECTOR).count():
                    return frame.url or page.url
            return ""
        except PlaywrightError as exc:
            last_error = _first_line(exc)
            page.wait_for_timeout(50)
    return f"{page.url} (not inspected: {last_error})"


def _screenshot(page, report_dir: str, index: int, attempts: int = 3) -> str:
    """The failing page as a PNG; Chromium may refuse a capture while its error page swaps in."""
    path = os.path.join(report_dir, f"link-{index:02d}.png")
    error = ""
    for _attempt in range(attempts):
        try:
            page.screenshot(path=path, timeout=5000)
            return path
        except PlaywrightError as exc:
            error = _first_line(exc)
            page.wait_for_timeout(250)
    return f"(none: {error})"


class Crawl:
    """One pass of the gate over one homepage, starting on a Playwright page the caller owns. The
    way home opens further pages in that page's context and leaves the judged ones open (see
    _leave_page): the caller closes the context or the browser when the crawl is done."""

    def __init__(self, page, options: GateOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.page = page
        self.left_behind: list = []  # judged pages, never closed (see _leave_page)
        self.options = options
        self.clock = clock
        self.deadline = clock() + options.deadline_s

    def _pause(self, seconds: float) -> None:
        # Playwright's sync API updates page.url only while it runs its event loop: sleep inside it.
        self.page.wait_for_timeout(seconds * 1000)

    def _timeout(self) -> float:
        return max(0.5, min(self.options.navigation_timeout_s, self.deadline - self.clock()))

    def _observe(self, url: str) -> Observation:
        observation = Observation(url=url)
        committed = []

        def count(frame) -> None:
            if frame == self.page.main_frame:
                committed.append(frame.url)

        self.page.on("framenavigated", count)
        try:
            # "commit": the main response is ours even when the page's scripts navigate on at once.
            response = self.page.goto(url, timeout=self._timeout() * 1000, wait_until="commit")
            observation.status = response.status if response is not None else None
            settle_s = min(self.options.settle_timeout_s, max(0.5, self.deadline - self.clock()))
            observation.guard_settled, observation.final_url = wait_guard_settled(
                lambda: self.page.url, self.options.guard_patterns, min(self.options.settle_quiet_s, settle_s), settle_s, self.clock, self._pause
            )
            observation.login_form_in = _login_form_frame(self.page)
        except PlaywrightError as exc:
            observation.error = _first_line(exc)
            observation.final_url = self.page.url
        finally:
            self.page.remove_listener("framenavigated", count)
        observation.navigations = max(0, len(committed) - 1)
        return observation

    def _verdict(self, index: int, observation: Observation, started: float) -> LinkVerdict:
        checks, reasons = judge(observation, self.options.allowed_hosts)
        verdict = LinkVerdict(
            url=observation.url,
            expected_host=hostname(observation.url),
            final_url=observation.final_url,
            status=observation.status,
            navigations=observation.navigations,
            checks=checks,
            reasons=reasons,
        )
        if reasons:
            verdict.screenshot = _screenshot(self.page, self.options.report_dir, index)
        verdict.seconds = round(self.clock() - started, 2)
        return verdict

    def _leave_page(self) -> None:
        """Go on in a fresh page of the same context; the one just judged is left open, untouched.
        A page that keeps redirecting its top frame cancels a goto home issued in it, or lands
        over it after it arrived (the lab's loop card failed its way home after 5 re-issues on a
        loaded machine). Closing it is no way out: Chromium can acknowledge the close of a page
        whose own navigation is committing and never close it, and page.close() then waits
        forever (measured: 3 hangs in 23 runs over the loop page with the cores busy). The pages
        left behind go when the browser does, at the end of the gate."""
        self.left_behind.append(self.page)
        self.page = self.page.context.new_page()

    def _hrefs(self) -> list[str]:
        hrefs: list[str] = []
        for selector in self.options.link_selectors:
            hrefs += self.page.eval_on_selector_all(selector, "els => els.map(e => e.getAttribute('href') || '')")
        return collect_links(self.options.url, hrefs)

    def run(self) -> GateReport:
        started = self.clock()
        os.makedirs(self.options.report_dir, exist_ok=True)
        home = self._verdict(0, self._observe(self.options.url), started)
        links: list[str] = []
        if home.ok:
            try:
                links = self._hrefs()
            except PlaywrightError as exc:
                home.reasons.append(f"links: could not be read ({_first_line(exc)})")
            if not links and not home.reasons:
                home.reasons.append(f"links: no element matches {list(self.options.link_selectors)}; the homepage contract needs the service cards")
                home.screenshot = _screenshot(self.page, self.options.report_dir, 0)
        verdicts = [home]
        for index, link in enumerate(links, start=1):
            link_started = self.clock()
            if self.clock() >= self.deadline:
                checks = judge(Observation(url=link, error="not crawled"))[0]
                late = f"deadline: the gate's {self.options.deadline_s:g} s passed before this link"
                verdicts.append(LinkVerdict(link, hostname(link), "", None, checks=checks, reasons=[late]))
                continue
            verdict = self._verdict(index, self._observe(link), link_started)
            self._leave_page()
            try:
                verdict.home_reissues = return_home(self.page, self.options.url, self._timeout(), self.options.home_retries, home.final_url)
            except WayHomeError as exc:
                verdict.home_reissues = exc.reissues
                verdict.reasons.append(f"way home: {exc}")
                if not verdict.screenshot:
                    verdict.screenshot = _screenshot(self.page, self.options.report_dir, index)
            verdict.seconds = round(self.clock() - link_started, 2)
            verdicts.append(verdict)
        return GateReport(url=self.options.url, links=verdicts, seconds=self.clock() - started)


def write_report(report: GateReport, report_dir: str) -> str:
    path = os.path.join(report_dir, "report.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report.as_dict(), handle, indent=2)
        handle.write("\n")
    report.report_path = path
    return path


def chromium_args() -> list[str]:
    # Chromium refuses to start as root with its sandbox on; the gate only reads our own pages.
    return ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []


def same_origin(url: str, home: str) -> bool:
    a, b = urlsplit(url), urlsplit(home)
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)


def _send_headers_to_home_only(context: Any, home: str, headers: dict[str, str]) -> None:
    """A credential header (an auth proxy's bearer token) goes to the homepage's own origin only:
    a card or a redirect leading to another host must never receive it. Playwright carries headers
    given to route.continue_ into the redirects a request starts, so the home origin's requests are
    fetched here without following redirects and handed to Chromium, which then asks for the
    redirect's target as a new request that this handler judges again."""

    def add_headers(route: Any, request: Any) -> None:
        if same_origin(request.url, home):
            route.fulfill(response=route.fetch(headers={**request.headers, **headers}, max_redirects=0))
        else:
            route.continue_()

    context.route("**/*", add_headers)


def run_gate(options: GateOptions) -> GateReport:
    """Launch Chromium, crawl, write report.json (and a PNG per failing link) into report_dir."""
    if not HAS_PLAYWRIGHT:
        raise GateError(f"{MISSING_PLAYWRIGHT} ({PLAYWRIGHT_IMPORT_ERROR})")
    if not os.access(options.chromium_path, os.X_OK):
        raise GateError(
            f"chromium_path: {options.chromium_path} is not an executable; install Debian's chromium (scripts/setup.sh) or point chromium_path at one"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=options.chromium_path, headless=True, args=chromium_args())
        try:
            context = browser.new_context(ignore_https_errors=not options.validate_certs)
            if options.headers:
                _send_headers_to_home_only(context, options.url, dict(options.headers))
            report = Crawl(context.new_page(), options).run()
        finally:
            browser.close()
    write_report(report, options.report_dir)
    return report
