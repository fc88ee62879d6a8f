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
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.attributes.CHANGES_HOST
options:
  name:
    description: Unit name, ending in C(.service).
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
    description: Further C([Service]) directives, as a mapping.
    type: dict
    default: {}
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
  unit_dir:
    description: Directory for the unit file.
    type: path
    default: /etc/systemd/system
  env_dir:
    description: Directory for the EnvironmentFile.
    type: path
    default: /etc/llm-fleet
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

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.frank.llm_fleet.plugins.module_utils.systemd_unit import (
    UnitError,
    UnitSpec,
    read_text,
    render_env_file,
    render_unit,
    write_atomically,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.unit_manager import GateError, HealthSpec, UnitManager, boottime


def main() -> None:
    module = AnsibleModule(
        argument_spec={
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
            "state": {"type": "str", "choices": ["started", "stopped", "absent"], "default": "started"},
            "enabled": {"type": "bool", "default": True},
            "restart": {"type": "bool", "default": False},
            "health": {
                "type": "dict",
                "options": {
                    "port": {"type": "int", "required": True},
                    "host": {"type": "str", "default": "127.0.0.1"},
                    "served_id": {"type": "str", "default": ""},
                    "container": {"type": "str", "default": ""},
                    "timeout": {"type": "int", "default": 300},
                    "allowed_restarts": {"type": "int", "default": 0},
                },
            },
            "unit_dir": {"type": "path", "default": "/etc/systemd/system"},
            "env_dir": {"type": "path", "default": "/etc/llm-fleet"},
        },
        required_if=[("state", "started", ["command"]), ("state", "stopped", ["command"])],
        supports_check_mode=True,
    )
    begun = time.monotonic()
    p = module.params
    name = p["name"]
    unit_path = os.path.join(p["unit_dir"], name)
    env_path = os.path.join(p["env_dir"], name.rsplit(".", 1)[0] + ".env")
    manager = UnitManager(module.run_command)
    result: dict = {"changed": False, "unit_path": unit_path}

    def fail(msg: str, **extra) -> None:
        module.fail_json(msg=msg, elapsed=round(time.monotonic() - begun, 2), **{**result, **extra})

    if p["state"] == "absent":
        before = read_text(unit_path)
        env_before = read_text(env_path)
        if before is not None or env_before is not None:
            result["changed"] = True
            result["diff"] = {"before": before or "", "after": "", "before_header": unit_path}
            if not module.check_mode:
                props = manager.show(name)
                if props.get("ActiveState") not in ("inactive", "failed", None):
                    manager.systemctl("stop", name)
                if props.get("UnitFileState") == "enabled":
                    manager.systemctl("disable", name)
                for path in (unit_path, env_path):
                    if os.path.exists(path):
                        os.unlink(path)
                manager.daemon_reload()
        module.exit_json(elapsed=round(time.monotonic() - begun, 2), **result)

    environment = {**p["environment"], **p["secret_environment"]}
    try:
        env_text = render_env_file({k: str(v) for k, v in environment.items()}) if environment else None
        spec = UnitSpec(
            name=name,
            command=p["command"],
            description=p["description"],
            stop_command=p["stop_command"] or [],
            pre_start=p["pre_start"],
            user=p["user"],
            group=p["group"],
            environment_file=env_path if env_text else "",
            working_directory=p["working_directory"],
            restart_sec=p["restart_sec"],
            timeout_start_sec=p["timeout_start_sec"],
            timeout_stop_sec=p["timeout_stop_sec"],
            extra_service={k: str(v) for k, v in p["extra_service"].items()},
        )
        unit_text = render_unit(spec)
    except UnitError as exc:
        fail(str(exc))

    unit_before = read_text(unit_path)
    env_before = read_text(env_path) if env_text else None
    unit_changed = unit_before != unit_text
    env_changed = env_text is not None and env_before != env_text
    content_changed = unit_changed or env_changed
    if unit_changed:
        result["diff"] = {"before": unit_before or "", "after": unit_text, "before_header": unit_path, "after_header": unit_path}
    if env_text:
        result["env_path"] = env_path
        result["env_changed"] = env_changed  # the values themselves are never returned
    if module.check_mode:
        result["changed"] = content_changed or p["restart"]
        module.exit_json(elapsed=round(time.monotonic() - begun, 2), **result)

    health = HealthSpec(**p["health"]) if p["health"] else None
    try:
        if env_changed and env_text is not None:
            os.makedirs(p["env_dir"], mode=0o755, exist_ok=True)
            write_atomically(env_path, env_text, 0o600 if p["secret_environment"] else 0o640)
        if unit_changed:
            write_atomically(unit_path, unit_text, 0o644)
        if content_changed:
            manager.daemon_reload()
            result["changed"] = True
        props = manager.show(name)
        if p["enabled"] and props.get("UnitFileState") != "enabled":
            manager.systemctl("enable", name)
            result["changed"] = True
        elif not p["enabled"] and props.get("UnitFileState") == "enabled":
            manager.systemctl("disable", name)
            result["changed"] = True

        if p["state"] == "stopped":
            if props.get("ActiveState") not in ("inactive", "failed"):
                manager.systemctl("stop", name)
                result["changed"] = True
            module.exit_json(elapsed=round(time.monotonic() - begun, 2), **result)

        running = props.get("ActiveState") == "active"
        if content_changed or p["restart"] or not running:
            manager.stop_previous(name, health)
            if health:
                manager.port_gate(name, health)
            restarts_before = int(manager.show(name).get("NRestarts", "0") or 0)
            started_at = boottime()
            manager.systemctl("start", name)
            result["changed"] = True
        else:
            restarts_before = int(props.get("NRestarts", "0") or 0)
            started_at = None  # unchanged and running: the listener may be as old as the unit
        if health:
            report = manager.wait_healthy(name, health, started_at if started_at is not None else 0.0, restarts_before)
            result["health"] = report.as_dict()
        final = manager.show(name)
        result.update(main_pid=int(final.get("MainPID", 0) or 0), n_restarts=int(final.get("NRestarts", 0) or 0), active_state=final.get("ActiveState", ""))
    except GateError as exc:
        fail(str(exc), **exc.details)
    module.exit_json(elapsed=round(time.monotonic() - begun, 2), **result)


if __name__ == "__main__":
    main()
