# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The unit step (systemd_root_unit's work, also run by endpoint_deploy): render and install a
root unit and its env file, (re)start it behind the drain and the port gate, and hold it to the
health gate; or stop, disable and remove it. Everything it runs or writes passes through one
Host (host_runner.py), which changes nothing in check mode.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.drain import drain, read_in_flight
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_python import ensure_engine_python, wants_engine_python
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.health import http_get, wait_healthy
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import HEALTH_OPTIONS, UNIT_OPTIONS, with_defaults
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.systemd_unit import (
    UnitError,
    UnitSpec,
    is_cosmetic_change,
    render_env_file,
    render_unit,
    unit_overrides,
    unit_paths,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import GateError, HealthSpec, UnitManager, boottime
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError


def ensure_unit(params: dict[str, Any], host: Host, diff: bool) -> dict[str, Any]:
    """systemd_root_unit's work for state started/stopped: render, install, (re)start, health gate."""
    begun = time.monotonic()
    params = with_defaults(UNIT_OPTIONS, params)
    name = params["name"]

    def elapsed() -> float:
        return round(time.monotonic() - begun, 2)

    try:
        unit_path, env_path = unit_paths(name, params["unit_dir"], params["env_dir"])
    except UnitError as exc:
        raise StepError(str(exc), {"changed": False, "elapsed": elapsed()}) from None
    manager = UnitManager(host)
    result: dict[str, Any] = {"changed": False, "unit_path": unit_path}

    secret = params["secret_environment"]
    environment = {k: str(v) for k, v in {**params["environment"], **secret}.items()}
    try:
        env_text = render_env_file(environment) if environment else None
        spec = UnitSpec(
            name=name,
            command=list(params["command"]),
            description=params["description"],
            stop_command=list(params["stop_command"] or []),
            pre_start=[list(argv) for argv in params["pre_start"]],
            privileged_pre_start=[list(argv) for argv in params.get("privileged_pre_start") or []],
            user=params["user"],
            group=params["group"],
            environment_file=env_path if env_text else "",
            working_directory=params["working_directory"],
            restart_sec=int(params["restart_sec"]),
            timeout_start_sec=int(params["timeout_start_sec"]),
            timeout_stop_sec=int(params["timeout_stop_sec"]),
            extra_service={k: str(v) for k, v in params["extra_service"].items()},
            sandbox=bool(params["sandbox"]),
            read_write_paths=list(params["read_write_paths"]),
        )
        unit_text = render_unit(spec)
    except (UnitError, KeyError, TypeError, ValueError) as exc:
        raise StepError(str(exc), {**result, "elapsed": elapsed()}) from None

    refused, reported, shadows = unit_overrides(name, params["unit_dir"], list(params["dropins"]), query=host.query)
    if refused or shadows:
        told = [f"{dropin.path} ({dropin.origin})" for dropin in refused] + [f"{path} (a unit file systemd loads instead of {unit_path})" for path in shadows]
        raise StepError(
            f"{name}: drop-ins change this unit behind the deploy: {'; '.join(told)}; remove them, or list each drop-in's file name "
            "in dropins (endpoint_unit_dropins) to keep it",
            {**result, "foreign_dropins": [dropin.path for dropin in refused], "shadowing_units": shadows, "elapsed": elapsed()},
        )
    if reported:
        # A package's drop-in for every service: not this deploy's to refuse, but named.
        result["dropins_reported"] = [dropin.path for dropin in reported]
        result["warnings"] = [
            f"{name}: {dropin.path} applies to every service ({dropin.origin}); list it in dropins (endpoint_unit_dropins) to silence this"
            for dropin in reported
        ]
    unit_before = read_text(unit_path)
    env_before = read_text(env_path)
    unit_changed = unit_before != unit_text
    # An env file the unit no longer names is removed: it may hold a secret the inventory dropped.
    env_changed = env_before != env_text
    # A documentation-only edit rewrites the file and reloads systemd; the engine keeps serving.
    cosmetic = is_cosmetic_change(unit_before, unit_text) and not env_changed
    content_changed = (unit_changed and not cosmetic) or env_changed
    if cosmetic:
        result["cosmetic"] = True
    if unit_changed and diff:
        result["diff"] = {"before": unit_before or "", "after": unit_text, "before_header": unit_path, "after_header": unit_path}
    if env_text:
        result["env_path"] = env_path
        result["env_changed"] = env_changed  # the values themselves are never returned
    restart = bool(params["restart"])
    if env_changed and env_text is not None:
        host.write(env_path, env_text, 0o600 if secret else 0o640)
    elif env_changed:
        host.remove(env_path)
        result["env_changed"] = True
    if unit_changed:
        host.write(unit_path, unit_text, 0o644)
    # A native engine's own Python (vLLM's key guard): a new guard takes effect only on a restart.
    if wants_engine_python(environment) and ensure_engine_python(host):
        content_changed = True
        result["engine_python_changed"] = True
    health_params = params["health"]
    health = _health_spec(health_params) if health_params else None
    if host.check_mode:
        # What would change is known from the content; the start and the health gate need a real start.
        result["changed"] = unit_changed or env_changed or restart or bool(result.get("engine_python_changed"))
        if (content_changed or restart) and health and health.drain_timeout > 0:
            # Whether the restart would cut requests if it ran now: the listener is judged first, so
            # no key goes to a port a foreign process holds.
            try:
                listening = UnitManager(host).port_owned(name, health)
            except GateError as exc:
                raise StepError(str(exc), {**result, **exc.details, "elapsed": elapsed()}) from None
            now = read_in_flight(http_get, health.host, health.port, _drain_keys(health)) if listening else 0
            result["drain"] = {"outcome": "unknown" if now is None else ("would_cut" if now else "idle"), "in_flight_now": now}
        result["elapsed"] = elapsed()
        return result

    try:
        if unit_changed or env_changed:
            manager.daemon_reload()
            result["changed"] = True
        props = manager.show(name)
        enabled = params["enabled"]
        if enabled and props.get("UnitFileState") != "enabled":
            manager.systemctl("enable", name)
            result["changed"] = True
        elif not enabled and props.get("UnitFileState") == "enabled":
            manager.systemctl("disable", name)
            result["changed"] = True

        if params["state"] == "stopped":
            if props.get("ActiveState") not in ("inactive", "failed"):
                manager.systemctl("stop", name)
                result["changed"] = True
            result["elapsed"] = elapsed()
            return result

        started_at = None
        if content_changed or restart or props.get("ActiveState") != "active":
            if health and health.drain_timeout > 0 and props.get("ActiveState") == "active":
                # Let the streams in flight finish (bounded) before the stop cuts them. Who listens
                # is judged before any key is sent; nothing listening holds no stream.
                if manager.port_owned(name, health):
                    report = drain(http_get, health.host, health.port, _drain_keys(health), health.drain_timeout, force=health.drain_force)
                    result["drain"] = report.as_dict()
                else:
                    result["drain"] = {"outcome": "idle", "in_flight_at_start": 0, "cut": 0, "waited_s": 0.0, "listener": "none"}
            manager.stop_previous(name, health)
            if health:
                manager.port_gate(name, health)
            restarts_before = int(manager.show(name).get("NRestarts", "0") or 0)
            started_at = boottime()
            restart_began = time.monotonic()
            manager.systemctl("start", name)
            result["changed"] = result["restarted"] = True
            if not (content_changed or restart):
                # Only the unit's state was off (stopped, failed, never started): the shape is the same.
                result["started_from"] = props.get("ActiveState") or "inactive"
        else:
            restarts_before = int(props.get("NRestarts", "0") or 0)  # unchanged and running
        if health:
            result["health"] = wait_healthy(manager, name, health, started_at or 0.0, restarts_before).as_dict()
        if started_at is not None:
            result["start_to_healthy_s"] = round(time.monotonic() - restart_began, 2)
        final = manager.show(name)
        result.update(main_pid=int(final.get("MainPID", 0) or 0), n_restarts=int(final.get("NRestarts", 0) or 0), active_state=final.get("ActiveState", ""))
    except GateError as exc:
        # A refused systemctl call says little by itself; the unit's journal says why.
        journal = exc.details.get("journal") or manager.journal(name)
        raise StepError(str(exc), {**result, **exc.details, "journal": journal, "elapsed": elapsed()}) from None
    result["elapsed"] = elapsed()
    return result


def _health_spec(params: dict[str, Any]) -> HealthSpec:
    """Health options as given by a module or a role (templated values may arrive as strings)."""
    given = with_defaults(HEALTH_OPTIONS, params)
    try:
        return HealthSpec(
            port=int(given["port"]),
            host=str(given["host"]),
            served_id=str(given["served_id"]),
            container=str(given["container"]),
            timeout=float(given["timeout"]),
            allowed_restarts=int(given["allowed_restarts"]),
            api_key=str(given["api_key"] or ""),
            drain_timeout=float(given["drain_timeout"]),
            drain_api_key=str(given["drain_api_key"] or ""),
            drain_force=as_flag(given["drain_force"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StepError(f"health: needs a numeric port, timeout and allowed_restarts ({exc})", {}) from None


def as_flag(value: Any) -> bool:
    """A templated boolean may arrive as a string (systemd's and YAML's spellings of yes)."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def _drain_keys(health: HealthSpec) -> tuple[str, ...]:
    """The key the running engine holds first (the previous one during a rotation), then the new one."""
    return tuple(key for key in (health.drain_api_key, health.api_key) if key) or ("",)


def remove_unit(params: dict[str, Any], host: Host) -> dict[str, Any]:
    """systemd_root_unit state=absent: stop, disable and remove the unit and its env file."""
    params = with_defaults(UNIT_OPTIONS, params)
    name = params["name"]
    try:
        unit_path, env_path = unit_paths(name, params["unit_dir"], params["env_dir"])
    except UnitError as exc:
        raise StepError(str(exc), {"changed": False}) from None
    manager = UnitManager(host)
    result: dict[str, Any] = {"changed": False, "unit_path": unit_path}
    before = read_text(unit_path)
    if before is None and read_text(env_path) is None:
        return result
    result["changed"] = True
    result["diff"] = {"before": before or "", "after": "", "before_header": unit_path}
    try:
        props = manager.show(name)
        if props.get("ActiveState") not in ("inactive", "failed", None):
            manager.systemctl("stop", name)
        if props.get("UnitFileState") == "enabled":
            manager.systemctl("disable", name)
        for path in (unit_path, env_path):
            if os.path.exists(path):
                host.remove(path)
        manager.daemon_reload()
    except GateError as exc:
        raise StepError(str(exc), {**result, **exc.details}) from None
    return result
