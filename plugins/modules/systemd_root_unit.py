#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: systemd_root_unit
short_description: Install a root systemd unit for an engine that survives faults and never reports a false green
version_added: 0.1.0
description:
  - Renders a system unit from an argv list (systemd quoting, so no argument can split or
    expand) and an EnvironmentFile whose values can never execute, installs both atomically, and
    runs C(daemon-reload) and a restart only when the rendered content changed (or O(restart=true)).
  - Defaults that survive known failures - C(Restart=always) (the API server exits 0 on a worker
    fault), C(StartLimitIntervalSec=0), a C(RestartSec), C(OOMScoreAdjust=-500),
    C(LimitMEMLOCK=infinity) and a long C(TimeoutStartSec).
  - Before a (re)start the unit's own previous instance is stopped and the engine container's own
    stale name is cleared; a foreign process on the port fails the task, named by PID and command line.
  - After a start the health gate is green only when the unit is active, the listening socket
    belongs to a process of this unit (its cgroup) or of the container it started, that process
    started after this start, C(/health) answers OK and C(/v1/models) lists the served id. A
    growing C(NRestarts) during the wait fails fast as a crash loop. Failures return the unit's
    last journal lines.
  - O(name) is a unit name, never a path, and no field may carry a control character (a newline
    or carriage return would add a directive); both are refused, naming the field, before anything
    is read or written.
  - O(sandbox=true) adds systemd sandboxing for a native engine (C(ProtectSystem=strict),
    C(ProtectHome=read-only), C(NoNewPrivileges) and more, GPU devices still allowed); not for
    units that run C(podman run). See docs/engine_units.md, "Sandboxing".
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.CHANGES_HOST
  - frank.llm_fleet.host_options.UNIT
"""

EXAMPLES = r"""
- name: frank-secondary as a native llama-server root unit, gated on health
  frank.llm_fleet.systemd_root_unit:
    name: frank-secondary.service
    description: frank-secondary (llama.cpp)
    user: llm
    command:
      - /opt/llama.cpp/bin/llama-server
      - --model
      - /srv/models/frank-secondary/model.gguf
      - --host
      - 0.0.0.0
      - --port
      - "7771"
      - --alias
      - frank-secondary
      - --metrics
    environment:
      CUDA_VISIBLE_DEVICES: "0"
    health:
      port: 7771
      served_id: frank-secondary
      timeout: 600
  register: unit

- name: frank-primary as a podman engine under a root unit
  frank.llm_fleet.systemd_root_unit:
    name: frank-primary.service
    command: "{{ engine.run_argv }}"
    stop_command: "{{ engine.stop_argv }}"
    health:
      port: 7770
      served_id: frank-primary
      container: frank-primary
"""

RETURN = r"""
unit_path:
  description: Path of the unit file.
  returned: always
  type: str
  sample: /etc/systemd/system/frank-secondary.service
env_path:
  description: Path of the EnvironmentFile, when one is written.
  returned: when environment is given
  type: str
main_pid:
  description: The unit's MainPID after the task.
  returned: when state is started
  type: int
n_restarts:
  description: The unit's NRestarts after the task.
  returned: when state is started
  type: int
active_state:
  description: The unit's ActiveState after the task.
  returned: when state is started
  type: str
health:
  description: What the health gate saw (listener PID and command line, ownership, models, elapsed seconds).
  returned: when health is given
  type: dict
journal:
  description: The unit's last journal lines, on failure.
  returned: on failure
  type: list
  elements: str
elapsed:
  description: Seconds the task took.
  returned: always
  type: float
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import UNIT_OPTIONS, argument_spec
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.systemd_unit import UnitError, unit_paths
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.unit_step import ensure_unit, remove_unit
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import ModuleCall, run_module
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError


def unit(call: ModuleCall) -> dict:
    try:
        # Every state reads or writes only these two paths; a name that is a path fails first.
        unit_paths(call.params["name"], call.params["unit_dir"], call.params["env_dir"])
    except UnitError as exc:
        raise StepError(str(exc), {"changed": False}) from None
    if call.params["state"] == "absent":
        return remove_unit(call.params, call.host)
    return ensure_unit(call.params, call.host, call.diff)


def main() -> None:
    run_module(argument_spec(UNIT_OPTIONS), unit, required_if=[("state", "started", ["command"]), ("state", "stopped", ["command"])])


if __name__ == "__main__":
    main()
