# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host-side deploy steps, shared by the podman_engine, systemd_root_unit and endpoint_deploy
modules: ensure an engine container's description and env file, ensure a root unit (render,
install, start, health gate). Each returns the result a module reports; everything it runs or
writes passes through one Host (host_runner.py), which changes nothing in check mode.
"""

from __future__ import annotations

import grp
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.drain import drain, read_in_flight
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.health import http_get, wait_healthy
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.podman_engine import (
    EngineContainer,
    EngineError,
    check_path,
    digest_verdict,
    render_podman_env_file,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import ENGINE_OPTIONS, HEALTH_OPTIONS, PROBE_OPTIONS, UNIT_OPTIONS, with_defaults
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.systemd_unit import (
    UnitError,
    UnitSpec,
    foreign_dropins,
    is_cosmetic_change,
    render_env_file,
    render_unit,
    unit_paths,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import PODMAN, GateError, HealthSpec, UnitManager, boottime
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError, Endpoint, request_json

# Every container setting but the environment, which arrives merged with the secrets.
ENGINE_KEYS = tuple(f.name for f in fields(EngineContainer) if f.name != "environment")
CHOWN = "/usr/bin/chown"


class StepError(RuntimeError):
    """A step refused; `result` holds what the module reports with the failure."""

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


def report(module: Any, step: Callable[[], dict[str, Any]]) -> None:
    """Run a module's step and report it: exit_json with its result, or fail_json with the
    step's message and what it had gathered (journal lines, health details)."""
    try:
        result = step()
    except StepError as exc:
        _warn(module, exc.result)
        module.fail_json(msg=str(exc), **exc.result)
    _warn(module, result)
    module.exit_json(**result)


def _warn(module: Any, result: dict[str, Any]) -> None:
    """A step's warnings through module.warn (exit_json's own `warnings` key is deprecated)."""
    for warning in result.pop("warnings", None) or []:
        module.warn(str(warning))


def ensure_engine(params: dict[str, Any], host: Host, diff: bool) -> dict[str, Any]:
    """podman_engine's work: image digest gate, env file, cache directory, the unit's argv.

    `env_changed` says whether the env file was (or, in check mode, would be) written or
    removed: a secrets-only change shows nowhere else to the caller that must restart the unit."""
    params = with_defaults(ENGINE_OPTIONS, params)
    env_file = _engine_env_file(params)
    result: dict[str, Any] = {"changed": False, "env_changed": False}
    environment = {k: str(v) for k, v in {**params["environment"], **params["secret_environment"]}.items()}
    engine = EngineContainer(**{key: params[key] for key in ENGINE_KEYS if params.get(key) is not None}, environment=environment)
    try:
        check_path("env_file", env_file)
        engine.validate()
        env_text = render_podman_env_file(environment) if environment else None
        if engine.gpu_vendor == "amd":
            engine.gpu_gids = host_group_ids(GPU_GROUPS)
    except EngineError as exc:
        raise StepError(str(exc), result) from None

    inspect = _image_inspect(host, params["image"])
    if inspect is None and params["pull"] == "missing" and not host.check_mode:
        rc, _out, err = host.change([PODMAN, "pull", engine.image_ref])
        if rc != 0:
            raise StepError(f"image {params['image']} is missing and pulling {engine.image_ref} failed: {err.strip()}", result)
        result["changed"] = True
        inspect = _image_inspect(host, engine.image_ref)
    ok, verdict = digest_verdict(inspect, params["image"], params["digest"])
    result["image"] = verdict
    if not ok:
        raise StepError(verdict, {**result, "expected_digest": params["digest"]})

    try:
        hash_key = _config_hash_key(host, os.path.join(os.path.dirname(env_file), CONFIG_HASH_KEY_FILE))
    except EngineError as exc:
        raise StepError(str(exc), result) from None
    before = read_text(env_file)
    if env_text is not None:
        result["env_file"] = env_file
        if before != env_text or _mode(env_file) != 0o600:
            result["env_changed"] = True
            if diff:
                result["diff"] = {"before": f"{env_file}: {'absent' if before is None else 'present'}\n", "after": f"{env_file}: rendered (values hidden)\n"}
            host.write(env_file, env_text, 0o600)
    elif before is not None:
        # No environment any more: a stale file would keep the old secrets on disk.
        result["env_changed"] = True
        host.remove(env_file)
    result["changed"] = result["changed"] or result["env_changed"] or hash_key.written
    if engine.cache_dir:
        try:
            result["changed"] = _own_cache_dir(host, engine.cache_dir, engine.uid_gid()) or result["changed"]
        except EngineError as exc:
            raise StepError(str(exc), result) from None
    result.update(
        run_argv=engine.run_argv(hash_key.key, env_file if env_text is not None else None),
        stop_argv=engine.stop_argv(),
        cleanup_argv=engine.cleanup_argv(),
        config_hash=engine.config_hash(hash_key.key),
    )
    return result


