# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The webhook relay: webhooks from containers on the podman bridge, forwarded as Signal messages
through signal-cli.

One file, Python standard library only: the webhook_relay role copies it to the host as
/usr/local/lib/llm-fleet/llm_fleet_webhook_relay.py (the collection is not installed there), and
the unit tests import it from here.

What it does with a POST /webhook (JSON {"message": "...", "title": "..."}):
- a body larger than max_body_bytes is refused with 413 before it is read, a missing length with
  411, a body that is not that JSON object with 400;
- more than rate_per_minute posts from one source address in a minute get 429 (Retry-After);
- an accepted message is written to the spool directory (one file each) before the 202, and a
  worker hands the spool to signal-cli in order; a full spool (queue_size messages) answers 503.
  A restart replays the spool, so what got its 202 is delivered at least once (a message being
  sent while the relay stops may be sent twice);
- signal-cli failing (non-zero exit, or a result other than SUCCESS) or hanging (killed after
  send_timeout seconds) is one log line; the message moves to spool/failed/ and the next one goes.
- a slow client is bounded per request, not per read: the whole request (request line, headers and
  body) must arrive within request_deadline seconds (default 10) or the connection is closed (408
  when the body was late); one source address holds at most max_connections_per_source (default 8)
  of the max_connections (default 32) connections, so a few slow sockets cannot fill the relay.
GET /health answers 200 with the counters.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.server
import io
import itertools
import json
import logging
import os
import queue
import re
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LOG = logging.getLogger("llm-fleet-webhook-relay")
E164_RE = re.compile(r"^\+[1-9][0-9]{6,14}$")
MAX_MESSAGE_CHARS = 4000


class ConfigError(ValueError):
    """A relay configuration that cannot work; names the key and the fix."""


