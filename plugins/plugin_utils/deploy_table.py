# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy plan without the callback, and the no-op proof's verdict in words.

- `noop_sentence`: what the no-op proof (endpoint_deploy with noop_check) found, as one line: the
  endpoint is a no-op, serving what under which MainPID, or which check sends it down the full path.
  The deploy_plan callback prints it as each proof arrives.
- `deploy_table_from_facts`: the table of deploy_plan.render from what a deploy left on each
  endpoint (the failure kept by roles/endpoint/tasks/fleet_failed.yml, the "not reached" of
  fleet_blocked.yml, the deploy's and the proof's results, the budget's), for a run without the
  callback: playbooks/deploy.yml and deploy_fleet.yml print it themselves, so an installed user reads
  the verdicts with no ansible.cfg line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.plugin_utils.deploy_plan import (
    DOES_NOT_FIT,
    FITS,
    NOT_DEPLOYED,
    NOT_REACHED,
    REFUSED,
    ROLLED_BACK,
    UNCHANGED,
    Row,
    deploy_verdict,
    priced_verdict,
    render,
)

# fleet_failed.yml's words for a failure endpoint_deploy rolled back.
ROLLED_BACK_MARK = "(rolled back to the last-known-good shape)"
GATES_SKIPPED = "the budget, payload and deploy gates are skipped"


def noop_sentence(endpoint: str, result: Mapping[str, Any]) -> str:
    """One line for a no-op proof's result (a proof that could not run says so, with why)."""
    if result.get("noop"):
        health = result.get("health") or {}
        models = ", ".join(str(model) for model in health.get("models") or []) or "its served id"
        return f"{endpoint} is a no-op: serving {models}, healthy under MainPID {result.get('main_pid', 0)}; {GATES_SKIPPED}"
    if result.get("full_path_reason"):
        return f"{endpoint}: full path: {result['full_path_reason']}"
    return f"{endpoint}: full path: the no-op check did not run: {_one_line(result.get('msg')) or 'no reason given'}"


def _registered(facts: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """A registered result that ran (not skipped), else None."""
    value = facts.get(name)
    if not isinstance(value, Mapping) or value.get("skipped"):
        return None
    return value


def _one_line(text: Any) -> str:
    return " ".join(str(text or "").split())


def endpoint_row(host: str, facts: Mapping[str, Any]) -> Row:
    """The verdict of one endpoint from what the run left on it."""
    not_reached = facts.get("__fleet_not_reached")
    if not_reached is not None:
        return Row(host, NOT_REACHED, _one_line(not_reached))
    failure = facts.get("__fleet_failure")
    if failure is not None:
        text = _one_line(failure)
        if ROLLED_BACK_MARK in text:
            return Row(host, ROLLED_BACK, text.replace(ROLLED_BACK_MARK, "").strip())
        return Row(host, REFUSED, text)
    deployed = _registered(facts, "__endpoint_deploy")
    if deployed is not None:
        verdict, detail = deploy_verdict(deployed)
        return Row(host, verdict, detail)
    proof = _registered(facts, "__endpoint_noop")
    if proof is not None and proof.get("noop"):
        return Row(host, UNCHANGED, f"no-op: healthy under MainPID {proof.get('main_pid', 0)}")
    budget = _registered(facts, "__endpoint_budget")
    if budget is not None and "fits" in budget:
        verdict, detail = priced_verdict(budget)
        return Row(host, verdict, detail)
    return Row(host, NOT_DEPLOYED, "no deploy task ran (tags or a condition)")


def deploy_table_from_facts(hosts: list[str], hostvars: Mapping[str, Any], check_mode: bool) -> str:
    """The table for these endpoints; titled a fleet plan when the run only priced (every endpoint
    priced or refused, none deployed or proven), as the callback titles it."""
    rows = [endpoint_row(host, hostvars.get(host) or {}) for host in hosts]
    priced_only = bool(rows) and all(row.verdict in (FITS, DOES_NOT_FIT, REFUSED) for row in rows)
    return render(rows, check_mode, priced_only=priced_only)
