"""The webhook relay for real on the lab host (inventories/lab, group webhook_relays), sending through
the signal-cli stand-in (lab/signal-cli-stand-in):
- a container on a podman bridge of the lab host (10.89.0.0/16, as production's) posts a webhook to
  the host's own address and the stand-in receives signal-cli's argv with the account's '+' and
  the message as -m;
- a source outside the allowed set (a network namespace on the lab host, 198.18.0.2) is dropped,
  counted by the relay's nftables table; the health probe from the host itself passes;
- a second run changes nothing; webhook_relay_state=absent removes the unit and the table."""

import json
import re

import pytest
from lab_host import OUTSIDE_NETNS, dropped_from_outside, failures, lab_addresses, on_host, playbook, require_lab_host, unit_property

pytestmark = pytest.mark.lab

require_lab_host()

UNIT = "llm-fleet-webhook-relay.service"
TABLE = "llm_fleet_webhook_relay"
PORT = 18093
BRIDGE = "llm-fleet-companions"
STAND_IN_LOG = "/var/lib/llm-fleet-webhook-relay/signal-cli-stand-in.jsonl"


def remove_relay() -> None:
    on_host("systemctl", "disable", "--now", UNIT, check=False)
    on_host("nft", "delete", "table", "inet", TABLE, check=False)
    on_host("ip", "netns", "delete", OUTSIDE_NETNS, check=False)
    on_host(
        "rm", "-rf", f"/etc/systemd/system/{UNIT}", "/etc/llm-fleet/webhook-relay.json", "/etc/llm-fleet/webhook-relay.nft", "/var/lib/llm-fleet-webhook-relay"
    )
    on_host("systemctl", "daemon-reload")
    on_host("systemctl", "reset-failed", UNIT, check=False)


@pytest.fixture
def bridge(request):
    """A podman network on the lab host with production's bridge subnet. netavark 1.4 (bookworm)
    sets up a bridge's NAT with iptables, which the lab host image lacks: installed here from the
    Debian mirror when missing (lab/images/host.sh does not carry it yet)."""
    if on_host("sh", "-c", "command -v iptables", check=False) == "":
        on_host(
            "sh",
            "-c",
            "DEBIAN_FRONTEND=noninteractive apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables",
        )
    if not on_host("podman", "network", "ls", "-q", "--filter", f"name=^{BRIDGE}$"):
        on_host("podman", "network", "create", "--subnet", "10.89.0.0/16", BRIDGE)
    remove_relay()
    request.addfinalizer(remove_relay)
    return BRIDGE


def deploy(tmp_path, *extra):
    rc, stats, out = playbook(tmp_path, "companions.yml", *extra, limit="webhook-relay")
    assert rc == 0, failures(out) or out[-3000:]
    return stats


def post_from_container(own: str, message: str) -> str:
    image = next(line for line in on_host("podman", "images", "--format", "{{.Repository}}:{{.Tag}}").splitlines() if "llamacpp" in line)
    body = json.dumps({"title": "lab", "message": message})
    return on_host(
        "podman", "run", "--rm", "--network", BRIDGE, "--entrypoint", "wget", image,
        "-q", "-O-", "--header", "Content-Type: application/json", f"--post-data={body}", f"http://{own}:{PORT}/webhook",
    )  # fmt: skip


def test_a_webhook_from_the_bridge_reaches_signal_cli_and_outsiders_are_dropped(tmp_path, bridge):
    own, _controller = lab_addresses()
    stats = deploy(tmp_path)
    assert stats["changed"] > 0 and unit_property(UNIT, "ActiveState") == "active"
    assert unit_property(UNIT, "User") == "llm-fleet-relay"

    # Seed 003: "the first live webhook failed with 'dial tcp 169.254.1.2:18093: connection refused'"
    # on a loopback bind; bound to the host's address, a container on the bridge gets through.
    assert json.loads(post_from_container(own, "disk full on the lab host")) == {"status": 202, "reason": "queued"}
    deadline_lines = on_host("sh", "-c", f"for i in $(seq 50); do [ -s {STAND_IN_LOG} ] && break; sleep 0.1; done; cat {STAND_IN_LOG}")
    argv = [json.loads(line)["argv"] for line in deadline_lines.splitlines()]
    # Seed 003: "signal-cli 0.14.7 parses an all-digit -a value as a phone number" and "the message
    # is a -m option, not a positional".
    assert argv == [["--config", "/var/lib/signal-cli", "-a", "+4915100000001", "-o", "json", "send", "-m", "lab\ndisk full on the lab host", "+4915100000002"]]
    health = json.loads(on_host("curl", "-sf", f"http://{own}:{PORT}/health"))
    assert health["delivered"] == 1 and health["failed"] == 0

    # Seed 003: "ACCEPT 127.0.0.1, ACCEPT the host IP, ACCEPT 10.89.0.0/16, then DROP".
    assert dropped_from_outside(own, PORT)
    table = on_host("nft", "list", "table", "inet", TABLE)
    assert re.search(rf"tcp dport {PORT} counter packets [1-9]\d* bytes \d+ drop", table), table
    assert "/etc/llm-fleet/webhook-relay.nft" in unit_property(UNIT, "ExecStartPre")

    # A rerun changes nothing and does not restart the relay.
    pid = unit_property(UNIT, "MainPID")
    assert deploy(tmp_path)["changed"] == 0
    assert unit_property(UNIT, "MainPID") == pid

    # Removed: no unit, no table.
    deploy(tmp_path, "-e", "webhook_relay_state=absent")
    assert on_host("nft", "list", "table", "inet", TABLE, check=False) == ""
    assert unit_property(UNIT, "LoadState") == "not-found"
