# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Retiring units: what the fleet did with an old runtime's units, "retired into the trash rather
than deleted" (the seeds), so a cutover can be undone.

A retired unit is stopped, disabled, its file (and its NAME.d drop-ins) moved to a dated archive
directory, and masked, so nothing starts it again by accident. A retired endpoint's firewall goes
with it: its nftables table `inet llm_fleet_ENDPOINT` is deleted (its drop rule would go on
dropping, on a port the endpoint no longer serves, the clients a new endpoint there admits) and its
rules file `/etc/llm-fleet/ENDPOINT.nft` moves to the same archive. Restoring it is:

    systemctl unmask NAME && mv ARCHIVE/NAME ARCHIVE/NAME.d /etc/systemd/system/ \\
      && mv ARCHIVE/ENDPOINT.nft /etc/llm-fleet/ \\
      && systemctl daemon-reload && systemctl enable --now NAME

(the unit loads the table again before its start).

A runtime or launch swap of an endpoint (llama.cpp native -> vLLM in podman, say) keeps the unit's
name but not what it runs: a copy of the old unit file goes to the same archive before the new one
replaces it.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host import firewall
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.records import kept_records
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import GateError, UnitManager
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

_RETIRE_NAME_RE = re.compile(r"^[A-Za-z0-9:_.@-]+\.service$")
# The first line of every unit file systemd_unit.render_unit writes: how discovery knows a unit
# is the collection's own.
UNIT_HEADER = "# Managed by frank.llm_fleet.systemd_root_unit"


def archive_dir(state_dir: str, when: float | None = None) -> str:
    """STATE_DIR/archive/YYYYmmdd-HHMMSS: one directory per deploy that retired something."""
    return os.path.join(state_dir, "archive", time.strftime("%Y%m%d-%H%M%S", time.gmtime(when)))


def retire_unit(name: str, host: Host, unit_dir: str, archive: str, firewall_dir: str | None = None) -> dict[str, Any]:
    """Stop, disable, archive and mask one unit, and retire its endpoint's firewall; nothing when
    it is gone, or masked with no firewall left (a unit retired before firewalls were, keeps none)."""
    if not _RETIRE_NAME_RE.match(name) or ".." in name:
        raise StepError(f"retire_units: {name!r} is not a service unit name (NAME.service, no '/')", {"changed": False})
    path = os.path.join(unit_dir, name)
    result: dict[str, Any] = {"unit": name, "changed": False}
    endpoint = name.rsplit(".", 1)[0]
    if os.path.islink(path) and os.readlink(path) == "/dev/null":
        result["state"] = "masked"
        return _with_firewall(result, retire_firewall(endpoint, host, archive, firewall_dir))
    if not os.path.isfile(path):
        result["state"] = "absent"
        return _with_firewall(result, retire_firewall(endpoint, host, archive, firewall_dir))
    manager = UnitManager(host)
    try:
        manager.systemctl("stop", name)
        manager.systemctl("disable", name)
        host.makedirs(archive, mode=0o700)
        host.move(path, os.path.join(archive, name))
        if os.path.isdir(path + ".d"):
            host.move(path + ".d", os.path.join(archive, name + ".d"))
        manager.daemon_reload()
        manager.systemctl("mask", name)
    except GateError as exc:
        raise StepError(f"retiring {name}: {exc}", {**result, "changed": True}) from None
    result.update(changed=True, state="retired", archived_to=os.path.join(archive, name))
    return _with_firewall(result, retire_firewall(endpoint, host, archive, firewall_dir))


def _with_firewall(result: dict[str, Any], retired: dict[str, Any] | None) -> dict[str, Any]:
    if retired:
        result.update(changed=True, firewall=retired)
    return result


