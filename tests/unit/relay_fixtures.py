"""The webhook relay served in a thread on loopback, sending through the lab's signal-cli stand-in
(lab/signal-cli-stand-in): shared by tests/unit and tests/hostile."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.relay import webhook_relay

STAND_IN = Path(__file__).resolve().parents[2] / "lab" / "signal-cli-stand-in"
ACCOUNT = "+4915100000001"
RECIPIENT = "+4915100000002"


class RunningRelay:
    def __init__(self, config: webhook_relay.Config, log: Path) -> None:
        self.config, self.log = config, log
        self.relay = webhook_relay.Relay(config)
        self.server = webhook_relay.BoundedServer(
            ("127.0.0.1", 0), webhook_relay.make_handler(self.relay), config.max_connections, config.max_connections_per_source
        )
        self.port = self.server.server_address[1]
        self.threads = [threading.Thread(target=self.server.serve_forever, daemon=True), threading.Thread(target=self.relay.drain, daemon=True)]
        for thread in self.threads:
            thread.start()

    def post(self, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        conn.request("POST", "/webhook", body=body, headers={"Content-Type": "application/json", **(headers or {})})
        answer = conn.getresponse()
        status, payload = answer.status, json.loads(answer.read() or b"{}")
        conn.close()
        return status, payload

    def health(self) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())

    def sent(self) -> list[list[str]]:
        """The argv of every signal-cli run so far."""
        if not self.log.exists():
            return []
        return [json.loads(line)["argv"] for line in self.log.read_text().splitlines()]

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self.relay.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.threads[1].join(timeout=5)


def relay_config(tmp_path: Path, **overrides) -> webhook_relay.Config:
    data = {
        "bind": "127.0.0.1",
        "port": 18093,
        "signal_cli": str(STAND_IN),
        "account": ACCOUNT,
        "recipients": [RECIPIENT],
        "spool_dir": str(tmp_path / "spool"),
        **overrides,
    }
    return webhook_relay.load_config(data)


@pytest.fixture
def running_relay(tmp_path, monkeypatch):
    """Start a relay with the given config overrides; stopped at teardown."""
    monkeypatch.setenv("SIGNAL_CLI_STAND_IN_LOG", str(tmp_path / "signal-cli.jsonl"))
    started: list[RunningRelay] = []

    def start(**overrides) -> RunningRelay:
        relay = RunningRelay(relay_config(tmp_path, **overrides), tmp_path / "signal-cli.jsonl")
        started.append(relay)
        return relay

    yield start
    for relay in started:
        relay.stop()
