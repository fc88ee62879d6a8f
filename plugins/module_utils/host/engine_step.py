# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine step (podman_engine's work, also run by endpoint_deploy): image digest gate, the
container's env file, the config-hash key, the cache directory, and the run/stop argv the unit
runs. Everything it runs or writes passes through one Host (host_runner.py), which changes
nothing in check mode.
"""

from __future__ import annotations

import grp
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass, fields
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_python import engine_python_digest, ensure_engine_python, wants_engine_python
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.podman_engine import (
    EngineContainer,
    EngineError,
    check_path,
    digest_verdict,
    render_podman_env_file,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import ENGINE_OPTIONS, with_defaults
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_manager import PODMAN
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError

# The collection's own directory: a container's env file lives there, named NAME.podman.env (a
# unit's own env file is NAME.env, so no engine can name it), and starts with ENV_HEADER. Only a
# file carrying the header is removed: `env_file` naming another file never deletes it.
ENV_DIR = "/etc/llm-fleet"
ENV_SUFFIX = ".podman.env"
ENV_HEADER = "# Written by frank.llm_fleet for the engine container {name}, and removed with it\n"
# Every container setting but the environment, which arrives merged with the secrets.
ENGINE_KEYS = tuple(f.name for f in fields(EngineContainer) if f.name != "environment")
CHOWN = "/usr/bin/chown"


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
        check_env_file(env_file)
        engine.validate()
        env_text = ENV_HEADER.format(name=engine.name) + render_podman_env_file(environment) if environment else None
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
    elif before is not None and is_own_env_file(before):
        # No environment any more: a stale file would keep the old secrets on disk.
        result["env_changed"] = True
        host.remove(env_file)
    result["changed"] = result["changed"] or result["env_changed"] or hash_key.written
    if wants_engine_python(engine.environment):
        result["changed"] = ensure_engine_python(host) or result["changed"]
        engine.engine_python_digest = engine_python_digest()
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
    return params["env_file"] or os.path.join(ENV_DIR, f"{params['name']}{ENV_SUFFIX}")


def check_env_file(env_file: str) -> None:
    """A container's env file: in the collection's directory, named *.podman.env."""
    check_path("env_file", env_file)
    if os.path.dirname(os.path.normpath(env_file)) != os.path.normpath(ENV_DIR) or not env_file.endswith(ENV_SUFFIX):
        raise EngineError(
            f"env_file: {env_file} is outside the collection's own files; give {ENV_DIR}/NAME{ENV_SUFFIX} "
            "(or leave env_file out for the default): a container's env file is written and removed there only"
        )


def is_own_env_file(text: str | None) -> bool:
    """Whether an env file's text was written by this collection (it starts with the header)."""
    return bool(text) and str(text).startswith(ENV_HEADER.split("{name}", 1)[0])


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
        check_env_file(env_file)
    except EngineError as exc:
        raise StepError(str(exc), {"changed": False}) from None
    exists = host.query([PODMAN, "container", "exists", params["name"]])[0] == 0
    present = os.path.lexists(env_file)
    # Only a plain file the collection wrote (its header) is removed; anything else is left, and said.
    has_env = present and os.path.isfile(env_file) and not os.path.islink(env_file) and is_own_env_file(read_text(env_file))
    result: dict[str, Any] = {"changed": exists or has_env, "env_changed": has_env}
    if present and not has_env:
        result["warnings"] = [f"env_file: {env_file} was not written by frank.llm_fleet (no header): left in place"]
    if exists:
        rc, _out, err = host.change([PODMAN, "rm", "--force", "--ignore", "--time", str(params["stop_timeout"]), params["name"]])
        if rc != 0:
            raise StepError(f"podman rm {params['name']} failed: {err.strip()}", result)
    if has_env:
        host.remove(env_file)
    return result
