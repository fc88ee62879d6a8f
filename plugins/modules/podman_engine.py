#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: podman_engine
short_description: Describe an engine container, gate its image digest, and produce the argv a root unit runs
version_added: 0.1.0
description:
  - Checks that the image is present locally and matches the pinned digest, else fails naming the
    expected and the actual digest (it pulls by digest only when O(pull=missing)).
  - Returns the foreground C(podman run) argv for a root unit's ExecStart - its own name cleared
    first (C(--replace)), C(--rm), a persistent cache directory mounted with HOME pointing there,
    the model directory read-only, GPU devices, network, ipc, ulimits, an env file for values and
    a label with the hash of the configuration - and the matching ExecStop (C(podman stop -t N NAME)).
  - Writes the container's env file (mode 0600) when O(environment) or O(secret_environment) is
    given; that file is the only thing O(state=present) changes on the host.
  - Runtime knobs that differ per host (runtime, cgroups mode, ulimits) are parameters, so host
    quirks live in the inventory.
  - O(state=absent) removes only this container (by its exact name) and its env file.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.CHANGES_HOST
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
    description: Host directory with the payload, mounted read-only at O(model_mount).
    type: path
  model_mount:
    description: Where the payload appears in the container.
    type: str
    default: /models
  cache_dir:
    description: Persistent host directory for the engine's caches, mounted at O(cache_mount); HOME points there.
    type: path
  cache_mount:
    description: Where the cache directory appears in the container.
    type: str
    default: /cache
  gpu_vendor:
    description: V(amd) passes /dev/kfd and /dev/dri with groups video and render; V(nvidia) passes CDI devices.
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
    description: Size of /dev/shm; only with an IPC namespace of the container's own (O(ipc) not C(host)).
    type: str
    default: ''
  ulimits:
    description: C(--ulimit) values, such as C(nofile=65536:65536).
    type: list
    elements: str
    default: []
  environment:
    description: Environment for the engine, passed through a root-only env file (values taken literally).
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
  env_file:
    description: Path of the container's env file.
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

EXAMPLES = r"""
- name: Describe frank-primary's vLLM container
  frank.llm_fleet.podman_engine:
    name: frank-primary
    image: registry.example/vllm-rocm:v0.11-fork
    digest: sha256:0d4c2a5e2b9f5b8e0a6f4b1c7d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e
    gpu_vendor: amd
    model_dir: /srv/models/frank-primary
    cache_dir: /var/cache/frank-primary
    command: [--model, /models, --served-model-name, frank-primary, --port, "7770", -tp, "2"]
  register: engine

- name: Run it under a root unit
  frank.llm_fleet.systemd_root_unit:
    name: frank-primary.service
    command: "{{ engine.run_argv }}"
    stop_command: "{{ engine.stop_argv }}"
    health: {port: 7770, served_id: frank-primary, container: frank-primary}
"""

RETURN = r"""
run_argv:
  description: The foreground C(podman run) argv for ExecStart.
  returned: when state is present
  type: list
  elements: str
stop_argv:
  description: The ExecStop argv.
  returned: when state is present
  type: list
  elements: str
cleanup_argv:
  description: The argv that removes exactly this container name.
  returned: when state is present
  type: list
  elements: str
config_hash:
  description: Hash of the container's configuration, also set as a label.
  returned: when state is present
  type: str
image:
  description: The digest gate's verdict.
  returned: when state is present
  type: str
env_file:
  description: Path of the env file, when one is written.
  returned: when environment is given
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.deploy_steps import ensure_engine, remove_engine, report

ARGUMENT_SPEC = {
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
    "env_file": {"type": "path"},
    "pull": {"type": "str", "choices": ["never", "missing"], "default": "never"},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if module.params["state"] == "absent":
        report(module, lambda: remove_engine(module.params, module.run_command, module.check_mode))
    else:
        report(module, lambda: ensure_engine(module.params, module.run_command, module.check_mode, module._diff))


if __name__ == "__main__":
    main()
