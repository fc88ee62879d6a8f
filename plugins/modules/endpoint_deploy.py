#!/usr/bin/python
# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: endpoint_deploy
short_description: Deploy one endpoint on its host in one call, with automatic rollback to the last-known-good shape
version_added: 0.1.0
description:
  - Runs the host side of an endpoint deploy as one module call - the engine container (what
    M(frank.llm_fleet.podman_engine) does, when O(engine) is given), the root unit with its port
    and health gates (what M(frank.llm_fleet.systemd_root_unit) does), a smoke probe (a chat
    completion must answer with at least one token) and the last-known-good record
    (C(RECORD_DIR/last-good.json) - shape, engine and unit arguments, never secrets).
  - When a step fails after the host changed and a last-known-good record exists, that shape is
    brought up again through the same gates and the task fails saying the new shape failed, why,
    and that the old one is serving again.
  - O(restore=true) brings the last-known-good shape up on demand.
  - O(noop_check=true) changes nothing and proves, in this one call, that the deploy would be a
    no-op - the record, the gates' inputs, the unit, image, env files and secrets as rendered, the
    payload whole and stamped, the engine healthy under the unit's MainPID and answering the probe -
    or names the check that needs the full path (RV(full_path_reason)). The role then skips its gates.
author:
  - frank.llm_fleet maintainers (@frank-ops)
extends_documentation_fragment:
  - frank.llm_fleet.host_options.DEPLOY
attributes:
  check_mode:
    support: full
    description:
      - In check mode every change goes through one runner that records it and runs nothing;
        C(steps) and C(actions) say what would change. The start, the health gate and the probes
        need a real start, so they do not run.
  diff_mode:
    support: full
    description: Diffs of the unit file, the env files (named, values hidden) and the last-known-good record.
  idempotent:
    support: partial
    description: A second deploy with the same arguments reports no change; O(restore=true) always restarts, so it always reports a change.
