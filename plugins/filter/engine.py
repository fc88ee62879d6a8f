# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the core: the parsed shape, its engine argv, the client window, a parsed boot ledger."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.client_contract import client_window
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import reconcile_devices
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.firewall import PolicyError, bind_policy
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import ManifestError, parse_manifest
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import (
    ArgvError,
    engine_argv,
    engine_environment,
    parse_boot_log,
    parse_shape,
    payload_identity,
    prices_on_controller,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.user_errors import shape_problem_text


def _shape(raw: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    try:
        return parse_shape(raw, name).as_dict()
    except ShapeError as exc:
        raise AnsibleFilterError(shape_problem_text(exc, raw)) from None


def _engine_argv(shape: dict[str, Any], entry: list[str] | None = None, model_root: str = "", name: str | None = None, container: bool = False) -> list[str]:
    try:
        return engine_argv(shape, model_root, entry, name, container=bool(container))
    except ArgvError as exc:
        raise AnsibleFilterError(f"engine_argv: {exc}") from None


def _engine_environment(shape: dict[str, Any], model_root: str = "", name: str | None = None) -> dict[str, str]:
    try:
        return engine_environment(shape, model_root, name)
    except ArgvError as exc:
        raise AnsibleFilterError(f"engine_environment: {exc}") from None


def _client_window(ceiling: int, gap: int | None = None) -> dict[str, Any]:
    try:
        return client_window(int(ceiling), gap).as_dict()
    except ValueError as exc:
        raise AnsibleFilterError(f"client_window: {exc}") from None


def _bind_policy(
    shape: dict[str, Any], name: str, networks: list[str] | None = None, has_key: bool = False, lan_without_key: bool = False
) -> dict[str, Any] | None:
    try:
        typed = parse_shape(shape, name)
        firewall = bind_policy(name, typed.bind, typed.port, list(networks or []), bool(has_key), bool(lan_without_key))
    except (ShapeError, PolicyError) as exc:
        raise AnsibleFilterError(f"{name}: {exc}") from None
    return None if firewall is None else {"port": firewall.port, "networks": list(firewall.networks)}


def _boot_ledger(text: str) -> dict[str, Any]:
    return parse_boot_log(text).as_dict()


def _endpoint_devices(typed: Any, discovered: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The devices the budget prices on: typed, discovered (`discover`), or typed and checked
    against what the host reported."""
    if not discovered:
        if typed == "discover":
            raise AnsibleFilterError("endpoint_devices: discover needs the host's GPU facts, and gpu_facts reported none; type the devices instead")
        return typed
    try:
        return reconcile_devices(typed, discovered)
    except ShapeError as exc:
        raise AnsibleFilterError(str(exc)) from None


def _prices_on_controller(shape: Any) -> bool:
    return prices_on_controller(shape)


def _payload_pinned(shape: Any, manifest: Any) -> bool:
    """Whether every payload path the shape names is in the pinned manifest (a mapping). Without a
    manifest, or with a shape or manifest that does not parse, true: the gates that read them name
    what is wrong (the budget's identity check, the shape gate)."""
    if not isinstance(manifest, dict):
        return True
    try:
        return not payload_identity(shape, parse_manifest(manifest)).mismatches
    except (ShapeError, ManifestError, ValueError):
        return True


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "shape": _shape,
            "engine_argv": _engine_argv,
            "engine_environment": _engine_environment,
            "prices_on_controller": _prices_on_controller,
            "payload_pinned": _payload_pinned,
            "endpoint_devices": _endpoint_devices,
            "client_window": _client_window,
            "boot_ledger": _boot_ledger,
            "bind_policy": _bind_policy,
        }