def _engine_env_file(params: dict[str, Any]) -> str:
    return params["env_file"] or f"/etc/llm-fleet/{params['name']}.podman.env"


def _mode(path: str) -> int | None:
    try:
        return stat.S_IMODE(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None


# The key of the config-hash label (HMAC-SHA256): one per host, beside the engines' env files.
CONFIG_HASH_KEY_FILE = "config-hash.key"
# AMD GPUs: /dev/kfd and /dev/dri/renderD* belong to these groups on the host.
GPU_GROUPS = ("video", "render")


@dataclass
class HashKey:
    key: bytes
    written: bool


def _config_hash_key(host: Host, path: str) -> HashKey:
    """The host's config-hash key: created on first use (32 random bytes, mode 0600), then read.
    A key that others can read, or that is not a plain file, is refused rather than trusted."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        key = secrets.token_bytes(32)
        host.write(path, key.hex() + "\n", 0o600)
        return HashKey(key, True)
    if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) & 0o077 or info.st_uid != os.geteuid():
        raise EngineError(f"{path}: the config-hash key must be a plain file owned by this user with mode 0600; remove it to have a new one made")
    text = (read_text(path) or "").strip()
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise EngineError(f"{path}: not a config-hash key (64 hex digits); remove it to have a new one made")
    return HashKey(bytes.fromhex(text), False)


def host_group_ids(names: tuple[str, ...]) -> list[int]:
    """The host's numeric GIDs of `names` (those that exist), for --group-add."""
    gids = []
    for name in names:
        try:
            gids.append(grp.getgrnam(name).gr_gid)
        except KeyError:
            continue
    if not gids:
        raise EngineError(f"gpu_vendor: amd needs one of the host groups {', '.join(names)} (the owners of /dev/kfd and /dev/dri); none exists")
    return gids


def _own_cache_dir(host: Host, path: str, owner: tuple[int, int]) -> bool:
    """The cache directory exists and belongs to the engine's UID:GID (the engine writes there and
    nowhere else). A directory another owner filled (a root engine before) is chowned whole:
    `chown -R` never follows a symlink, and the kernel's protected_hardlinks keeps the engine
    user from linking a file it does not own into the tree. Returns whether it changed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise EngineError(f"cache_dir: {path} is not a directory (a symlink is refused too)")
    if info is not None and (info.st_uid, info.st_gid) == owner:
        return False
    if info is None:
        host.makedirs(path, 0o700)
    rc, _out, err = host.change([CHOWN, "-R", f"{owner[0]}:{owner[1]}", path])
    if rc != 0:
        raise EngineError(f"cache_dir: chown of {path} to {owner[0]}:{owner[1]} failed: {err.strip()}")
    return True


def _image_inspect(host: Host, image: str) -> list[Any] | None:
    rc, out, _err = host.query([PODMAN, "image", "inspect", image])
    if rc != 0:
        return None
    try:
        return json.loads(out)
    except ValueError:
        return None


def remove_engine(params: dict[str, Any], host: Host) -> dict[str, Any]:
    """podman_engine state=absent: only this container (by exact name) and its env file."""
    params = with_defaults(ENGINE_OPTIONS, params)
    env_file = _engine_env_file(params)
    try:
        check_path("env_file", env_file)
    except EngineError as exc:
        raise StepError(str(exc), {"changed": False}) from None
    exists = host.query([PODMAN, "container", "exists", params["name"]])[0] == 0
    has_env = os.path.exists(env_file)
    result = {"changed": exists or has_env, "env_changed": has_env}
    if exists:
        rc, _out, err = host.change([PODMAN, "rm", "--force", "--ignore", "--time", str(params["stop_timeout"]), params["name"]])
        if rc != 0:
            raise StepError(f"podman rm {params['name']} failed: {err.strip()}", result)
    if has_env:
        host.remove(env_file)
    return result


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

    foreign = foreign_dropins(name, params["unit_dir"], list(params["dropins"]))
    if foreign:
        raise StepError(
            f"{name}: drop-ins change this unit behind the deploy: {', '.join(foreign)}; remove them, or list each file name "
            "in dropins (endpoint_unit_dropins) to keep it",
            {**result, "foreign_dropins": foreign, "elapsed": elapsed()},
        )
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
    health_params = params["health"]
    health = _health_spec(health_params) if health_params else None
    if host.check_mode:
        # What would change is known from the content; the start and the health gate need a real start.
        result["changed"] = unit_changed or env_changed or restart
        if (content_changed or restart) and health and health.drain_timeout > 0:
            # Whether the restart would cut requests if it ran now.
            now = read_in_flight(http_get, health.host, health.port, health.api_key)
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
                # Let the streams in flight finish (bounded) before the stop cuts them.
                result["drain"] = drain(http_get, health.host, health.port, health.api_key, health.drain_timeout).as_dict()
            manager.stop_previous(name, health)
            if health:
                manager.port_gate(name, health)
            restarts_before = int(manager.show(name).get("NRestarts", "0") or 0)
            started_at = boottime()
            restart_began = time.monotonic()
            manager.systemctl("start", name)
            result["changed"] = result["restarted"] = True
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
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StepError(f"health: needs a numeric port, timeout and allowed_restarts ({exc})", {}) from None


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


# A 1x1 PNG, for the image probe of shapes with a vision projector.
PROBE_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
PROBE_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Return the current time.", "parameters": {"type": "object", "properties": {}}},
}


def _chat(endpoint: Endpoint, payload: dict[str, Any], what: str, timeout: float) -> dict[str, Any]:
    try:
        answer = request_json(endpoint, "POST", "/v1/chat/completions", payload, timeout)
    except ApiError as exc:
        raise StepError(f"{what}: {exc}", {}) from None
    try:
        answer["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise StepError(f"{what}: the answer is not a chat completion", {}) from None
    return answer


def chat_probe(
    host: str,
    port: int,
    served_id: str,
    prompt: str,
    max_tokens: int,
    tools: bool = False,
    image: bool = False,
    timeout: float = 120.0,
    api_key: str = "",
) -> str:
    """Smoke probes: a chat completion must answer with at least one token; where the shape
    enables them, a required tool call must come back as a tool call, and an image must be read."""
    endpoint = Endpoint(f"http://{host}:{port}", api_key or None)
    base = {"model": served_id, "max_tokens": max_tokens, "temperature": 0}
    answer = _chat(endpoint, {**base, "messages": [{"role": "user", "content": prompt}]}, "smoke probe", timeout)
    if int(answer.get("usage", {}).get("completion_tokens", 0)) <= 0:
        raise StepError("smoke probe: the completion is empty (0 completion tokens)", {})
    content = answer["choices"][0]["message"].get("content") or ""
    if tools:
        payload = {**base, "max_tokens": max(max_tokens, 64), "tools": [PROBE_TOOL], "tool_choice": "required"}
        payload["messages"] = [{"role": "user", "content": "What time is it? Use the get_time tool."}]
        calls = _chat(endpoint, payload, "tool-call probe", timeout)["choices"][0]["message"].get("tool_calls") or []
        names = [call.get("function", {}).get("name") for call in calls]
        if "get_time" not in names:
            raise StepError(f"tool-call probe: a required tool call came back as {names or 'plain text'}; check the tool parser", {})
    if image:
        parts = [{"type": "text", "text": "What colour is this image?"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PROBE_PNG}"}}]
        seen = _chat(endpoint, {**base, "messages": [{"role": "user", "content": parts}]}, "image probe", timeout)
        if int(seen.get("usage", {}).get("completion_tokens", 0)) <= 0:
            raise StepError("image probe: no completion for an image (is the projector loaded?)", {})
    return content


def run_probe(params: dict[str, Any]) -> str:
    """The smoke probes as the `probe` options (host/specs.py PROBE_OPTIONS) describe them."""
    probe = with_defaults(PROBE_OPTIONS, params)
    return chat_probe(
        probe["host"],
        int(probe["port"]),
        probe["served_id"],
        probe["prompt"],
        int(probe["max_tokens"]),
        tools=bool(probe["tools"]),
        image=bool(probe["image"]),
        timeout=float(probe["timeout"]),
        api_key=str(probe["api_key"] or ""),
    )