options:
  api_key:
    description:
      - The endpoint's API key (from Ansible Vault). The engine reads it from its environment
        (C(LLAMA_API_KEY) for llama-server, C(VLLM_API_KEY) for vLLM, by the shape's C(runtime)), never
        from argv; the health gate and the smoke probe send it as a bearer token. A change of the
        key alone restarts the engine, and a failing one rolls back to the previous key.
      - The key is never logged, recorded or returned; the previous secrets are kept root-only
        beside the env files (C(ENV_DIR/NAME.last-good-secrets.json)) for the rollback.
    type: str
    default: ''
  firewall:
    description:
      - The firewall of a LAN bind, as the role's C(frank.llm_fleet.bind_policy) filter gives it - the
        endpoint's own nftables table C(inet llm_fleet_NAME) admits, on O(firewall.port), loopback, this
        host's own addresses and O(firewall.networks), and drops the rest. Written to
        C(/etc/llm-fleet/NAME.nft), applied at once when it changes (no engine restart), and loaded
        by the unit before every start (C(ExecStartPre)).
      - Omitted, the endpoint's table and file are removed if they exist (the endpoint went back to loopback).
    type: dict
    suboptions:
      port:
        description: The engine's port.
        type: int
        required: true
      networks:
        description: The client networks allowed (CIDRs).
        type: list
        elements: str
        required: true
  secret_environment:
    description: Secret environment for the engine (the container's env file or the unit's). Never logged or recorded.
    type: dict
    default: {}
  shape:
    description: The shape, kept in the record for the operator and the runbooks.
    type: dict
    default: {}
  record_dir:
    description: Directory of the last-known-good record.
    type: path
    required: true
  rollback:
    description: Restore the last-known-good shape when the new one fails.
    type: bool
    default: true
  restore:
    description: Only bring the last-known-good shape (or, with O(generation), an older one) up again.
    type: bool
    default: false
  noop_check:
    description:
      - Change nothing; prove that this deploy would be a no-op, in order - a last-known-good record
        exists; its O(gates) equal these; the deploy's own steps in check mode would change nothing
        (record, image digest, env files, kept secrets, unit file, firewall, retired units, payload
        link); the payload gate's verification passes (every file at its size and, with
        O(payload.check_hash), its sha256 - a stamp of an earlier verification while the file is
        unchanged, else hashed); the unit is enabled and active; the health
        gate passes at once (the listener is the unit's engine, /health, /v1/models); the probe
        answers (not in check mode); MainPID and NRestarts did not move.
      - Returns RV(noop) and, when it is false, RV(full_path_reason) - the first check that failed.
    type: bool
    default: false
  gates:
    description:
      - What the controller-side gates before this call judged (the role gives the budget's devices
        and settings and the payload gate's); kept in the record, and compared by O(noop_check).
    type: dict
    default: {}
  generation:
    description:
      - With O(restore=true), the known-good record to bring up - 0 is the last-known-good one, N the
        Nth before it (RETURN's C(generations) lists them). An older generation that comes up green
        becomes the last-known-good record and runs with the current secrets.
    type: int
    default: 0
  payload:
    description:
      - The payload this shape runs - O(payload.dir) and its O(payload.manifest). The record keeps them
        with the manifest's sha256, and a rollback or restore first checks that payload is still on
        disk as it was (the manifest reads the same, every file at its size), so an old shape never
        boots on newer weights fetched into the same directory.
    type: dict
    suboptions:
      dir:
        description: The payload directory.
        type: path
        required: true
      manifest:
        description: The payload's manifest (what M(frank.llm_fleet.hf_payload_gate) verified).
        type: path
        required: true
      generations:
        description:
          - Payload generations kept, K (C(0), one payload directory). With K >= 1, O(payload.dir) is a
            symlink to the payload's generation (C(DIR.generations/SHA256), named by the manifest's
            sha256, made by O(frank.llm_fleet.hf_payload_gate#module:state=generation)). The link is swapped
            atomically to this payload's generation just before the unit restarts (a moved link always
            restarts it), and a rollback or restore points it back at the generation the known-good
            record names, bringing it back from C(.purge-staged/) by a rename, or refusing, naming it,
            when it was purged.
          - After a green deploy, in the same call, generations past the K most recently served are
            renamed into C(DIR.generations/.purge-staged/) (C(steps.payload_retention)).
        type: int
        default: 0
      keep_rejected:
        description: C(NAME.rejected-*) copies kept per file after a green deploy; older ones are staged for purge (generations or not).
        type: int
        default: 2
      purge_approved:
        description: After a green deploy, delete what C(.purge-staged/) holds, naming each entry and the bytes freed. Never without it.
        type: bool
        default: false
      check_hash:
        description: Whether the payload gate checks sha256; O(noop_check) then checks it too (stamps trusted).
        type: bool
        default: false
  retire_units:
    description:
      - Units of an old runtime to retire before this endpoint starts (the port may be theirs) -
        stopped, disabled, the file and its drop-ins moved to C(STATE_DIR/archive/DATE/), and masked;
        a LAN endpoint's nftables table is deleted and its rules file archived with it.
        Restorable; see docs/engine_units.md. An endpoint whose runtime or launch changes keeps its
        unit name, and a copy of the old unit file goes to the same archive (C(steps.retire.swap)).
    type: list
    elements: str
    default: []
  retire_renamed:
    description:
      - Retire, as if listed in O(retire_units), a unit this collection wrote for an endpoint the
        inventory renamed - found from the kept records, never listed - (C(steps.retire.units[].found) says why).
        A candidate is a unit named by another endpoint's kept record (C(STATE_DIR/*/last-good.json)),
        installed in the unit directory with the collection's header, whose record serves this
        endpoint's port on this host - one port serves one endpoint, so it is an old name of this one.
        No other unit is ever retired this way. Check mode shows it.
    type: bool
    default: true
  host_units:
    description:
      - The units of every endpoint the inventory places on this host. When given, a unit this
        collection wrote (as above) on another port that none of them names is reported, in a
        warning and C(steps.retire.orphans), never retired.
    type: list
    elements: str
  keep_generations:
    description: Known-good records kept per endpoint, the last-known-good one included (C(RECORD_DIR/generations/)).
    type: int
    default: 3
"""

EXAMPLES = r"""
- name: Deploy frank-primary (container) in one call
  frank.llm_fleet.endpoint_deploy:
    engine: "{{ engine_options }}"  # the container options, as podman_engine takes them
    unit:
      name: frank-primary.service
      health: {port: 7770, served_id: frank-primary, container: frank-primary}
    probe: {host: 127.0.0.1, port: 7770, served_id: frank-primary, prompt: Say hello., max_tokens: 8}
    record_dir: /var/lib/llm-fleet/frank-primary

- name: Roll frank-primary back to its last-known-good shape
  frank.llm_fleet.endpoint_deploy:
    unit: {name: frank-primary.service}
    record_dir: /var/lib/llm-fleet/frank-primary
    restore: true
"""

RETURN = r"""
steps:
  description: What each step did, each with its own C(changed) (and C(diff) where it has one).
  returned: unless the task failed
  type: dict
  contains:
    engine:
      description:
        - The engine step, as M(frank.llm_fleet.podman_engine) reports it (run_argv, config_hash, image
          verdict, env_file); C(skipped) for a native engine.
      type: dict
    unit:
      description:
        - The unit step, as M(frank.llm_fleet.systemd_root_unit) reports it (unit_path, main_pid,
          n_restarts, active_state, health, elapsed; C(diff) of the unit file).
      type: dict
    probe:
      description:
        - The smoke probe - C(completion), the answer's text; C(skipped) says why when no probe ran
          (none given, check mode, a restore). Never changes anything.
      type: dict
    record:
      description: The last-known-good record - C(path), C(changed), and C(diff) (the record has no secrets).
      type: dict
    payload_retention:
      description:
        - With O(payload), what the retention did after the green deploy - C(kept) (generations), C(staged)
          (C(name), C(kind), C(bytes), C(staged_as)), C(awaiting_approval), C(purged), C(bytes_freed), C(msg).
      type: dict
    payload:
      description:
        - With O(payload.generations), the switch of the payload link - C(generation), C(dir), C(previous)
          (the generation it pointed at), C(unstaged) when a staged generation was brought back, C(actions).
      type: dict
actions:
  description:
    - Every change made on the host (commands as argv, files written or removed, by path only), in
      order; in check mode, the files that would be written (the start and what follows it need a real start).
  returned: always
  type: list
  elements: str
record:
  description: Path of the last-known-good record.
  returned: unless the task failed
  type: str
boot_ledger:
  description:
    - After a (re)start, the memory facts the engine printed while booting (KV cache size and
      cells, buffers, vLLM KV tokens and concurrency), also written to C(RECORD_DIR/boot-ledger.json).
  returned: when the unit was (re)started, not in check mode
  type: dict
rolled_back:
  description:
    - Whether the last-known-good shape was brought back after the new one failed. A failure
      before any record exists, or with a record equal to the new shape, or in check mode, or with
      O(rollback=false), is not rolled back.
  returned: always
  type: bool
generations:
  description:
    - The known-good records kept - C(generation) (0 is the last-known-good), C(written), C(runtime), C(served_id), C(port),
      and with payload generations C(payload) (its C(generation) and C(on_disk) - kept, staged or purged).
  returned: success
  type: list
  elements: dict
restored:
  description: True when O(restore=true) brought the last-known-good shape up again (always restarted, so changed).
  returned: when restore is true
  type: bool
noop:
  description: With O(noop_check=true), whether the deploy would be a no-op (every check passed).
  returned: when noop_check is true
  type: bool
full_path_reason:
  description: "With O(noop_check=true), the first check that failed and why (C(CHECK: REASON)); empty when RV(noop)."
  returned: when noop_check is true
  type: str
checks:
  description: With O(noop_check=true), each check run - C(check), C(ok), C(detail) (what it saw).
  returned: when noop_check is true
  type: list
  elements: dict
main_pid:
  description: With O(noop_check=true), the unit's MainPID the proof saw (0 when it never got that far).
  returned: when noop_check is true
  type: int
"""

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.endpoint_deploy import deploy_endpoint
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.noop_check import check_noop
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.specs import DEPLOY_OPTIONS, argument_spec
from ansible_collections.frank.llm_fleet.plugins.module_utils.module_entry import run_module


def main() -> None:
    run_module(
        {
            **argument_spec(DEPLOY_OPTIONS),  # engine, unit and probe
            "api_key": {"type": "str", "default": "", "no_log": True},
            "firewall": {
                "type": "dict",
                "options": {"port": {"type": "int", "required": True}, "networks": {"type": "list", "elements": "str", "required": True}},
            },
            "secret_environment": {"type": "dict", "default": {}, "no_log": True},
            "shape": {"type": "dict", "default": {}},
            "record_dir": {"type": "path", "required": True},
            "rollback": {"type": "bool", "default": True},
            "restore": {"type": "bool", "default": False},
            "noop_check": {"type": "bool", "default": False},
            "gates": {"type": "dict", "default": {}},
            "generation": {"type": "int", "default": 0},
            "keep_generations": {"type": "int", "default": 3},
            "retire_units": {"type": "list", "elements": "str", "default": []},
            "retire_renamed": {"type": "bool", "default": True},
            "host_units": {"type": "list", "elements": "str"},
            "payload": {
                "type": "dict",
                "options": {
                    "dir": {"type": "path", "required": True},
                    "manifest": {"type": "path", "required": True},
                    "generations": {"type": "int", "default": 0},
                    "keep_rejected": {"type": "int", "default": 2},
                    "purge_approved": {"type": "bool", "default": False},
                    "check_hash": {"type": "bool", "default": False},
                },
            },
        },
        lambda call: check_noop(call.params, call.host) if call.params["noop_check"] else deploy_endpoint(call.params, call.host, call.diff),
    )


if __name__ == "__main__":
    main()
