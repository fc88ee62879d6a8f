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
