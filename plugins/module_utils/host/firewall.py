# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bind policy and the firewall that goes with a LAN bind.

An engine binds loopback unless the inventory declares the LAN. A LAN bind must name the client
networks allowed, and (unless the inventory says otherwise, explicitly) carry an API key. The
endpoint then gets one nftables table of its own, `inet llm_fleet_<endpoint>`, which admits on the
engine's port, in this order (the seeds' lesson: a rule set that admitted only the client subnet
dropped the host's own health probe and failed a healthy deploy):

1. loopback traffic (the health gate and the probes on 127.0.0.1 or ::1),
2. any source address that is this host's own (`fib saddr type local`),
3. the declared client networks,

and drops everything else on that port. The table lives in a file the endpoint's unit loads
before every start (ExecStartPre), so it survives a reboot and is in place before the port opens;
a deploy applies a changed file at once (no engine restart), and removes file and table when
the endpoint goes back to loopback. A table of our own never touches the host's other rules.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

NFT = "/usr/sbin/nft"
FIREWALL_DIR = "/etc/llm-fleet"
_ENDPOINT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
LOOPBACK_NAMES = {"localhost"}


class PolicyError(ValueError):
    """An inventory whose bind, networks and key do not make a safe endpoint; names the variable."""


@dataclass(frozen=True)
class Firewall:
    endpoint: str
    port: int
    networks: tuple[str, ...]  # normalised CIDRs, IPv4 first
    # Who owns the port and the inventory variable that lists its networks: the generated file
    # names them (an endpoint's by default; the webhook relay's port_firewall gives its own).
    owner: str = "endpoint"
    variable: str = "endpoint_allowed_networks"

    @property
    def table(self) -> str:
        return table_name(self.endpoint)

    def as_dict(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "port": self.port, "networks": list(self.networks)}


def is_loopback(bind: str) -> bool:
    if bind in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


def bind_policy(endpoint: str, bind: str, port: int, networks: list[str], has_key: bool, lan_without_key: bool = False) -> Firewall | None:
    """The firewall a shape's bind needs (None for loopback), or PolicyError naming what to fix."""
    if not _ENDPOINT_RE.match(endpoint):
        raise PolicyError(f"endpoint_name: {endpoint!r} must be letters, digits, '-' or '_' (at most 64), starting with a letter or digit")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise PolicyError(f"endpoint_shape.port: {port!r} is not a TCP port (1-65535)")
    if not isinstance(networks, list):
        raise PolicyError(f"endpoint_allowed_networks: give a list of CIDRs (e.g. [192.168.1.0/24]), not {type(networks).__name__}")
    parsed = []
    for index, entry in enumerate(networks):
        try:
            parsed.append(ipaddress.ip_network(str(entry), strict=False))
        except ValueError:
            raise PolicyError(f"endpoint_allowed_networks[{index}]: {str(entry)[:60]!r} is not an IP network (write 192.168.1.0/24 or 10.0.0.5/32)") from None
    if is_loopback(bind):
        if parsed:
            raise PolicyError(
                f"endpoint_allowed_networks lists client networks, but endpoint_shape.bind is {bind} (loopback): no client off this host can "
                "connect. Bind the LAN (e.g. bind: 0.0.0.0) to serve them, or drop endpoint_allowed_networks."
            )
        return None
    if not parsed:
        raise PolicyError(
            f"endpoint_shape.bind is {bind}, which serves the LAN, but endpoint_allowed_networks is empty: list the client networks "
            "allowed (e.g. [192.168.1.0/24]); the role installs the firewall rules that admit only them. Or bind 127.0.0.1."
        )
    if not has_key and not lan_without_key:
        raise PolicyError(
            f"endpoint_shape.bind is {bind}, which serves the LAN, and the endpoint has no API key: set endpoint_api_key (from Ansible "
            "Vault), or set endpoint_lan_without_key: true to serve the allowed networks without one."
        )
    ordered = sorted({str(net) for net in parsed}, key=lambda n: (ipaddress.ip_network(n).version, n))
    return Firewall(endpoint, port, tuple(ordered))


def firewall_from(endpoint: str, params: dict[str, Any] | None) -> Firewall | None:
    """endpoint_deploy's `firewall` option ({port, networks}, as the role's bind_policy filter
    gives it), validated again on the host."""
    if not params:
        return None
    try:
        return bind_policy(endpoint, "0.0.0.0", params.get("port"), list(params.get("networks") or []), has_key=True)
    except PolicyError as exc:
        raise StepError(f"firewall: {exc}", {"changed": False}) from None


# The hooks the endpoint's table filters (render_nft): input only. A port podman publishes from a
# bridge network is DNAT'ed to the container and crosses the forward hook, never input.
FILTERED_HOOKS = ("input",)