def retire_firewall(endpoint: str, host: Host, archive: str, directory: str | None = None) -> dict[str, Any] | None:
    """A retired endpoint's nftables table deleted and its rules file (one the collection wrote,
    by its header) moved into the archive beside the unit; None when it had neither. Only the
    table of that name (`inet llm_fleet_ENDPOINT`, the collection's own) is touched."""
    path = firewall.firewall_path(endpoint, directory or firewall.FIREWALL_DIR)
    table = firewall.table_name(endpoint)
    nft = firewall.nft_binary()
    live = os.path.exists(nft) and host.query([nft, "list", "table", "inet", table])[0] == 0
    text = read_text(path, 1 << 16)
    own_file = text is not None and text.startswith(firewall.GENERATED_HEADER)
    if not live and not own_file:
        return None
    retired: dict[str, Any] = {"table": f"inet {table}", "table_deleted": live}
    if live:
        rc, _out, err = host.change([nft, "delete", "table", "inet", table])
        if rc != 0:
            raise StepError(f"retiring {endpoint}'s firewall: nft could not delete table inet {table}: {err.strip()}", {"changed": True})
    if own_file:
        host.makedirs(archive, mode=0o700)
        retired["file_archived_to"] = os.path.join(archive, os.path.basename(path))
        host.move(path, retired["file_archived_to"])
    return retired


def runtime_swap(previous: dict[str, Any] | None, shape: dict[str, Any]) -> str:
    """'llamacpp/native -> vllm/podman' when the endpoint changes runtime or launch; '' otherwise."""
    if not previous:
        return ""
    before = previous.get("shape") or {}
    old = f"{before.get('runtime', '?')}/{before.get('launch', '?')}"
    new = f"{shape.get('runtime', '?')}/{shape.get('launch', '?')}"
    return f"{old} -> {new}" if before and old != new else ""


def archive_copy(host: Host, unit_path: str, archive: str) -> str:
    """A copy of the unit file a swap is about to replace; its path ('' when there is none)."""
    text = read_text(unit_path, 1 << 20)
    if text is None:
        return ""
    target = os.path.join(archive, os.path.basename(unit_path))
    host.write(target, text, 0o644, dir_mode=0o700)
    return target


# --- an endpoint the inventory renamed: its old unit, found from the kept records -----------------


@dataclass(frozen=True)
class Found:
    unit: str
    record: str  # the kept record that names it
    port: int | None

    def as_dict(self, why: str) -> dict[str, Any]:
        return {"unit": self.unit, "record": self.record, "port": self.port, "why": why}


def _record_port(record: dict[str, Any]) -> int | None:
    shape = record.get("shape") if isinstance(record.get("shape"), dict) else {}
    health = record["unit"].get("health") if isinstance(record["unit"].get("health"), dict) else {}
    for value in (shape.get("port"), health.get("port")):
        try:
            return int(value)
        except (TypeError, ValueError):
            continue
    return None


def collection_units(state_dir: str, own_record_dir: str, unit_dir: str) -> list[Found]:
    """Units this collection wrote and still has installed, other than the deploying endpoint's:
    each named by a kept record under the state directory, its file in unit_dir (not masked) and
    starting with the collection's header. Nothing else is ever a candidate for retirement."""
    found = []
    for path, record in kept_records(state_dir, own_record_dir):
        name = str(record["unit"].get("name") or "")
        if not _RETIRE_NAME_RE.match(name) or ".." in name:
            continue
        if os.path.normpath(str(record["unit"].get("unit_dir") or unit_dir)) != os.path.normpath(unit_dir):
            continue
        unit_path = os.path.join(unit_dir, name)
        if os.path.islink(unit_path) or not os.path.isfile(unit_path):
            continue
        if not (read_text(unit_path, 1 << 20) or "").startswith(UNIT_HEADER):
            continue
        found.append(Found(name, path, _record_port(record)))
    return found


def renamed_units(
    state_dir: str, own_record_dir: str, own_unit: str, port: int | None, unit_dir: str, host_units: list[str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(to retire, to report): the units the collection wrote for endpoints this host's inventory
    no longer names.

    To retire: a collection unit whose kept record serves this endpoint's port. One port on one
    host serves one endpoint (the preflight refuses two), so it is the old name of a renamed
    endpoint; left running it would hold the port (the port gate would refuse the new unit) and
    race the new one for it at every boot. To report: with `host_units` (every endpoint unit the
    inventory places on this host), a collection unit on another port that none of them names."""
    retire, report = [], []
    named = set(host_units or [])
    for unit in collection_units(state_dir, own_record_dir, unit_dir):
        if unit.unit == own_unit or unit.unit in named:
            continue
        if port is not None and unit.port == port:
            retire.append(unit.as_dict(f"its kept record {unit.record} serves port {port}, this endpoint's: an old name of it"))
        elif host_units is not None:
            report.append(unit.as_dict(f"its kept record {unit.record} names it, and no endpoint of the inventory on this host does"))
    return retire, report
