# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host modules' options, each declared once with its help: podman_engine and
systemd_root_unit take them at the top level, endpoint_probe takes PROBE_OPTIONS, endpoint_deploy
takes DEPLOY_OPTIONS (the engine, unit and probe lists as its dict options), so Ansible validates
every nested key (a typo fails instead of being dropped) and every default lives here.

Each option is an argument spec entry plus its `description`: `argument_spec()` gives the
options as AnsibleModule takes them (without the help), and scripts/gen_host_docs.py writes
plugins/doc_fragments/host_options.py (description, type, elements, choices, required, default,
suboptions) from the same tables; a unit test fails when that file drifts. Plain dicts: the
module_utils code fills the same defaults through `with_defaults` when it is driven without
Ansible.
"""

from __future__ import annotations

import copy
from typing import Any

# What an option declares for its documentation only (plugins/doc_fragments/host_options.py).
HELP_KEYS = ("description",)

ENGINE_OPTIONS: dict[str, dict[str, Any]] = {
    "name": {"type": "str", "required": True, "description": "Container name (also the name cleared before each run)."},
    "image": {"type": "str", "required": True, "description": "Image repository and tag, without a digest."},
    "digest": {"type": "str", "required": True, "description": "The pinned digest, C(sha256:...). The container runs C(IMAGE@DIGEST)."},
    "command": {"type": "list", "elements": "str", "default": [], "description": "Arguments after the image (the engine's own argv)."},
    "entrypoint": {"type": "str", "description": "Override the image's entrypoint."},
    "model_dir": {"type": "path", "description": "Host directory with the payload, mounted read-only at C(model_mount)."},
    "model_mount": {"type": "str", "default": "/models", "description": "Where the payload appears in the container."},
    "cache_dir": {"type": "path", "description": "Persistent host directory for the engine's caches, mounted at C(cache_mount); HOME points there."},
    "cache_mount": {"type": "str", "default": "/cache", "description": "Where the cache directory appears in the container."},
    "gpu_vendor": {
        "type": "str",
        "choices": ["amd", "nvidia", "none"],
        "default": "none",
        "description": "V(amd) passes /dev/kfd and /dev/dri with the host's numeric video and render GIDs; V(nvidia) passes CDI devices.",
    },
    "gpu_devices": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": "NVIDIA CDI device names (default C(nvidia.com/gpu=all)) or extra device paths.",
    },
    "network": {"type": "str", "default": "host", "description": "Podman network mode."},
    "publish": {"type": "list", "elements": "str", "default": [], "description": "Ports to publish when not on the host network."},
    "ipc": {"type": "str", "default": "host", "description": "IPC mode (engines with tensor parallelism want C(host))."},
    "shm_size": {"type": "str", "default": "", "description": "Size of /dev/shm; only with an IPC namespace of the container's own (C(ipc) not C(host))."},
    "ulimits": {"type": "list", "elements": "str", "default": [], "description": "C(--ulimit) values, such as C(nofile=65536:65536)."},
    "environment": {
        "type": "dict",
        "default": {},
        "description": [
            "Environment for the engine, passed through a root-only env file.",
            "A value podman versions would read differently (empty, C(#), a leading quote, control characters) is refused, naming its key.",
        ],
    },
    "secret_environment": {"type": "dict", "default": {}, "no_log": True, "description": "Secret environment; never logged."},
    "runtime": {"type": "str", "default": "", "description": "OCI runtime (C(crun), C(runc)); empty for podman's default."},
    "cgroups": {"type": "str", "default": "", "description": "Podman C(--cgroups) mode (for example V(disabled) for nested hosts); empty for the default."},
    "stop_timeout": {"type": "int", "default": 30, "description": "Seconds C(podman stop) waits before killing."},
    "extra_args": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": [
            "Further C(podman run) arguments, placed before the image.",
            (
                "An allowlist (C(podman_engine.py) ALLOWED_EXTRA_FLAGS), each as C(--flag=VALUE) or C(--flag VALUE),"
                " C(--log-level), C(--log-driver), C(--log-opt), C(--tz), C(--init), C(--memory), C(--memory-reservation),"
                " C(--memory-swap), C(--memory-swappiness), C(--cpus), C(--cpuset-cpus), C(--cpuset-mems), C(--cpu-shares),"
                " C(--pids-limit), C(--stop-signal), C(--workdir) and C(--hostname). Anything else (a mount, a device,"
                " an annotation, a namespace, a privilege, a bare value) is refused, naming the option to use instead."
            ),
        ],
    },
    "labels": {"type": "dict", "default": {}, "description": "Extra labels."},
    # Least privilege (docs/engine_units.md "Container privileges"): each default is the secure
    # one, and each option relaxes exactly one thing.
    "user": {
        "type": "str",
        "default": "",
        "description": [
            (
                "The numeric C(UID:GID) the engine runs as inside the container (not root); the host's C(cache_dir) "
                "is created or chowned to it. V(0:0) runs the engine as root again."
            ),
            (
                "Empty (the default) gives each engine a UID:GID of its own, derived from the container name"
                " (C(podman_engine.py) C(engine_uid), in 30000-49999), so a compromised engine cannot read another's"
                " C(/proc/PID/environ) or caches."
            ),
        ],
    },
    "cap_add": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": "Capabilities the engine gets back (such as C(SYS_NICE)); every other capability is dropped (C(--cap-drop=all)).",
    },
    "read_only": {
        "type": "bool",
        "default": True,
        "description": ("A read-only root filesystem; the cache mount and a tmpfs C(/tmp) are the only writable places. V(false) makes the root writable."),
    },
    "no_new_privileges": {
        "type": "bool",
        "default": True,
        "description": "C(--security-opt=no-new-privileges), so no setuid binary or file capability raises the engine's privileges.",
    },
    "seccomp_unconfined": {
        "type": "bool",
        "default": False,
        "description": [
            (
                "Run without podman's seccomp profile (C(seccomp=unconfined)). Only where a ROCm stack on a given "
                "kernel fails inside the profile, which refuses move_pages, migrate_pages and perf_event_open (ROCm's"
                " own container instructions run unconfined). The default keeps the profile."
            ),
        ],
    },
    "env_file": {"type": "path", "description": "Path of the container's env file (absolute); the host's config-hash key is kept in the same directory."},
    "pull": {
        "type": "str",
        "choices": ["never", "missing"],
        "default": "never",
        "description": "V(never) fails when the image is missing; V(missing) pulls C(IMAGE@DIGEST) then.",
    },
    "state": {
        "type": "str",
        "choices": ["present", "absent"],
        "default": "present",
        "description": "V(present) gates the image and returns the argv; V(absent) removes this container.",
    },
}

HEALTH_OPTIONS: dict[str, dict[str, Any]] = {
    "port": {"type": "int", "required": True, "description": "The engine's port."},
    "host": {"type": "str", "default": "127.0.0.1", "description": "Address to probe."},
    "served_id": {"type": "str", "default": "", "description": "A model id C(/v1/models) must list."},
    "container": {"type": "str", "default": "", "description": "Name of the engine container the unit runs, for the ownership check."},
    "timeout": {"type": "int", "default": 300, "description": "Seconds to wait for green."},
    "allowed_restarts": {"type": "int", "default": 0, "description": "Restarts tolerated during the wait before it counts as a crash loop."},
    "api_key": {
        "type": "str",
        "default": "",
        "no_log": True,
        "description": [
            (
                "The endpoint's API key, sent as a bearer token with the health requests (the engine gets it from its"
                " environment). Never logged; a 401 or 403 fails the gate at once."
            ),
        ],
    },
    "drain_timeout": {
        "type": "int",
        "default": 60,
        "description": [
            (
                "Before a restart of a running unit, seconds to wait for the engine's in-flight requests (read from "
                "its /metrics) to finish; 0 restarts at once. The result's C(drain) says what happened."
            ),
            (
                "The listener on the port is judged first (a foreign one fails, and no key is sent to it); when nothing"
                " listens there is nothing to drain. Work that cannot be read counts as busy, so the restart waits the whole"
                " timeout (C(drain.outcome) V(unknown)) unless C(health.drain_force)."
            ),
        ],
    },
    "drain_api_key": {
        "type": "str",
        "default": "",
        "no_log": True,
        "description": [
            (
                "The key the running engine holds, for the drain's read of /metrics (during a rotation the previous key,"
                " which C(endpoint_deploy) passes from the kept last-good secrets); C(health.api_key) is tried after it."
                " Never logged."
            ),
        ],
    },
    "drain_force": {
        "type": "bool",
        "default": False,
        "description": [
            (
                "Restart at once when the drain cannot read the in-flight requests (no metrics, every key refused)."
                " Without it such a restart first waits C(health.drain_timeout) in full."
            ),
        ],
    },
}

UNIT_OPTIONS: dict[str, dict[str, Any]] = {
    "name": {
        "type": "str",
        "required": True,
        "description": "A unit name by systemd's rules, ending in C(.service); never a path (C(/) and C(..) are refused).",
    },
    "command": {"type": "list", "elements": "str", "description": "The ExecStart command as an argv list; the first element is an absolute path."},
    "stop_command": {"type": "list", "elements": "str", "description": "The ExecStop command as an argv list (for example C(podman stop -t 30 NAME))."},
    "pre_start": {"type": "list", "elements": "list", "default": [], "description": "ExecStartPre commands, each an argv list."},
    "description": {"type": "str", "default": "", "description": "The unit's Description."},
    "user": {"type": "str", "default": "", "description": "User= for the service (a non-root service user for native engines; podman engines run as root)."},
    "group": {"type": "str", "default": "", "description": "Group= for the service."},
    "environment": {"type": "dict", "default": {}, "description": "Environment for the engine, written to an EnvironmentFile. Newlines are refused."},
    "secret_environment": {
        "type": "dict",
        "default": {},
        "no_log": True,
        "description": "Environment holding secrets; never logged, and the EnvironmentFile becomes mode 0600.",
    },
    "working_directory": {"type": "str", "default": "", "description": "WorkingDirectory= of the service."},
    "restart_sec": {"type": "int", "default": 5, "description": "RestartSec= in seconds."},
    "timeout_start_sec": {"type": "int", "default": 900, "description": "TimeoutStartSec= in seconds; model loads take minutes."},
    "timeout_stop_sec": {"type": "int", "default": 120, "description": "TimeoutStopSec= in seconds."},
    "extra_service": {
        "type": "dict",
        "default": {},
        "description": [
            "Further C([Service]) directives, as a mapping; keys are directive names.",
            ("A directive named here replaces the C(sandbox) lines for that directive (all of them, so C(DeviceAllow) here replaces the GPU device list)."),
        ],
    },
    "sandbox": {
        "type": "bool",
        "default": False,
        "description": [
            (
                "Sandbox a native engine - C(NoNewPrivileges), C(ProtectSystem=strict), C(ProtectHome=read-only), "
                "C(PrivateTmp), the kernel, clock and hostname protections, C(RestrictNamespaces), "
                "C(RestrictSUIDSGID), a C(@system-service) system-call filter, no capabilities, and "
                "C(DevicePolicy=closed) with the GPU device groups (drm, kfd, nvidia*) allowed."
            ),
            "No C(PrivateDevices) and no C(MemoryDenyWriteExecute) - GPU runtimes need the devices and JIT.",
            "Not for units that run C(podman run), which writes C(/var/lib/containers) and C(/run).",
        ],
    },
    "read_write_paths": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": ("Paths the engine may write under C(sandbox) (C(ReadWritePaths=), a missing path is skipped), for example its cache directory."),
    },
    "state": {
        "type": "str",
        "choices": ["started", "stopped", "absent"],
        "default": "started",
        "description": "V(started) installs, enables and starts; V(stopped) installs and stops; V(absent) stops and removes.",
    },
    "enabled": {"type": "bool", "default": True, "description": "Enable the unit at boot."},
    "restart": {"type": "bool", "default": False, "description": "Restart even when nothing changed."},
    "health": {
        "type": "dict",
        "options": HEALTH_OPTIONS,
        "description": [
            "The health gate, run after every (re)start and checked (without restarting) on an unchanged unit.",
            "Omit to skip the gate.",
        ],
    },
    "dropins": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": [
            (
                "Drop-in files (C(NAME.service.d/*.conf), by file name or path) the unit may have. Any other drop-in "
                "under the unit directory or systemd's search path fails the step, naming it."
            ),
        ],
    },
    "unit_dir": {"type": "path", "default": "/etc/systemd/system", "description": "Directory for the unit file."},
    "env_dir": {"type": "path", "default": "/etc/llm-fleet", "description": "Directory for the EnvironmentFile."},
}

PROBE_OPTIONS: dict[str, dict[str, Any]] = {
    "host": {"type": "str", "default": "127.0.0.1", "description": "Address the probe sends to."},
    "port": {"type": "int", "required": True, "description": "The engine's port."},
    "served_id": {"type": "str", "required": True, "description": "The model id the probe asks for."},
    "prompt": {"type": "str", "default": "Say hello in five words.", "description": "The chat prompt; the answer must hold at least one completion token."},
    "max_tokens": {  # a count, not a secret (validate-modules guesses by name)
        "type": "int",
        "default": 8,
        "no_log": False,
        "description": "max_tokens of the probe's request.",
    },
    "tools": {"type": "bool", "default": False, "description": "Also require a tool call (C(tool_choice=required)) to come back as a tool call."},
    "image": {"type": "bool", "default": False, "description": "Also send an image, which must be answered (the projector is loaded)."},
    "timeout": {"type": "int", "default": 120, "description": "Seconds each probe request may take."},
    "api_key": {"type": "str", "default": "", "no_log": True, "description": "The endpoint's API key, sent as a bearer token. Never logged."},
    "runtime": {
        "type": "str",
        "default": "",
        "description": "The shape's runtime: its driver names the field an answer's reasoning arrives in (empty - every runtime's field is read).",
    },
}

DEPLOY_OPTIONS: dict[str, dict[str, Any]] = {
    "engine": {
        "type": "dict",
        "options": ENGINE_OPTIONS,
        "description": "The engine container, as M(frank.llm_fleet.podman_engine)'s options. Omit for a native engine.",
    },
    "unit": {
        "type": "dict",
        "required": True,
        "options": UNIT_OPTIONS,
        "description": [
            "The unit, as M(frank.llm_fleet.systemd_root_unit)'s options (with C(health)).",
            "With O(engine), C(command) and C(stop_command) come from the container.",
        ],
    },
    "probe": {
        "type": "dict",
        "options": PROBE_OPTIONS,
        "description": [
            (
                "The smoke probe - a chat completion must answer with at least one token; with C(tools) a required "
                "tool call must come back as a tool call, with C(image) an image must be read."
            ),
            "Omit to skip the probe.",
        ],
    },
}


def argument_spec(options: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The options as AnsibleModule's argument_spec: each option without its help, nested options
    too (validate-modules accepts argument spec keys only; the help is the doc fragment's)."""
    return {
        name: {key: argument_spec(value) if key == "options" else value for key, value in spec.items() if key not in HELP_KEYS}
        for name, spec in options.items()
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
