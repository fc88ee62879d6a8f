"""The webhook relay's laws: signal-cli's argv, the per-source rate limit, the bounded spool that a
restart replays, and a webhook delivered end to end through the lab's signal-cli stand-in."""

import json
import subprocess

import pytest
from relay_fixtures import ACCOUNT, RECIPIENT, STAND_IN

from ansible_collections.frank.llm_fleet.plugins.module_utils.relay import webhook_relay
from ansible_collections.frank.llm_fleet.plugins.module_utils.relay.webhook_relay import ConfigError, RateLimiter, Spool, signal_cli_argv


def test_the_message_is_the_m_option_and_every_positional_is_a_recipient():
    # Seed 003: "the message is a -m option, not a positional (a positional is parsed as a second
    # recipient). Verified live: corrected invocation returns type SUCCESS."
    argv = signal_cli_argv("/usr/bin/signal-cli", ACCOUNT, [RECIPIENT, "+4915100000003"], "disk full on dankclaw")
    assert argv == [
        "/usr/bin/signal-cli",
        "-a",
        ACCOUNT,
        "-o",
        "json",
        "send",
        "-m",
        "disk full on dankclaw",
        RECIPIENT,
        "+4915100000003",
    ]
    # The real parser's reading (the stand-in parses as signal-cli does): SUCCESS for both recipients.
    proc = subprocess.run([str(STAND_IN), *argv[1:]], capture_output=True, text=True, env={"SIGNAL_CLI_STAND_IN_LOG": "/dev/null"}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [r["type"] for r in json.loads(proc.stdout)["results"]] == ["SUCCESS", "SUCCESS"]


def test_the_stand_in_refuses_the_message_as_a_positional_as_signal_cli_does():
    # Seed 003: "a positional is parsed as a second recipient".
    proc = subprocess.run(
        [str(STAND_IN), "-a", ACCOUNT, "send", RECIPIENT, "hello"], capture_output=True, text=True, env={"SIGNAL_CLI_STAND_IN_LOG": "/dev/null"}, check=False
    )
    assert proc.returncode == 1 and "Invalid number: hello" in proc.stderr


def test_an_all_digit_account_is_refused_naming_the_fix():
    # Seed 003: "signal-cli 0.14.7 parses an all-digit -a value as a phone number (the numeric
    # account name never resolves)".
    with pytest.raises(ConfigError, match=r"^account: '4915100000001' is all digits, .* \(e\.g\. \+4915100000001\)$"):
        signal_cli_argv("/usr/bin/signal-cli", "4915100000001", [RECIPIENT], "x")
    with pytest.raises(ConfigError, match=r"^recipients\[1\]: 'ops' is not an E\.164 number"):
        signal_cli_argv("/usr/bin/signal-cli", ACCOUNT, [RECIPIENT, "ops"], "x")


def test_a_config_with_an_all_digit_account_fails_the_check_before_the_unit_starts(tmp_path):
    config = tmp_path / "relay.json"
    config.write_text(
        json.dumps(
            {
                "bind": "127.0.0.1",
                "port": 18093,
                "signal_cli": "/usr/bin/signal-cli",
                "account": "4915100000001",
                "recipients": [RECIPIENT],
                "spool_dir": str(tmp_path),
            }
        )
    )
    assert webhook_relay.main(["--config", str(config), "--check"]) == 2
    config.write_text(json.dumps({"bind": "127.0.0.1", "port": 18093, "signal_cli": "/usr/bin/signal-cli", "acount": ACCOUNT}))
    with pytest.raises(ConfigError, match=r"^missing keys: account, recipients, spool_dir$"):
        webhook_relay.load_config(json.loads(config.read_text()))


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_rate_limit_is_per_source_and_reopens_after_the_window():
    clock = Clock()
    limiter = RateLimiter(limit=3, window=60, clock=clock)
    assert [limiter.retry_after("10.89.0.5") for _post in range(3)] == [0.0, 0.0, 0.0]
    clock.now += 10
    assert limiter.retry_after("10.89.0.5") == pytest.approx(50.0)
    assert limiter.retry_after("10.89.0.6") == 0.0, "another source has its own budget"
    clock.now += 50.001
    assert limiter.retry_after("10.89.0.5") == 0.0


def test_the_prune_keeps_the_state_and_the_next_webhook_passes():
    # Seed 003: "Every webhook died on 'cannot access local variable _last_sent' because the prune
    # comprehension rebound the module global inside the function. Prune in place instead."
    clock = Clock()
    limiter = RateLimiter(limit=2, window=60, clock=clock)
    state = limiter._last_sent
    for source in ("10.89.0.5", "10.89.0.6", "10.89.0.7"):
        assert limiter.retry_after(source) == 0.0
    clock.now += 61  # every source is stale: the next call prunes them all
    assert limiter.retry_after("10.89.0.8") == 0.0
    assert limiter._last_sent is state, "pruned in place, never rebound"
    assert list(state) == ["10.89.0.8"]
    assert limiter.retry_after("10.89.0.8") == 0.0 and limiter.retry_after("10.89.0.8") > 0


def test_the_limiter_holds_a_bounded_number_of_sources():
    clock = Clock()
    limiter = RateLimiter(limit=1, window=60, max_sources=100, clock=clock)
    refused = [limiter.retry_after(f"10.89.{i // 256}.{i % 256}") for i in range(1000)]
    assert limiter.sources() == 100 and sum(1 for wait in refused if wait) == 900
    clock.now += 61
    assert limiter.retry_after("10.89.9.9") == 0.0 and limiter.sources() == 1


def test_the_spool_is_bounded_and_a_restart_replays_it_in_order(tmp_path):
    spool = Spool(str(tmp_path), capacity=2)
    assert spool.put("first", "10.89.0.5") and spool.put("second", "10.89.0.5")
    assert not spool.put("third", "10.89.0.5"), "full: the caller answers 503"
    restarted = Spool(str(tmp_path), capacity=2)
    assert restarted.pending() == 2
    name, record = restarted.take(timeout=0)
    assert record == {"message": "first", "source": "10.89.0.5"}
    restarted.done(name)
    assert Spool(str(tmp_path), capacity=2).take(timeout=0)[1]["message"] == "second"


def test_a_webhook_reaches_signal_cli_with_the_seed_argv(running_relay):
    relay = running_relay()
    assert relay.post(json.dumps({"title": "backup", "message": "nightly backup failed"}).encode()) == (202, {"status": 202, "reason": "queued"})
    assert relay.wait_for(relay.sent)
    assert relay.sent() == [["-a", ACCOUNT, "-o", "json", "send", "-m", "backup\nnightly backup failed", RECIPIENT]]
    assert relay.wait_for(lambda: relay.health()["delivered"] == 1)
    assert relay.health() == {"status": "ok", "queued": 0, "accepted": 1, "delivered": 1, "failed": 0, "refused": 0}
