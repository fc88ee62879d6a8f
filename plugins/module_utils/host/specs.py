# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host modules' option specs, each defined once: podman_engine and systemd_root_unit take
them at the top level, endpoint_deploy as its `engine`, `unit` and `probe` dict options, so
Ansible validates every nested key (a typo fails instead of being dropped) and every default
lives here. Plain dicts: the module_utils code fills the same defaults through `with_defaults`
when it is driven without Ansible. plugins/doc_fragments/host_options.py documents them, and a
unit test keeps the two equal.
"""

from __future__ import annotations

import copy
from typing import Any

ENGINE_OPTIONS: dict[str, dict[str, Any]] = {
    "name": {"type": "str", "required": True},
    "image": {"type": "str", "required": True},
    "digest": {"type": "str", "required": True},
    "command": {"type": "list", "elements": "str", "default": []},
    "entrypoint": {"type": "str"},
    "model_dir": {"type": "path"},
    "model_mount": {"type": "str", "default": "/models"},
    "cache_dir": {"type": "path"},
    "cache_mount": {"type": "str", "default": "/cache"},
    "gpu_vendor": {"type": "str", "choices": ["amd", "nvidia", "none"], "default": "none"},
    "gpu_devices": {"type": "list", "elements": "str", "default": []},
    "network": {"type": "str", "default": "host"},
    "publish": {"type": "list", "elements": "str", "default": []},
    "ipc": {"type": "str", "default": "host"},
    "shm_size": {"type": "str", "default": ""},
    "ulimits": {"type": "list", "elements": "str", "default": []},
    "environment": {"type": "dict", "default": {}},
    "secret_environment": {"type": "dict", "default": {}, "no_log": True},
    "runtime": {"type": "str", "default": ""},
    "cgroups": {"type": "str", "default": ""},
    "stop_timeout": {"type": "int", "default": 30},
    "extra_args": {"type": "list", "elements": "str", "default": []},
    "labels": {"type": "dict", "default": {}},
    # Least privilege (docs/engine_units.md "Container privileges"): each default is the secure
    # one, and each option relaxes exactly one thing.
    "user": {"type": "str", "default": "10001:10001"},
    "cap_add": {"type": "list", "elements": "str", "default": []},
    "read_only": {"type": "bool", "default": True},
    "no_new_privileges": {"type": "bool", "default": True},
    "seccomp_unconfined": {"type": "bool", "default": False},
    "env_file": {"type": "path"},
    "pull": {"type": "str", "choices": ["never", "missing"], "default": "never"},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
}

HEALTH_OPTIONS: dict[str, dict[str, Any]] = {
    "port": {"type": "int", "required": True},
    "host": {"type": "str", "default": "127.0.0.1"},
    "served_id": {"type": "str", "default": ""},
    "container": {"type": "str", "default": ""},
    "timeout": {"type": "int", "default": 300},
    "allowed_restarts": {"type": "int", "default": 0},
    "api_key": {"type": "str", "default": "", "no_log": True},
    "drain_timeout": {"type": "int", "default": 60},
}

UNIT_OPTIONS: dict[str, dict[str, Any]] = {
    "name": {"type": "str", "required": True},
    "command": {"type": "list", "elements": "str"},
    "stop_command": {"type": "list", "elements": "str"},
    "pre_start": {"type": "list", "elements": "list", "default": []},
    "description": {"type": "str", "default": ""},
    "user": {"type": "str", "default": ""},
    "group": {"type": "str", "default": ""},
    "environment": {"type": "dict", "default": {}},
    "secret_environment": {"type": "dict", "default": {}, "no_log": True},
    "working_directory": {"type": "str", "default": ""},
    "restart_sec": {"type": "int", "default": 5},
    "timeout_start_sec": {"type": "int", "default": 900},
    "timeout_stop_sec": {"type": "int", "default": 120},
    "extra_service": {"type": "dict", "default": {}},
    "sandbox": {"type": "bool", "default": False},
    "read_write_paths": {"type": "list", "elements": "str", "default": []},
    "state": {"type": "str", "choices": ["started", "stopped", "absent"], "default": "started"},
    "enabled": {"type": "bool", "default": True},
    "restart": {"type": "bool", "default": False},
    "health": {"type": "dict", "options": HEALTH_OPTIONS},
    "dropins": {"type": "list", "elements": "str", "default": []},
    "unit_dir": {"type": "path", "default": "/etc/systemd/system"},
    "env_dir": {"type": "path", "default": "/etc/llm-fleet"},
}

PROBE_OPTIONS: dict[str, dict[str, Any]] = {
    "host": {"type": "str", "default": "127.0.0.1"},
    "port": {"type": "int", "required": True},
    "served_id": {"type": "str", "required": True},
    "prompt": {"type": "str", "default": "Say hello in five words."},
    "max_tokens": {"type": "int", "default": 8, "no_log": False},  # a count, not a secret (validate-modules guesses by name)
    "tools": {"type": "bool", "default": False},
    "image": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 120},
    "api_key": {"type": "str", "default": "", "no_log": True},
}


def with_defaults(options: dict[str, dict[str, Any]], params: dict[str, Any] | None) -> dict[str, Any]:
    """`params` completed the way Ansible completes them: a missing (or None) option takes its
    default (None when it has none), nested dict options are completed too. Unknown keys are kept
    (Ansible refuses them before this runs; direct callers are tests)."""
    given = dict(params or {})
    for key, spec in options.items():
        if given.get(key) is None:
            given[key] = copy.deepcopy(spec.get("default"))
        elif given.get(key) is not None and "options" in spec:
            given[key] = with_defaults(spec["options"], given[key])
    return given


def default(options: dict[str, dict[str, Any]], key: str) -> Any:
    """An option's default, for the typed models that mirror these options (EngineContainer,
    UnitSpec, HealthSpec): a fresh copy, so a mutable default is never shared."""
    return copy.deepcopy(options[key]["default"])