class BadWebhook(ValueError):
    """A webhook refused: the HTTP status to answer and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def signal_cli_argv(signal_cli: str, account: str, recipients: list[str], message: str, config_dir: str = "") -> list[str]:
    """signal-cli's send command line. The account is the E.164 number with its '+': signal-cli
    0.14.7 parses an all-digit -a value as a phone number, so a numeric account name never
    resolves. The message is the -m option: a positional after `send` is another recipient."""
    if not isinstance(account, str) or not E164_RE.match(account):
        if isinstance(account, str) and account.isdigit():
            raise ConfigError(
                f"account: {account!r} is all digits, which signal-cli parses as a phone number and never resolves: "
                f"write the account's number in E.164 form with its '+' (e.g. +{account})"
            )
        raise ConfigError(f"account: {account!r} is not an E.164 number: write it as +<country code><number>, e.g. +4915123456789")
    if not recipients:
        raise ConfigError("recipients: give at least one E.164 number to send to")
    for index, recipient in enumerate(recipients):
        if not isinstance(recipient, str) or not E164_RE.match(recipient):
            raise ConfigError(f"recipients[{index}]: {recipient!r} is not an E.164 number: write it as +<country code><number>")
    if not isinstance(message, str) or not message.strip() or "\0" in message:
        raise BadWebhook(400, "message: empty, or not text")
    argv = [signal_cli]
    if config_dir:
        argv += ["--config", config_dir]
    return [*argv, "-a", account, "-o", "json", "send", "-m", message, *recipients]


def parse_webhook(body: bytes) -> str:
    """The Signal text of a webhook body: {"message": str, "title": str (optional)}."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadWebhook(400, f"body is not JSON ({exc.__class__.__name__}: {str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise BadWebhook(400, f'body must be a JSON object {{"message": "..."}}, got {type(data).__name__}')
    message, title = data.get("message"), data.get("title", "")
    if not isinstance(message, str) or not message.strip():
        raise BadWebhook(400, 'body needs "message": a non-empty string')
    if not isinstance(title, str):
        raise BadWebhook(400, '"title" must be a string')
    text = f"{title.strip()}\n{message}" if title.strip() else message
    if len(text) > MAX_MESSAGE_CHARS:
        raise BadWebhook(413, f"message is {len(text)} characters, more than {MAX_MESSAGE_CHARS}")
    if "\0" in text:
        raise BadWebhook(400, "message contains NUL")
    return text


class RateLimiter:
    """At most `limit` posts per `window` seconds from one source, for at most `max_sources`
    sources at once. State lives on the instance and is pruned in place: the shell relay's prune
    rebound a module global inside the function, and every webhook died on 'cannot access local
    variable _last_sent'."""

    def __init__(self, limit: int, window: float = 60.0, max_sources: int = 4096, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self.max_sources, self.clock = limit, window, max_sources, clock
        self._last_sent: dict[str, collections.deque[float]] = {}
        self._lock = threading.Lock()

    def retry_after(self, source: str) -> float:
        """0 when `source` may post now (the post is counted), else the seconds until it may."""
        with self._lock:
            now = self.clock()
            self._prune(now)
            sent = self._last_sent.get(source)
            if sent is None:
                if len(self._last_sent) >= self.max_sources:
                    return self.window
                sent = self._last_sent[source] = collections.deque()
            while sent and sent[0] <= now - self.window:
                sent.popleft()
            if len(sent) >= self.limit:
                return sent[0] + self.window - now
            sent.append(now)
            return 0.0

    def _prune(self, now: float) -> None:
        for source in [s for s, sent in self._last_sent.items() if not sent or sent[-1] <= now - self.window]:
            del self._last_sent[source]

    def sources(self) -> int:
        with self._lock:
            return len(self._last_sent)


class Spool:
    """Accepted messages, one file each in `directory`, until signal-cli has taken them: the
    bounded queue that survives a restart."""

    def __init__(self, directory: str, capacity: int) -> None:
        self.directory, self.capacity = directory, capacity
        self.failed_dir = os.path.join(directory, "failed")
        os.makedirs(self.failed_dir, mode=0o700, exist_ok=True)
        self._names: queue.Queue[str] = queue.Queue()
        self._lock = threading.Lock()
        self._sequence = itertools.count()
        for name in sorted(n for n in os.listdir(directory) if n.endswith(".json")):
            self._names.put(name)

    def pending(self) -> int:
        return self._names.qsize()

    def put(self, text: str, source: str) -> bool:
        """False when the spool is full."""
        with self._lock:
            if self._names.qsize() >= self.capacity:
                return False
            name = f"{time.time_ns():020d}-{next(self._sequence):06d}.json"
            # Temp file and rename in the spool directory: a restart never replays half a message.
            fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=self.directory)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"message": text, "source": source}, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, os.path.join(self.directory, name))
            self._names.put(name)
            return True

    def take(self, timeout: float) -> tuple[str, dict[str, Any]] | None:
        try:
            name = self._names.get(timeout=timeout)
        except queue.Empty:
            return None
        path = os.path.join(self.directory, name)
        try:
            with open(path, encoding="utf-8") as handle:
                return name, json.load(handle)
        except (OSError, ValueError) as exc:
            LOG.error("spool: %s is unreadable (%s); moved to failed/", name, exc)
            self.fail(name)
            return None

    def done(self, name: str) -> None:
        os.unlink(os.path.join(self.directory, name))

    def fail(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.replace(os.path.join(self.directory, name), os.path.join(self.failed_dir, name))


def send(argv: list[str], timeout: float) -> tuple[bool, str]:
    """Run signal-cli once: (delivered, what happened, for the log)."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return False, f"signal-cli did not finish within {timeout:g} s and was killed"
    except OSError as exc:
        return False, f"signal-cli could not start: {exc}"
    stderr = " ".join(proc.stderr.split())[-300:]
    if proc.returncode != 0:
        return False, f"signal-cli exited {proc.returncode}: {stderr or 'no message'}"
    try:
        results = json.loads(proc.stdout.strip().splitlines()[-1])["results"]
        types = {str(r["recipientAddress"].get("number")): r["type"] for r in results}
    except (IndexError, KeyError, TypeError, AttributeError, ValueError):
        return False, f"signal-cli exited 0 but its output is not send's JSON result: {proc.stdout.strip()[:200]!r}"
    failed = {number: kind for number, kind in types.items() if kind != "SUCCESS"}
    if failed or not types:
        return False, f"signal-cli answered {failed or 'no results'}"
    return True, "SUCCESS"


@dataclass
class Config:
    bind: str
    port: int
    signal_cli: str
    account: str
    recipients: list[str]
    spool_dir: str
    signal_cli_config_dir: str = ""
    queue_size: int = 100
    rate_per_minute: int = 10
    max_body_bytes: int = 65536
    send_timeout: float = 60.0
    max_connections: int = 32
    max_connections_per_source: int = 8
    request_deadline: float = 10.0
    counters: dict[str, int] = field(default_factory=lambda: {"accepted": 0, "delivered": 0, "failed": 0, "refused": 0})


def load_config(data: dict[str, Any]) -> Config:
    required = ["bind", "port", "signal_cli", "account", "recipients", "spool_dir"]
    missing = [key for key in required if key not in data]
    if missing:
        raise ConfigError(f"missing keys: {', '.join(missing)}")
    known = set(Config.__dataclass_fields__) - {"counters"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    config = Config(**data)
    for key in ("port", "queue_size", "rate_per_minute", "max_body_bytes", "max_connections", "max_connections_per_source"):
        value = getattr(config, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key}: {value!r} must be a positive integer")
    for key in ("send_timeout", "request_deadline"):
        value = getattr(config, key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 3600:
            raise ConfigError(f"{key}: {value!r} must be a number of seconds in (0, 3600]")
    if config.port > 65535:
        raise ConfigError(f"port: {config.port} is not a TCP port (1-65535)")
    if not os.path.isabs(config.signal_cli):
        raise ConfigError(f"signal_cli: {config.signal_cli!r} must be an absolute path")
    signal_cli_argv(config.signal_cli, config.account, config.recipients, "check", config.signal_cli_config_dir)
    return config


class Relay:
    """The server's state: the limiter, the spool and the worker that drains it."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.limiter = RateLimiter(config.rate_per_minute)
        self.spool = Spool(config.spool_dir, config.queue_size)
        self.stopping = threading.Event()
        if self.spool.pending():
            LOG.info("spool: %d messages from before the restart will be sent", self.spool.pending())

    def accept(self, source: str, length: str | None, read: Callable[[int], bytes]) -> tuple[int, str]:
        """The answer to a POST: (status, reason)."""
        if length is None:
            return 411, "Content-Length is required"
        try:
            size = int(length)
        except ValueError:
            return 400, f"Content-Length {length[:20]!r} is not a number"
        if size < 0:
            return 400, "Content-Length is negative"
        if size > self.config.max_body_bytes:
            return 413, f"body of {size} bytes is over the {self.config.max_body_bytes}-byte limit"
        wait = self.limiter.retry_after(source)
        if wait:
            return 429, f"more than {self.config.rate_per_minute} webhooks a minute from {source}; retry in {wait:.0f} s"
        try:
            text = parse_webhook(read(size))
        except BadWebhook as exc:
            return exc.status, exc.reason
        except TimeoutError as exc:  # the request's deadline passed while its body trickled in
            return 408, f"body not received: {exc}"
        if not self.spool.put(text, source):
            return 503, f"queue full ({self.config.queue_size} messages waiting for signal-cli)"
        return 202, "queued"

    def drain(self) -> None:
        while not self.stopping.is_set():
            taken = self.spool.take(timeout=0.5)
            if taken is None:
                continue
            name, record = taken
            try:
                argv = signal_cli_argv(
                    self.config.signal_cli, self.config.account, self.config.recipients, record["message"], self.config.signal_cli_config_dir
                )
                ok, detail = send(argv, self.config.send_timeout)
            except (KeyError, TypeError, BadWebhook, ConfigError) as exc:
                ok, detail = False, f"spooled message is not sendable ({exc})"
            if ok:
                self.spool.done(name)
                self.config.counters["delivered"] += 1
                LOG.info("delivered %s from %s", name, record.get("source"))
            else:
                self.spool.fail(name)
                self.config.counters["failed"] += 1
                LOG.error("not delivered %s from %s: %s (kept in spool/failed/)", name, record.get("source"), detail)

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "queued": self.spool.pending(), **self.config.counters}


