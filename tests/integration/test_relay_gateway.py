"""The webhook relay reached the way the fleet's containers reach it: through the bridge gateway,
by the name podman gives it in every container (`host.containers.internal`), for real on the lab
host. Seed 003: "a host socket on 192.168.0.143:18094 answers the container's 169.254.1.2:18094
dial while the LAN IP refuses from the container".

On the lab host podman runs rootful with netavark, so `host.containers.internal` is the bridge's
gateway, an address of the host (10.89.0.1 on the companions' bridge, 10.89.0.0/16 as
production's); the relay is deployed bound to it (`webhook_relay_bind`), as production's is bound
where its containers' gateway dial lands. (One quirk of the nested lab: the lab host's own
/etc/hosts, written by the podman that runs the lab host, already names host.containers.internal
as that outer podman's gateway, and podman 4.3 keeps a name its base hosts file has; so the client
container gets the entry podman writes on a host of its own, `--add-host
host.containers.internal:GATEWAY`.) Then:
- a container on the bridge posts to http://host.containers.internal:18093/webhook: 202, and
  signal-cli's stand-in gets the message;
- the same container dialling the lab host's LAN address (its eth0) is refused: nothing listens
  there for it;
- a client outside the allowed networks (a network namespace on the lab host, 198.18.0.2)
  dialling the gateway address is dropped, counted by the relay's table."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from lab_host import HOST, OUTSIDE_NETNS, dropped_from_outside, env, failures, lab_addresses, on_host, playbook, require_lab_host, unit_property

# A fault-matrix row: `make fault-matrix` runs it, `make test` does not (pytest.ini, fault_row).
pytestmark = [pytest.mark.lab, pytest.mark.fault_row]

require_lab_host()

UNIT = "llm-fleet-webhook-relay.service"
TABLE = "llm_fleet_webhook_relay"
PORT = 18093
BRIDGE = "llm-fleet-companions"
CLIENT = "llm-fleet-relay-client"
STAND_IN_LOG = "/var/lib/llm-fleet-webhook-relay/signal-cli-stand-in.jsonl"


def remove_relay() -> None:
    on_host("systemctl", "disable", "--now", UNIT, check=False)
    on_host("nft", "delete", "table", "inet", TABLE, check=False)
    on_host(
        "rm", "-rf", f"/etc/systemd/system/{UNIT}", "/etc/llm-fleet/webhook-relay.json", "/etc/llm-fleet/webhook-relay.nft", "/var/lib/llm-fleet-webhook-relay"
    )
    on_host("systemctl", "daemon-reload")
    on_host("systemctl", "reset-failed", UNIT, check=False)


@pytest.fixture
def gateway(request):
    """The companions' bridge with a client container on it (so the bridge and its gateway address
    are up), and the gateway's address. netavark 1.4 needs iptables for a bridge's NAT, which the
    lab host image lacks: installed from the Debian mirror when missing."""
    if on_host("sh", "-c", "command -v iptables", check=False) == "":
        on_host("sh", "-c", "DEBIAN_FRONTEND=noninteractive apt-get -qq update && apt-get install -y -qq --no-install-recommends iptables")
    made_bridge = not on_host("podman", "network", "ls", "-q", "--filter", f"name=^{BRIDGE}$")
    if made_bridge:
        on_host("podman", "network", "create", "--subnet", "10.89.0.0/16", BRIDGE)
    image = next(line for line in on_host("podman", "images", "--format", "{{.Repository}}:{{.Tag}}").splitlines() if "llamacpp" in line)
    on_host("podman", "rm", "-f", "--ignore", CLIENT)
    gateway = on_host("podman", "network", "inspect", BRIDGE, "--format", "{{range .Subnets}}{{.Gateway}}{{end}}")
    on_host(
        "podman", "run", "-d", "--rm", "--name", CLIENT, "--network", BRIDGE, "--add-host", f"host.containers.internal:{gateway}",
        "--entrypoint", "sleep", image, "600",
    )  # fmt: skip
    remove_relay()

    def cleanup() -> None:
        remove_relay()
        on_host("ip", "netns", "delete", OUTSIDE_NETNS, check=False)
        on_host("podman", "rm", "-f", "-t", "0", "--ignore", CLIENT, check=False)
        if made_bridge:
            on_host("podman", "network", "rm", BRIDGE, check=False)

    request.addfinalizer(cleanup)
    return gateway


def from_client(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", HOST, "podman", "exec", CLIENT, *argv], capture_output=True, text=True, env=env(), check=False)


def post(url: str, message: str) -> subprocess.CompletedProcess:
    """wget's answer on stdout, its own account of a failure (e.g. "Connection refused") on stderr."""
    body = json.dumps({"title": "lab", "message": message})
    return from_client("wget", "-nv", "-T", "5", "-t", "1", "-O-", "--header", "Content-Type: application/json", f"--post-data={body}", url)


def test_a_container_reaches_the_relay_through_the_gateway_not_the_lan_and_outsiders_are_dropped(tmp_path, gateway):
    hosts = from_client("cat", "/etc/hosts").stdout
    assert re.search(rf"^{re.escape(gateway)}\s+host\.containers\.internal\b", hosts, re.MULTILINE), hosts
    assert on_host("ip", "-4", "-o", "addr", "show", "to", gateway) != "", "the bridge's gateway is an address of the lab host"

    rc, _stats, out = playbook(tmp_path, "companions.yml", "-e", f"webhook_relay_bind={gateway}", limit="webhook-relay")
    assert rc == 0, failures(out) or out[-3000:]
    assert unit_property(UNIT, "ActiveState") == "active"

    # The path the fleet's containers use: the gateway, by its name.
    answer = post(f"http://host.containers.internal:{PORT}/webhook", "disk full, via the gateway")
    assert answer.returncode == 0 and json.loads(answer.stdout) == {"status": 202, "reason": "queued"}, answer.stderr
    delivered = on_host("sh", "-c", f"for i in $(seq 50); do [ -s {STAND_IN_LOG} ] && break; sleep 0.1; done; cat {STAND_IN_LOG}")
    assert [json.loads(line)["argv"][-2] for line in delivered.splitlines()] == ["lab\ndisk full, via the gateway"]

    # The LAN address refuses the container: nothing listens there for it.
    own, _controller = lab_addresses()
    refused = post(f"http://{own}:{PORT}/webhook", "via the LAN")
    assert refused.returncode != 0 and "refused" in refused.stderr.lower(), (refused.returncode, refused.stderr)

    # A client outside the allowed networks is dropped (a connect timeout), and the table counts it.
    assert dropped_from_outside(gateway, PORT)
    table = on_host("nft", "list", "table", "inet", TABLE)
    assert re.search(rf"tcp dport {PORT} counter packets [1-9]\d* bytes \d+ drop", table), table
