"""A local site for the browser gate's tests, served from a thread: a homepage with cards, a plain
page, a page that redirects its top frame forever, a 500, a login form, a card that lands on
another hostname, the docs page."""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

# The loop page: a signed-out app's sign-in flow redirecting its own top frame, forever.
LOOP_PAGE = (
    "<!doctype html><title>signing in</title><script>const n = Number(new URLSearchParams(location.search).get('n') || 0);"
    "setTimeout(() => location.replace('/loop?n=' + (n + 1)), 25)</script>"
)
LOGIN_PAGE = "<!doctype html><title>Login</title><form method=post><input name=uidField><input type=password name=password></form>"


def page(title: str, body: str = "") -> str:
    return f"<!doctype html><title>{title}</title><h1>{title}</h1>{body}"


def homepage(cards: list[str]) -> str:
    links = "".join(f'<a class="card" href="{href}">{href}</a>' for href in cards)
    return page("Home", f'<main>{links}</main><footer><a class="docs-link" href="/docs">Docs</a></footer>')


class Site(BaseHTTPRequestHandler):
    """/ every kind of card; /good/ only cards that pass. Served at 127.0.0.1; /elsewhere sends
    the browser to localhost, the same server under another hostname."""

    # (Host header, Authorization header) of every request: where a credential went.
    requests: ClassVar[list[tuple[str, str | None]]] = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        Site.requests.append((str(self.headers.get("Host")), self.headers.get("Authorization")))
        port = self.server.server_port
        path = self.path.split("?")[0]
        if path == "/":
            self.answer(200, homepage(["/ok", "/loop", "/broken", "/login", "/elsewhere"]))
        elif path == "/good/":
            self.answer(200, homepage(["/ok", "/loop"]))
        elif path == "/empty/":
            self.answer(200, page("Nothing here"))
        elif path == "/ok":
            self.answer(200, page("A service"))
        elif path == "/docs":
            self.answer(200, page("Docs"))
        elif path == "/loop":
            self.answer(200, LOOP_PAGE)
        elif path == "/broken":
            self.answer(500, page("Internal Server Error"))
        elif path == "/login":
            self.answer(200, LOGIN_PAGE)
        elif path == "/elsewhere":
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{port}/ok")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.answer(404, page("Not found"))

    def answer(self, status: int, html: str) -> None:
        body = html.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # Chromium drops the loop page's connections mid-answer, by design of the page


@contextlib.contextmanager
def serve_site():
    """The site on 127.0.0.1 from a thread, its base URL while the block runs."""
    server = QuietServer(("127.0.0.1", 0), Site)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