class DeadlineReader(io.RawIOBase):
    """A socket's reads bounded by one deadline per request, not per read: each read waits at
    most the time left, so a client sending a byte every few seconds is cut when the deadline
    passes (socketserver's timeout alone restarts with every byte)."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        super().__init__()
        self.sock, self.seconds = sock, seconds
        self.deadline = time.monotonic() + seconds

    def start(self) -> None:
        self.deadline = time.monotonic() + self.seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"not received within the {self.seconds:g}-second request_deadline")
        self.sock.settimeout(left)
        try:
            return self.sock.recv_into(buffer)
        except TimeoutError:
            raise TimeoutError(f"not received within the {self.seconds:g}-second request_deadline") from None


def make_handler(relay: Relay) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "llm-fleet-webhook-relay"
        # Reads are bounded by the request's deadline (DeadlineReader); writes by this many seconds.
        timeout = relay.config.request_deadline

        def setup(self) -> None:
            super().setup()
            self.rfile.close()  # the socket's own file; the deadline reader takes its place
            self._reader = DeadlineReader(self.connection, relay.config.request_deadline)
            self.rfile = io.BufferedReader(self._reader)

        def handle_one_request(self) -> None:
            # The deadline counts from the moment the relay waits for a request, so an idle
            # kept-alive connection is bounded too.
            self._reader.start()
            super().handle_one_request()

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            self.connection.settimeout(relay.config.request_deadline)  # the reads left it at their remainder
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if status == 429:
                self.send_header("Retry-After", "60")
            if status in (400, 408, 411, 413):
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path != "/health":
                self._answer(404, {"error": "GET /health only"})
                return
            self._answer(200, relay.health())

        def do_POST(self) -> None:
            source = self.client_address[0]
            if self.path not in ("/webhook", "/"):
                status, reason = 404, "POST /webhook"
            else:
                status, reason = relay.accept(source, self.headers.get("Content-Length"), self.rfile.read)
            relay.config.counters["accepted" if status == 202 else "refused"] += 1
            level = logging.INFO if status == 202 else logging.WARNING
            LOG.log(level, "webhook from %s: %d %s", source, status, reason)
            self._answer(status, {"status": status, "reason": reason})

        def log_message(self, format: str, *args: Any) -> None:  # the base class's parameter name
            # Request lines are logged by do_POST with the outcome; this keeps the server's own errors.
            text = format % args
            if "code 400" in text or "timed out" in text or "request_deadline" in text:
                LOG.warning("%s: %s", self.client_address[0], text)

    return Handler


class BoundedServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """A thread per connection, at most `max_connections` at once and at most `max_per_source`
    from one source address: a flood is refused, not queued, and one source cannot take every slot."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, max_connections: int, max_per_source: int | None = None) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self.max_per_source = max_per_source or max_connections
        self._per_source: dict[str, int] = {}
        self._sources_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        source = client_address[0]
        with self._sources_lock:
            open_here = self._per_source.get(source, 0)
            if open_here >= self.max_per_source:
                LOG.warning("connection from %s closed: %d connections from it already open (max_connections_per_source)", source, open_here)
                self.shutdown_request(request)
                return
            self._per_source[source] = open_here + 1
        if not self._slots.acquire(blocking=False):
            self._leave(source)
            LOG.warning("connection from %s closed: %s connections already open", source, self._slots._initial_value)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _leave(self, source: str) -> None:
        with self._sources_lock:
            left = self._per_source.get(source, 1) - 1
            if left > 0:
                self._per_source[source] = left
            else:
                self._per_source.pop(source, None)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._leave(client_address[0])
            self._slots.release()


def serve(config: Config) -> None:
    relay = Relay(config)
    worker = threading.Thread(target=relay.drain, name="signal-cli", daemon=True)
    worker.start()
    server = BoundedServer((config.bind, config.port), make_handler(relay), config.max_connections, config.max_connections_per_source)
    LOG.info("listening on %s:%d, sending as %s to %d recipients", config.bind, config.port, config.account, len(config.recipients))
    try:
        server.serve_forever()
    finally:
        relay.stopping.set()
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the relay's JSON configuration (the webhook_relay role writes it)")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        with open(args.config, encoding="utf-8") as handle:
            config = load_config(json.load(handle))
    except (OSError, ValueError) as exc:
        LOG.error("%s: %s", args.config, exc)
        return 2
    if args.check:
        sys.stdout.write(f"{args.config}: ok\n")
        return 0
    serve(config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
