"""Bad input at the webhook relay, over real HTTP on loopback: each gets its HTTP status and one log
line, the relay keeps serving, and nothing reaches signal-cli that should not."""

import json
import logging
import socket
import time

import pytest

pytestmark = pytest.mark.usefixtures("caplog")


def relay_log(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "llm-fleet-webhook-relay"]


def raw_request(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(data)
        return conn.recv(4096)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "body is not JSON (JSONDecodeError"),
        (b"\xff\xfe", "body is not JSON (UnicodeDecodeError"),
        (b'["message"]', 'body must be a JSON object {"message": "..."}, got list'),
        (b'{"message": ""}', 'body needs "message": a non-empty string'),
        (b'{"message": "x", "title": 5}', '"title" must be a string'),
    ],
)
def test_a_malformed_body_is_400_logged_and_never_sent(running_relay, caplog, body, reason):
    caplog.set_level(logging.INFO)
    relay = running_relay()
    status, payload = relay.post(body)
    assert status == 400 and payload["reason"].startswith(reason)
    assert any(line.startswith("webhook from 127.0.0.1: 400 " + reason) for line in relay_log(caplog))
    assert relay.post(b'{"message": "still serving"}')[0] == 202
    assert relay.wait_for(lambda: len(relay.sent()) == 1) and relay.sent()[0][-2] == "still serving"


