# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the option specs in plugins/module_utils/host/specs.py: podman_engine and
systemd_root_unit take ENGINE and UNIT at the top level, endpoint_probe takes PROBE, and
endpoint_deploy takes all three as the suboptions of its engine, unit and probe options (DEPLOY).

ansible-test reads doc fragments as string literals only, so DEPLOY repeats the three option
lists as suboptions; tests/unit/test_host_specs.py keeps each documented form equal to its spec
and DEPLOY's suboptions equal to ENGINE, UNIT and PROBE, word for word.
"""

from __future__ import annotations


class ModuleDocFragment:
    ENGINE = r"""
options:
  name:
    description: Container name (also the name cleared before each run).
    type: str
    required: true
  image:
    description: Image repository and tag, without a digest.
    type: str
    required: true
  digest:
    description: The pinned digest, C(sha256:...). The container runs C(IMAGE@DIGEST).
    type: str
    required: true
  command:
    description: Arguments after the image (the engine's own argv).
    type: list
    elements: str
    default: []
  entrypoint:
    description: Override the image's entrypoint.
    type: str
  model_dir:
    description: Host directory with the payload, mounted read-only at C(model_mount).
    type: path
  model_mount:
    description: Where the payload appears in the container.
    type: str
    default: /models
  cache_dir:
    description: Persistent host directory for the engine's caches, mounted at C(cache_mount); HOME points there.
    type: path
  cache_mount:
    description: Where the cache directory appears in the container.
    type: str
    default: /cache
  gpu_vendor:
    description: V(amd) passes /dev/kfd and /dev/dri with the host's numeric video and render GIDs; V(nvidia) passes CDI devices.
    type: str
    choices: [amd, nvidia, none]
    default: none
  gpu_devices:
    description: NVIDIA CDI device names (default C(nvidia.com/gpu=all)) or extra device paths.
    type: list
    elements: str
    default: []
  network:
    description: Podman network mode.
    type: str
    default: host
  publish:
    description: Ports to publish when not on the host network.
    type: list
    elements: str
    default: []
  ipc:
    description: IPC mode (engines with tensor parallelism want C(host)).
    type: str
    default: host
  shm_size:
    description: Size of /dev/shm; only with an IPC namespace of the container's own (C(ipc) not C(host)).
    type: str
    default: ''
  ulimits:
    description: C(--ulimit) values, such as C(nofile=65536:65536).
    type: list
    elements: str
    default: []
  environment:
    description:
      - Environment for the engine, passed through a root-only env file.
      - A value podman versions would read differently (empty, C(#), a leading quote, control characters) is refused, naming its key.
    type: dict
    default: {}
  secret_environment:
    description: Secret environment; never logged.
    type: dict
    default: {}
  runtime:
    description: OCI runtime (C(crun), C(runc)); empty for podman's default.
    type: str
    default: ''
  cgroups:
    description: Podman C(--cgroups) mode (for example V(disabled) for nested hosts); empty for the default.
    type: str
    default: ''
  stop_timeout:
    description: Seconds C(podman stop) waits before killing.
    type: int
    default: 30
  extra_args:
    description: Further C(podman run) arguments, placed before the image.
    type: list
    elements: str
    default: []
  labels:
    description: Extra labels.
    type: dict
    default: {}
  user:
    description:
      - The numeric C(UID:GID) the engine runs as inside the container (not root); the host's
        C(cache_dir) is created or chowned to it. V(0:0) runs the engine as root again.
    type: str
    default: '10001:10001'
  cap_add:
    description: Capabilities the engine gets back (such as C(SYS_NICE)); every other capability is dropped (C(--cap-drop=all)).
    type: list
    elements: str
    default: []
  read_only:
    description: A read-only root filesystem; the cache mount and a tmpfs C(/tmp) are the only writable places. V(false) makes the root writable.
    type: bool
    default: true
  no_new_privileges:
    description: C(--security-opt=no-new-privileges), so no setuid binary or file capability raises the engine's privileges.
    type: bool
    default: true
  seccomp_unconfined:
    description:
      - Run without podman's seccomp profile (C(seccomp=unconfined)). Only where a ROCm stack on a
        given kernel fails inside the profile, which refuses move_pages, migrate_pages and
        perf_event_open (ROCm's own container instructions run unconfined). The default keeps
        the profile.
    type: bool
    default: false
  env_file:
    description: Path of the container's env file (absolute); the host's config-hash key is kept in the same directory.
    type: path
  pull:
    description: V(never) fails when the image is missing; V(missing) pulls C(IMAGE@DIGEST) then.
    type: str
    choices: [never, missing]
    default: never
  state:
    description: V(present) gates the image and returns the argv; V(absent) removes this container.
    type: str
    choices: [present, absent]
    default: present
"""

    UNIT = r"""
options:
  name:
    description: A unit name by systemd's rules, ending in C(.service); never a path (C(/) and C(..) are refused).
    type: str
    required: true
  command:
    description: The ExecStart command as an argv list; the first element is an absolute path.
    type: list
    elements: str
  stop_command:
    description: The ExecStop command as an argv list (for example C(podman stop -t 30 NAME)).
    type: list
    elements: str
  pre_start:
    description: ExecStartPre commands, each an argv list.
    type: list
    elements: list
    default: []
  description:
    description: The unit's Description.
    type: str
    default: ''
  user:
    description: User= for the service (a non-root service user for native engines; podman engines run as root).
    type: str
    default: ''
  group:
    description: Group= for the service.
    type: str
    default: ''
  environment:
    description: Environment for the engine, written to an EnvironmentFile. Newlines are refused.
    type: dict
    default: {}
  secret_environment:
    description: Environment holding secrets; never logged, and the EnvironmentFile becomes mode 0600.
    type: dict
    default: {}
  working_directory:
    description: WorkingDirectory= of the service.
    type: str
    default: ''
  restart_sec:
    description: RestartSec= in seconds.
    type: int
    default: 5
  timeout_start_sec:
    description: TimeoutStartSec= in seconds; model loads take minutes.
    type: int
    default: 900
  timeout_stop_sec:
    description: TimeoutStopSec= in seconds.
    type: int
    default: 120
  extra_service:
    description:
      - Further C([Service]) directives, as a mapping; keys are directive names.
      - A directive named here replaces the C(sandbox) lines for that directive (all of them, so
        C(DeviceAllow) here replaces the GPU device list).
    type: dict
    default: {}
  sandbox:
    description:
      - Sandbox a native engine - C(NoNewPrivileges), C(ProtectSystem=strict),
        C(ProtectHome=read-only), C(PrivateTmp), the kernel, clock and hostname protections,
        C(RestrictNamespaces), C(RestrictSUIDSGID), a C(@system-service) system-call filter, no
        capabilities, and C(DevicePolicy=closed) with the GPU device groups (drm, kfd, nvidia*) allowed.
      - No C(PrivateDevices) and no C(MemoryDenyWriteExecute) - GPU runtimes need the devices and JIT.
      - Not for units that run C(podman run), which writes C(/var/lib/containers) and C(/run).
    type: bool
    default: false
  read_write_paths:
    description: Paths the engine may write under C(sandbox) (C(ReadWritePaths=), a missing path is skipped), for example its cache directory.
    type: list
    elements: str
    default: []
  state:
    description: V(started) installs, enables and starts; V(stopped) installs and stops; V(absent) stops and removes.
    type: str
    choices: [started, stopped, absent]
    default: started
  enabled:
    description: Enable the unit at boot.
    type: bool
    default: true
  restart:
    description: Restart even when nothing changed.
    type: bool
    default: false
  health:
    description:
      - The health gate, run after every (re)start and checked (without restarting) on an unchanged unit.
      - Omit to skip the gate.
    type: dict
    suboptions:
      port:
        description: The engine's port.
        type: int
        required: true
      host:
        description: Address to probe.
        type: str
        default: 127.0.0.1
      served_id:
        description: A model id C(/v1/models) must list.
        type: str
        default: ''
      container:
        description: Name of the engine container the unit runs, for the ownership check.
        type: str
        default: ''
      timeout:
        description: Seconds to wait for green.
        type: int
        default: 300
      allowed_restarts:
        description: Restarts tolerated during the wait before it counts as a crash loop.
        type: int
        default: 0
      api_key:
        description:
          - The endpoint's API key, sent as a bearer token with the health requests (the engine gets it
            from its environment). Never logged; a 401 or 403 fails the gate at once.
        type: str
        default: ''
      drain_timeout:
        description:
          - Before a restart of a running unit, seconds to wait for the engine's in-flight requests
            (read from its /metrics) to finish; 0 restarts at once. The result's C(drain) says what happened.
        type: int
        default: 60
  dropins:
    description:
      - Drop-in files (C(NAME.service.d/*.conf), by file name or path) the unit may have. Any other drop-in
        under the unit directory or systemd's search path fails the step, naming it.
    type: list
    elements: str
    default: []
  unit_dir:
    description: Directory for the unit file.
    type: path
    default: /etc/systemd/system
  env_dir:
    description: Directory for the EnvironmentFile.
    type: path
    default: /etc/llm-fleet
"""

    PROBE = r"""
options:
  host:
    description: Address the probe sends to.
    type: str
    default: 127.0.0.1
  port:
    description: The engine's port.
    type: int
    required: true
  served_id:
    description: The model id the probe asks for.
    type: str
    required: true
  prompt:
    description: The chat prompt; the answer must hold at least one completion token.
    type: str
    default: Say hello in five words.
  max_tokens:
    description: max_tokens of the probe's request.
    type: int
    default: 8
  tools:
    description: Also require a tool call (C(tool_choice=required)) to come back as a tool call.
    type: bool
    default: false
  image:
    description: Also send an image, which must be answered (the projector is loaded).
    type: bool
    default: false
  timeout:
    description: Seconds each probe request may take.
    type: int
    default: 120
  api_key:
    description: The endpoint's API key, sent as a bearer token. Never logged.
    type: str
    default: ''
"""

    DEPLOY = r"""
options:
  engine:
    description: The engine container, as M(frank.llm_fleet.podman_engine)'s options. Omit for a native engine.
    type: dict
    suboptions:
      name:
        description: Container name (also the name cleared before each run).
        type: str
        required: true
      image:
        description: Image repository and tag, without a digest.
        type: str
        required: true
      digest:
        description: The pinned digest, C(sha256:...). The container runs C(IMAGE@DIGEST).
        type: str
        required: true
      command:
        description: Arguments after the image (the engine's own argv).
        type: list
        elements: str
        default: []
      entrypoint:
        description: Override the image's entrypoint.
        type: str
      model_dir:
        description: Host directory with the payload, mounted read-only at C(model_mount).
        type: path
      model_mount:
        description: Where the payload appears in the container.
        type: str
        default: /models
      cache_dir:
        description: Persistent host directory for the engine's caches, mounted at C(cache_mount); HOME points there.
        type: path
      cache_mount:
        description: Where the cache directory appears in the container.
        type: str
        default: /cache
      gpu_vendor:
        description: V(amd) passes /dev/kfd and /dev/dri with the host's numeric video and render GIDs; V(nvidia) passes CDI devices.
        type: str
        choices: [amd, nvidia, none]
        default: none
      gpu_devices:
        description: NVIDIA CDI device names (default C(nvidia.com/gpu=all)) or extra device paths.
        type: list
        elements: str
        default: []
      network:
        description: Podman network mode.
        type: str
        default: host
      publish:
        description: Ports to publish when not on the host network.
        type: list
        elements: str
        default: []
      ipc:
        description: IPC mode (engines with tensor parallelism want C(host)).
        type: str
        default: host
      shm_size:
        description: Size of /dev/shm; only with an IPC namespace of the container's own (C(ipc) not C(host)).
        type: str
        default: ''
      ulimits:
        description: C(--ulimit) values, such as C(nofile=65536:65536).
        type: list
        elements: str
        default: []
      environment:
        description:
          - Environment for the engine, passed through a root-only env file.
          - A value podman versions would read differently (empty, C(#), a leading quote, control characters) is refused, naming its key.
        type: dict
        default: {}
      secret_environment:
        description: Secret environment; never logged.
        type: dict
        default: {}
      runtime:
        description: OCI runtime (C(crun), C(runc)); empty for podman's default.
        type: str
        default: ''
      cgroups:
        description: Podman C(--cgroups) mode (for example V(disabled) for nested hosts); empty for the default.
        type: str
        default: ''
      stop_timeout:
        description: Seconds C(podman stop) waits before killing.
        type: int
        default: 30
      extra_args:
        description: Further C(podman run) arguments, placed before the image.
        type: list
        elements: str
        default: []
      labels:
        description: Extra labels.
        type: dict
        default: {}
      user:
        description:
          - The numeric C(UID:GID) the engine runs as inside the container (not root); the host's
            C(cache_dir) is created or chowned to it. V(0:0) runs the engine as root again.
        type: str
        default: '10001:10001'
      cap_add:
        description: Capabilities the engine gets back (such as C(SYS_NICE)); every other capability is dropped (C(--cap-drop=all)).
        type: list
        elements: str
        default: []
      read_only:
        description: A read-only root filesystem; the cache mount and a tmpfs C(/tmp) are the only writable places. V(false) makes the root writable.
        type: bool
        default: true
      no_new_privileges:
        description: C(--security-opt=no-new-privileges), so no setuid binary or file capability raises the engine's privileges.
        type: bool
        default: true
      seccomp_unconfined:
        description:
          - Run without podman's seccomp profile (C(seccomp=unconfined)). Only where a ROCm stack on a
            given kernel fails inside the profile, which refuses move_pages, migrate_pages and
            perf_event_open (ROCm's own container instructions run unconfined). The default keeps
            the profile.
        type: bool
        default: false
      env_file:
        description: Path of the container's env file (absolute); the host's config-hash key is kept in the same directory.
        type: path
      pull:
        description: V(never) fails when the image is missing; V(missing) pulls C(IMAGE@DIGEST) then.
        type: str
        choices: [never, missing]
        default: never
      state:
        description: V(present) gates the image and returns the argv; V(absent) removes this container.
        type: str
        choices: [present, absent]
        default: present
  unit:
    description:
      - The unit, as M(frank.llm_fleet.systemd_root_unit)'s options (with C(health)).
      - With O(engine), C(command) and C(stop_command) come from the container.
    type: dict
    required: true
    suboptions:
      name:
        description: A unit name by systemd's rules, ending in C(.service); never a path (C(/) and C(..) are refused).
        type: str
        required: true
      command:
        description: The ExecStart command as an argv list; the first element is an absolute path.
        type: list
        elements: str
      stop_command:
        description: The ExecStop command as an argv list (for example C(podman stop -t 30 NAME)).
        type: list
        elements: str
      pre_start:
        description: ExecStartPre commands, each an argv list.
        type: list
        elements: list
        default: []
      description:
        description: The unit's Description.
        type: str
        default: ''
      user:
        description: User= for the service (a non-root service user for native engines; podman engines run as root).
        type: str
        default: ''
      group:
        description: Group= for the service.
        type: str
        default: ''
      environment:
        description: Environment for the engine, written to an EnvironmentFile. Newlines are refused.
        type: dict
        default: {}
      secret_environment:
        description: Environment holding secrets; never logged, and the EnvironmentFile becomes mode 0600.
        type: dict
        default: {}
      working_directory:
        description: WorkingDirectory= of the service.
        type: str
        default: ''
      restart_sec:
        description: RestartSec= in seconds.
        type: int
        default: 5
      timeout_start_sec:
        description: TimeoutStartSec= in seconds; model loads take minutes.
        type: int
        default: 900
      timeout_stop_sec:
        description: TimeoutStopSec= in seconds.
        type: int
        default: 120
      extra_service:
        description:
          - Further C([Service]) directives, as a mapping; keys are directive names.
          - A directive named here replaces the C(sandbox) lines for that directive (all of them, so
            C(DeviceAllow) here replaces the GPU device list).
        type: dict
        default: {}
      sandbox:
        description:
          - Sandbox a native engine - C(NoNewPrivileges), C(ProtectSystem=strict),
            C(ProtectHome=read-only), C(PrivateTmp), the kernel, clock and hostname protections,
            C(RestrictNamespaces), C(RestrictSUIDSGID), a C(@system-service) system-call filter, no
            capabilities, and C(DevicePolicy=closed) with the GPU device groups (drm, kfd, nvidia*) allowed.
          - No C(PrivateDevices) and no C(MemoryDenyWriteExecute) - GPU runtimes need the devices and JIT.
          - Not for units that run C(podman run), which writes C(/var/lib/containers) and C(/run).
        type: bool
        default: false
      read_write_paths:
        description: Paths the engine may write under C(sandbox) (C(ReadWritePaths=), a missing path is skipped), for example its cache directory.
        type: list
        elements: str
        default: []
      state:
        description: V(started) installs, enables and starts; V(stopped) installs and stops; V(absent) stops and removes.
        type: str
        choices: [started, stopped, absent]
        default: started
      enabled:
        description: Enable the unit at boot.
        type: bool
        default: true
      restart:
        description: Restart even when nothing changed.
        type: bool
        default: false
      health:
        description:
          - The health gate, run after every (re)start and checked (without restarting) on an unchanged unit.
          - Omit to skip the gate.
        type: dict
        suboptions:
          port:
            description: The engine's port.
            type: int
            required: true
          host:
            description: Address to probe.
            type: str
            default: 127.0.0.1
          served_id:
            description: A model id C(/v1/models) must list.
            type: str
            default: ''
          container:
            description: Name of the engine container the unit runs, for the ownership check.
            type: str
            default: ''
          timeout:
            description: Seconds to wait for green.
            type: int
            default: 300
          allowed_restarts:
            description: Restarts tolerated during the wait before it counts as a crash loop.
            type: int
            default: 0
          api_key:
            description:
              - The endpoint's API key, sent as a bearer token with the health requests (the engine gets it
                from its environment). Never logged; a 401 or 403 fails the gate at once.
            type: str
            default: ''
          drain_timeout:
            description:
              - Before a restart of a running unit, seconds to wait for the engine's in-flight requests
                (read from its /metrics) to finish; 0 restarts at once. The result's C(drain) says what happened.
            type: int
            default: 60
      dropins:
        description:
          - Drop-in files (C(NAME.service.d/*.conf), by file name or path) the unit may have. Any other drop-in
            under the unit directory or systemd's search path fails the step, naming it.
        type: list
        elements: str
        default: []
      unit_dir:
        description: Directory for the unit file.
        type: path
        default: /etc/systemd/system
      env_dir:
        description: Directory for the EnvironmentFile.
        type: path
        default: /etc/llm-fleet
  probe:
    description:
      - The smoke probe - a chat completion must answer with at least one token; with C(tools)
        a required tool call must come back as a tool call, with C(image) an image must be read.
      - Omit to skip the probe.
    type: dict
    suboptions:
      host:
        description: Address the probe sends to.
        type: str
        default: 127.0.0.1
      port:
        description: The engine's port.
        type: int
        required: true
      served_id:
        description: The model id the probe asks for.
        type: str
        required: true
      prompt:
        description: The chat prompt; the answer must hold at least one completion token.
        type: str
        default: Say hello in five words.
      max_tokens:
        description: max_tokens of the probe's request.
        type: int
        default: 8
      tools:
        description: Also require a tool call (C(tool_choice=required)) to come back as a tool call.
        type: bool
        default: false
      image:
        description: Also send an image, which must be answered (the projector is loaded).
        type: bool
        default: false
      timeout:
        description: Seconds each probe request may take.
        type: int
        default: 120
      api_key:
        description: The endpoint's API key, sent as a bearer token. Never logged.
        type: str
        default: ''
"""
