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
    a label with a keyed hash of the configuration - and the matching ExecStop (C(podman stop -t N NAME)).
  - The engine runs with least privilege unless an option relaxes it - a non-root C(UID:GID)
    (O(user)), every capability dropped (O(cap_add) gives some back), C(no-new-privileges),
    podman's seccomp profile (O(seccomp_unconfined) drops it), and a read-only root where only the
    cache mount and a tmpfs C(/tmp) are writable (O(read_only)).
  - Writes the container's env file (mode 0600) when O(environment) or O(secret_environment) is
    given, and removes it when neither is; a value that podman versions would read differently
    is refused, naming its key.
  - Creates the cache directory owned by O(user) (or chowns it to O(user)), and on first use the
    host's config-hash key (32 random bytes, mode 0600) beside the env file.
  - Runtime knobs that differ per host (runtime, cgroups mode, ulimits) are parameters, so host
    quirks live in the inventory.
  - O(state=absent) removes only this container (by its exact name) and its env file.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.CHANGES_HOST
  - frank.llm_fleet.host_options.ENGINE
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
env_changed:
  description: Whether the env file was written or removed (in check mode, would be); a secrets-only change shows here.
  returned: always
  type: bool
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.engine_step import ensure_engine, remove_engine
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import ENGINE_OPTIONS, argument_spec
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import ModuleCall, run_module


def engine(call: ModuleCall) -> dict:
    if call.params["state"] == "absent":
        return remove_engine(call.params, call.host)
    return ensure_engine(call.params, call.host, call.diff)


def main() -> None:
    run_module(argument_spec(ENGINE_OPTIONS), engine)


if __name__ == "__main__":
    main()