def test_an_oversized_body_is_413_before_it_is_read(running_relay, caplog):
    caplog.set_level(logging.INFO)
    relay = running_relay(max_body_bytes=1024)
    started = time.monotonic()
    # Claims 100 MB and sends none of it: the answer comes at once, without waiting for the body.
    answer = raw_request(relay.port, b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 413 ") and time.monotonic() - started < 2
    assert "webhook from 127.0.0.1: 413 body of 104857600 bytes is over the 1024-byte limit" in relay_log(caplog)
    status, payload = relay.post(json.dumps({"message": "x" * 5000}).encode(), {})
    assert status == 413 and payload["reason"] == "body of 5015 bytes is over the 1024-byte limit"


def test_a_missing_or_bogus_length_is_refused(running_relay):
    relay = running_relay()
    assert raw_request(relay.port, b"POST /webhook HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.0 411 ")
    assert raw_request(relay.port, b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n").startswith(b"HTTP/1.0 400 ")
    assert raw_request(relay.port, b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n").startswith(b"HTTP/1.0 400 ")
    assert relay.health()["status"] == "ok"


def test_a_flood_from_one_source_is_429_after_its_budget(running_relay, caplog):
    caplog.set_level(logging.INFO)
    relay = running_relay(rate_per_minute=10)
    statuses = [relay.post(json.dumps({"message": f"flood {i}"}).encode())[0] for i in range(40)]
    assert statuses == [202] * 10 + [429] * 30
    assert sum("429 more than 10 webhooks a minute from 127.0.0.1; retry in" in line for line in relay_log(caplog)) == 30
    assert relay.wait_for(lambda: len(relay.sent()) == 10)
    assert [argv[-2] for argv in relay.sent()] == [f"flood {i}" for i in range(10)], "in order"


def test_a_full_queue_is_503(running_relay):
    relay = running_relay(queue_size=2, send_timeout=3)
    relay.post(b'{"message": "stand-in:hang"}')  # holds the worker for send_timeout
    assert relay.wait_for(lambda: relay.health()["queued"] == 0)
    assert [relay.post(b'{"message": "x"}')[0] for _attempt in range(3)] == [202, 202, 503]


def test_signal_cli_failing_is_logged_kept_aside_and_the_next_message_goes(running_relay, caplog, tmp_path):
    caplog.set_level(logging.INFO)
    relay = running_relay()
    relay.post(b'{"message": "stand-in:fail"}')
    relay.post(b'{"message": "stand-in:unregistered"}')
    relay.post(b'{"message": "after the failures"}')
    assert relay.wait_for(lambda: relay.health()["delivered"] == 1)
    lines = relay_log(caplog)
    assert any("signal-cli exited 3: Failed to send message: network error (kept in spool/failed/)" in line for line in lines)
    assert any("signal-cli answered {'+4915100000002': 'UNREGISTERED_FAILURE'}" in line for line in lines)
    assert len(list((tmp_path / "spool" / "failed").iterdir())) == 2 and relay.health()["failed"] == 2


def test_signal_cli_hanging_is_killed_after_the_timeout(running_relay, caplog):
    caplog.set_level(logging.INFO)
    relay = running_relay(send_timeout=1)
    started = time.monotonic()
    relay.post(b'{"message": "stand-in:hang"}')
    relay.post(b'{"message": "after the hang"}')
    assert relay.wait_for(lambda: relay.health()["delivered"] == 1, timeout=10)
    assert time.monotonic() - started < 5
    assert any("signal-cli did not finish within 1 s and was killed" in line for line in relay_log(caplog))


def test_more_connections_than_the_bound_are_closed_and_the_relay_survives(running_relay, caplog):
    caplog.set_level(logging.INFO)
    relay = running_relay(max_connections=4)
    idle = [socket.create_connection(("127.0.0.1", relay.port), timeout=5) for _slot in range(4)]
    assert relay.wait_for(lambda: relay.server._slots._value == 0), "the server took the four idle connections"
    refused = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
    try:
        answer = refused.recv(10)
    except ConnectionResetError:
        answer = b""
    assert answer == b"", "closed without an answer"
    assert any("connections already open" in line for line in relay_log(caplog))
    for conn in idle:
        conn.close()

    def accepted() -> bool:
        try:
            return relay.post(b'{"message": "after the flood"}')[0] == 202
        except OSError:  # still closed while the idle connections' threads finish
            return False

    assert relay.wait_for(accepted)


def _trickle_until_cut(conn: socket.socket, data: bytes, every: float, give_up: float) -> tuple[float, bytes]:
    """Send `data` one byte every `every` seconds until the relay answers or closes: (seconds, answer)."""
    started = time.monotonic()
    conn.settimeout(every)
    index = 0
    while time.monotonic() - started < give_up:
        try:
            answer = conn.recv(4096)
            return time.monotonic() - started, answer  # an answer, or b"" when closed
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - started, b""
        try:
            conn.send(data[index % len(data) : index % len(data) + 1])
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - started, b""
        index += 1
    return time.monotonic() - started, b"still open"


@pytest.mark.parametrize(
    ("head", "trickled", "answer"),
    [
        (b"", b"POST /webhook HTTP/1.1\r\nX-Slow: " + b"a" * 100, b""),
        (b'POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 400\r\n\r\n{"message": "', b"a", b"HTTP/1.0 408 "),
    ],
    ids=["headers", "body"],
)
def test_a_slow_loris_client_is_cut_at_the_request_deadline(running_relay, caplog, head, trickled, answer):
    # Before: the 10 s timeout was per read, so a byte every 8 s held a connection for ever.
    caplog.set_level(logging.INFO)
    relay = running_relay(request_deadline=1)
    with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as conn:
        conn.sendall(head)
        took, got = _trickle_until_cut(conn, trickled, every=0.1, give_up=8)
    assert got.startswith(answer) and (answer or got == b""), got[:80]
    assert 0.9 <= took < 5, f"cut after {took:.2f} s, the deadline is 1 s"
    lines = relay_log(caplog)
    assert any("within the 1-second request_deadline" in line for line in lines), lines
    assert relay.post(b'{"message": "still serving"}')[0] == 202


def test_a_fifth_honest_client_is_served_while_four_slow_ones_hold_on(running_relay, caplog):
    # Before: four sockets sending a byte every 8 s kept a max_connections: 4 relay full.
    caplog.set_level(logging.INFO)
    relay = running_relay(max_connections=4, max_connections_per_source=2, request_deadline=30)
    slow = []
    for _client in range(4):
        conn = socket.socket()
        conn.settimeout(5)
        conn.bind(("127.0.0.2", 0))  # one source on the bridge, another loopback address here
        conn.connect(("127.0.0.1", relay.port))
        conn.sendall(b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        slow.append(conn)
    assert relay.wait_for(
        lambda: (
            sum("connection from 127.0.0.2 closed: 2 connections from it already open (max_connections_per_source)" in line for line in relay_log(caplog)) == 2
        )
    )
    started = time.monotonic()
    assert relay.post(b'{"message": "honest"}')[0] == 202
    assert time.monotonic() - started < 3, "served at once, not after the deadline"
    assert relay.wait_for(lambda: relay.sent() and relay.sent()[-1][-2] == "honest")
    held = 0
    for conn in slow:
        conn.setblocking(False)
        try:
            held += conn.recv(1) == b"x"  # never: an open connection has nothing to read
        except BlockingIOError:
            held += 1  # still open, still waiting on its body
        except (ConnectionResetError, OSError):
            pass
        conn.close()
    assert held == 2, "the two admitted slow clients still hold on; the other two were closed"
