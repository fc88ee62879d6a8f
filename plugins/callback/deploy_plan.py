# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: deploy_plan
type: aggregate
short_description: One table at the end of a deploy - per endpoint, unchanged, restart, cosmetic, swap, refused, rolled back or pending
version_added: 0.3.0
description:
  - At the end of a run of C(playbooks/deploy.yml) (or C(deploy_fleet.yml), C(deploy_primary.yml), ...)
    prints one row per endpoint of the play, with one of these verdicts - "unchanged";
    "new endpoint (install)"; "shape change (restart)"; "cosmetic change (no restart)";
    "runtime swap" (with --diff, where the last-known-good record's before and after name the old
    and new runtime, launch and unit); "refused by a gate (GATE)" with the gate's message (GATE is
    budget, payload, preflight, digest, ownership, health or probe); "rolled back" (the new shape
    failed, the last-known-good one serves again); "unreachable"; and "pending" for every endpoint
    the run never reached because it stopped at an earlier one; "started" (a stopped or failed unit
    started again, its shape unchanged); "not reached" (the fleet skipped it, because an endpoint
    it depends on failed).
  - Under the endpoints, every play of the run (the companions' included) with its outcome - ok,
    changed, failed (each failed host with the task and its message), unreachable, no hosts, or
    not reached (the run stopped before the play). A failed argument validation names the fields.
  - With C(--check --diff) the table is the deploy plan - what the real run would do - and
    nothing changes.
  - As each endpoint's no-op proof (endpoint_deploy with noop_check) arrives, one line says what it
    found - "NAME is a no-op - serving ID, healthy under MainPID N; the budget, payload and deploy
    gates are skipped", or "NAME - full path - CHECK - why".
  - The verdicts come from the endpoint_deploy task's result (C(steps) engine, unit, probe, record,
    each with C(changed); C(rolled_back)) and from the failed gate tasks. A changed unit step is a
    restart unless it reports C(restarted) false; a change of the engine's env file or the record
    alone is cosmetic. An endpoint a finished run deployed nothing to (C(--tags)) is "not deployed".
    An endpoint whose budget passed and that nothing later reported on reads "fits" (its tightest
    device's used, capacity and free MiB, and whether the payload identity was checked) or "does not
    fit" (a report-only budget). A run that only priced - the fleet plan C(playbooks/plan.yml), or
    C(--tags budget) - is titled "Fleet plan". A run that prices, deploys and refuses nothing (a
    probe, a bench) prints no table.
  - Not printed when the stdout callback writes JSON (the table would break the document).
  - Enable it in ansible.cfg - C(callbacks_enabled = frank.llm_fleet.deploy_plan) - or with
    C(ANSIBLE_CALLBACKS_ENABLED=frank.llm_fleet.deploy_plan).
author:
  - frank.llm_fleet maintainers (@frank-ops)
requirements:
  - enable in configuration
"""

import contextlib
from typing import Any

from ansible import constants as C
from ansible import context
from ansible.plugins.callback import CallbackBase

from ansible_collections.frank.llm_fleet.plugins.module_utils.host import budget_gate  # noqa: F401  # pylint: disable=unused-import
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.deploy_plan import BUDGET_ACTION, DEPLOY_ACTION, NOT_REACHED_FACT, DeployPlan, render
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.deploy_table import noop_sentence
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.endpoint_preflight import load_role_spec

# budget_gate (and through it the shape parser and every runtime driver) is imported here, in
# Ansible's main process, before any task's worker process forks from it: the shape filters and
# the budget on the controller find it imported in every worker instead of importing it again per
# task and endpoint (the production fleet plan: 1.79 CPU seconds against 2.08; docs/bench.md).
# The same for the preflight's checks and the role's argument spec they read (the action reads it
# itself where this fails).
with contextlib.suppress(OSError, ValueError):
    load_role_spec()

ENDPOINT_GROUP = "llm_endpoints"


def _json_stdout() -> bool:
    """Whether the stdout callback writes JSON (a line of this callback's would break the document)."""
    return "json" in str(C.config.get_config_value("DEFAULT_STDOUT_CALLBACK"))


def _is_endpoint(host: Any) -> bool:
    return ENDPOINT_GROUP in [group.name for group in host.get_groups()]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "frank.llm_fleet.deploy_plan"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = DeployPlan()

    def v2_playbook_on_start(self, playbook: Any) -> None:
        # Every play of the run (imports expanded), so a play the run never reached is listed too.
        try:
            plays = playbook.get_plays()
        except AttributeError:
            return
        self.plan.expect_plays([(str(play._uuid), play.get_name()) for play in plays])

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self.plan.play_started(str(getattr(play, "_uuid", id(play))), play.get_name())
        # Every endpoint the play will walk, so the ones a stopped run never reaches are listed too.
        inventory = getattr(play.get_variable_manager(), "_inventory", None)
        if inventory is None:
            return
        hosts = inventory.get_hosts(play.hosts, order=play.order)
        self.plan.expect([host.name for host in hosts if _is_endpoint(host)])

    def v2_playbook_on_no_hosts_matched(self) -> None:
        self.plan.play_had_no_hosts()

    def v2_runner_on_ok(self, result: Any) -> None:
        task = result.task
        name = result.host.get_name()
        self.plan.task_ok(name, bool(result.result.get("changed")))
        if task.resolved_action == DEPLOY_ACTION and not task.args.get("restore"):
            self.plan.deployed(name, result.result)
            # The no-op proof's verdict, as it arrives (the role prints no line of its own).
            if (task.args.get("noop_check") is True or "noop" in result.result) and not _json_stdout():
                self._display.display(noop_sentence(name, result.result))
        if task.resolved_action == BUDGET_ACTION and _is_endpoint(result.host):
            self.plan.priced(name, result.result)
        why = (result.result.get("ansible_facts") or {}).get(NOT_REACHED_FACT)
        if why and _is_endpoint(result.host):
            self.plan.not_reached(name, str(why))

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if ignore_errors:
            return
        task = result.task
        action = task.resolved_action or task.action
        self.plan.task_failed(result.host.get_name(), task.get_path() or "", task.get_name(), action, result.result)
        if _is_endpoint(result.host):
            self.plan.failed(result.host.get_name(), action, task.get_path() or "", task.get_name(), result.result)

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self.plan.task_unreachable(result.host.get_name(), result.result)
        if _is_endpoint(result.host):
            self.plan.unreachable(result.host.get_name(), result.result)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        if not self.plan.has_news() or _json_stdout():
            return
        priced_only = self.plan.priced_only()
        self._display.banner("FLEET PLAN" if priced_only else "DEPLOY PLAN" if context.CLIARGS.get("check") else "DEPLOY RESULT")
        self._display.display(render(self.plan.rows(), bool(context.CLIARGS.get("check")), self.plan.play_rows(), priced_only))