def check_published(firewall: Firewall | None, engine: dict[str, Any] | None) -> None:
    """A LAN-bound endpoint's container may not publish ports from a network of its own unless the
    table filters forward: the allowed networks would not apply to them (StepError names the fix)."""
    if firewall is None or not engine:
        return
    network = str(engine.get("network") or "host")
    published = [str(port) for port in engine.get("publish") or []]
    if network == "host" or not published or "forward" in FILTERED_HOOKS:
        return
    raise StepError(
        f"endpoint_container.publish: {', '.join(published)} on network {network} is DNAT'ed through the forward hook, which "
        f"the firewall table {firewall.table} does not filter (it hooks {', '.join(FILTERED_HOOKS)} only), so "
        f"{firewall.variable} would not apply to it: use network host (the default) and the shape's bind and port, "
        "or bind loopback",
        {"changed": False},
    )


def service_firewall(name: str, port: int, networks: list[str], variable: str) -> Firewall:
    """The same table for a companion service's port (the webhook relay's): its networks are
    always required, and errors name the service's own inventory variable."""
    try:
        firewall = bind_policy(name, "0.0.0.0", port, list(networks or []), has_key=True)
    except PolicyError as exc:
        message = str(exc).replace("endpoint_allowed_networks", variable).replace("endpoint_shape.port", "port").replace("endpoint_name", "name")
        raise PolicyError(message.replace("endpoint_shape.bind is 0.0.0.0, which serves the LAN, but ", "")) from None
    if firewall is None:  # bind_policy gives one to every non-loopback bind
        raise PolicyError(f"{name}: no firewall for port {port}")
    return dataclasses.replace(firewall, owner="service", variable=variable)


def table_name(owner: str) -> str:
    """The nftables table of one endpoint or service: inet llm_fleet_<owner>, '-' as '_'."""
    return "llm_fleet_" + owner.replace("-", "_")


def firewall_path(endpoint: str, directory: str = FIREWALL_DIR) -> str:
    return os.path.join(directory, f"{endpoint}.nft")


def render_nft(firewall: Firewall) -> str:
    """The endpoint's table, replaced atomically by `nft -f` (the empty declaration makes the
    delete safe when the table does not exist yet)."""
    v4 = [n for n in firewall.networks if ipaddress.ip_network(n).version == 4]
    v6 = [n for n in firewall.networks if ipaddress.ip_network(n).version == 6]
    port = f"tcp dport {firewall.port}"
    rules = [f'{port} iifname "lo" accept', f"{port} fib saddr type local accept"]
    if v4:
        rules.append(f"{port} ip saddr {{ {', '.join(v4)} }} accept")
    if v6:
        rules.append(f"{port} ip6 saddr {{ {', '.join(v6)} }} accept")
    rules.append(f"{port} counter drop")
    body = "\n".join(f"\t\t{rule}" for rule in rules)
    return (
        f"# Generated by frank.llm_fleet for {firewall.owner} {firewall.endpoint}: only loopback, this host and the\n"
        f"# allowed networks reach port {firewall.port}. Edit {firewall.variable}, not this file.\n"
        f"table inet {firewall.table}\n"
        f"delete table inet {firewall.table}\n"
        f"table inet {firewall.table} {{\n"
        f"\tchain input {{\n"
        f"\t\ttype filter hook input priority filter - 10; policy accept;\n"
        f"{body}\n"
        f"\t}}\n"
        f"}}\n"
    )


def nft_binary() -> str:
    return shutil.which("nft") or NFT


def ensure_firewall(endpoint: str, firewall: Firewall | None, host: Host, diff: bool, directory: str = FIREWALL_DIR) -> dict[str, Any]:
    """Write and apply the endpoint's table (or remove it); returns the step's result with
    `pre_start`, the argv the unit runs before every start (empty without a firewall)."""
    path = firewall_path(endpoint, directory)
    table = table_name(endpoint)
    before = read_text(path, 1 << 16)
    result: dict[str, Any] = {"changed": False, "path": path, "pre_start": []}
    nft = nft_binary()
    if firewall is None:
        live = os.path.exists(nft) and host.query([nft, "list", "table", "inet", table])[0] == 0
        if before is None and not live:
            return result
        result["changed"] = True
        if live:
            rc, _out, err = host.change([nft, "delete", "table", "inet", table])
            if rc != 0:
                raise StepError(f"firewall: nft could not delete table inet {table}: {err.strip()}", result)
        if before is not None:
            host.remove(path)
        if diff:
            result["diff"] = {"before": before or "", "after": "", "before_header": path, "after_header": path}
        return result

    if not os.path.exists(nft) and not host.check_mode:
        raise StepError(
            f"firewall: {firewall.owner} {endpoint} binds the LAN, which needs nftables on this host ({NFT} is missing): install the nftables package",
            result,
        )
    text = render_nft(firewall)
    result["pre_start"] = [[nft, "-f", path]]
    live = os.path.exists(nft) and host.query([nft, "list", "table", "inet", table])[0] == 0
    if before == text and live:
        return result
    result["changed"] = True
    if before != text:
        host.write(path, text, 0o600)
        if diff:
            result["diff"] = {"before": before or "", "after": text, "before_header": path, "after_header": path}
    rc, _out, err = host.change([nft, "-f", path])
    if rc != 0:
        raise StepError(f"firewall: nft refused {path}: {err.strip()}", result)
    return result
