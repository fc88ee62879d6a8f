# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy plan: one verdict per endpoint of a deploy, from the task results the callback
frank.llm_fleet.deploy_plan hands over.

- the endpoint_deploy result: `steps` {engine, unit, probe, record}, each with `changed`, plus
  `rolled_back`; with --diff the record's before/after tells a new endpoint and a runtime swap;
- a failed gate task: vram_budget (budget), hf_payload_gate (payload), the role's preflight
  checks, endpoint_deploy's own gates (digest, ownership, health, probe);
- the vram_budget result of an endpoint nothing else reported on: "fits" (with its tightest
  device) or "does not fit" (a report-only budget), so a fleet plan (playbooks/plan.yml) or a
  `--tags budget` run lists every endpoint it priced;
- the endpoints of the play that got neither: pending when the run stopped before them.

Pure code: the callback is a thin adapter, and tests drive this with synthetic results.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

UNCHANGED = "unchanged"
NEW = "new endpoint (install)"
RESTART = "shape change (restart)"
STARTED = "started"
COSMETIC = "cosmetic change (no restart)"
SWAP = "runtime swap"
REFUSED = "refused by a gate"
ROLLED_BACK = "rolled back"
RESTORED = "restored (last-known-good)"
UNREACHABLE = "unreachable"
PENDING = "pending"
NOT_REACHED = "not reached"
NOT_DEPLOYED = "not deployed"
FITS = "fits"
DOES_NOT_FIT = "does not fit"

# A play's outcome (every play of the run, the companions' included).
PLAY_OK = "ok"
PLAY_CHANGED = "changed"
PLAY_FAILED = "failed"
PLAY_UNREACHABLE = "unreachable"
PLAY_NO_HOSTS = "no hosts"
PLAY_NOT_REACHED = "not reached"

DEPLOY_ACTION = "frank.llm_fleet.endpoint_deploy"
BUDGET_ACTION = "frank.llm_fleet.vram_budget"
MIB = 1 << 20
GATE_OF_ACTION = {
    "frank.llm_fleet.vram_budget": "budget",
    "frank.llm_fleet.hf_payload_gate": "payload",
}
PREFLIGHT_FILE = "preflight.yml"
BUDGET_FILE = "budget.yml"  # its checks besides the module's (a plan refusing a shape it cannot price)
VALIDATE_ACTIONS = ("ansible.builtin.validate_argument_spec", "validate_argument_spec")
# The fleet's own bookkeeping tasks (roles/endpoint/tasks/fleet_*.yml): the failure they record,
# or the run's final verdict, is not a new outcome of the endpoint.
BOOKKEEPING_FILES = ("fleet_failed.yml", "fleet_verdict.yml")
# The fact roles/endpoint/tasks/fleet_blocked.yml sets on an endpoint skipped for a failed dependency.
NOT_REACHED_FACT = "__fleet_not_reached"
# endpoint_deploy's failure results carry the gate's own evidence: the key names the gate.
GATE_OF_DEPLOY_KEY = (("expected_digest", "digest"), ("foreign_pid", "ownership"), ("health", "health"))
PROBE_MESSAGES = ("smoke probe", "tool-call probe", "image probe")
DETAIL_CHARS = 200


@dataclass(frozen=True)
class Row:
    endpoint: str
    verdict: str
    detail: str = ""


def _first_line(message: Any) -> str:
    text = str(message or "").strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= DETAIL_CHARS else line[: DETAIL_CHARS - 3] + "..."


def failure_detail(action: str, result: Mapping[str, Any]) -> str:
    """The failure's message; an argument validation names every field it refused (its first line
    alone reads "Validation of arguments failed:")."""
    errors = result.get("argument_errors")
    if isinstance(errors, list) and errors:
        text = "; ".join(" ".join(str(error).split()) for error in errors)
        return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."
    lines = [line.strip() for line in str(result.get("msg") or "").strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return _first_line(" ".join(lines[:3]))
    return _first_line(result.get("msg"))


def _record_shapes(record_step: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The record before and after, from its diff (only with --diff); None where unknown or absent."""
    diff = record_step.get("diff")
    if not isinstance(diff, Mapping):
        return None, None

    def parsed(text: Any) -> dict[str, Any] | None:
        try:
            value = json.loads(text) if text else None
        except (TypeError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    return parsed(diff.get("before")), parsed(diff.get("after"))


def _launch(record: Mapping[str, Any]) -> str:
    shape = record.get("shape") or {}
    unit = record.get("unit") or {}
    return f"{shape.get('runtime', '?')}/{shape.get('launch', '?')} {unit.get('name', '?')}"


def deploy_verdict(result: Mapping[str, Any]) -> tuple[str, str]:
    """The verdict of a passed endpoint_deploy task, and its detail."""
    if result.get("restored"):
        return RESTORED, ""
    steps = result.get("steps") or {}
    names = ("retire", "firewall", "engine", "unit", "probe", "record")
    changed = [name for name in names if isinstance(steps.get(name), Mapping) and steps[name].get("changed")]
    if not changed:
        return UNCHANGED, ""
    detail = "changed: " + ", ".join(changed)
    unit = steps.get("unit") or {}
    drain = unit.get("drain")
    if isinstance(drain, Mapping) and drain.get("outcome") not in (None, "idle"):
        detail += f"; drain {drain.get('outcome')}" + (f", {drain.get('cut')} cut" if drain.get("cut") else "")
    retire = steps.get("retire") or {}
    retired = [u.get("unit") for u in retire.get("units") or [] if isinstance(u, Mapping) and u.get("changed")]
    if retired:
        detail += "; retired " + ", ".join(str(u) for u in retired)
    before, after = _record_shapes(steps.get("record") or {})
    diff = (steps.get("record") or {}).get("diff")
    if isinstance(diff, Mapping) and not diff.get("before"):
        return NEW, detail
    # endpoint_deploy names a swap itself (steps.retire.swap); with --diff the record shows one too.
    if retire.get("swap"):
        return SWAP, f"{retire['swap']} (old unit archived); {detail}"
    if before is not None and after is not None and _launch(before) != _launch(after):
        return SWAP, f"{_launch(before)} -> {_launch(after)}; {detail}"
    # The unit step names a start of a stopped (or failed) unit whose file and env file were already
    # what the shape renders: nothing about the shape changed.
    if unit.get("started_from") and changed == ["unit"]:
        return STARTED, f"the unit was {unit['started_from']}; shape unchanged"
    # The unit step says when a change was documentation only (rewritten and reloaded, no restart);
    # any other change of the unit or its env file restarts the engine.
    if unit.get("changed") and not unit.get("cosmetic"):
        return RESTART, detail
    return COSMETIC, detail


def priced_verdict(result: Mapping[str, Any]) -> tuple[str, str]:
    """The verdict of a passed vram_budget task: fits or not, the tightest device's figures, the
    first failed rule, and whether the payload identity was checked."""
    devices = [d for d in result.get("ledger") or [] if isinstance(d, Mapping)]
    parts = []
    if devices:
        tight = min(devices, key=lambda d: d.get("free_bytes", 0))
        used, capacity, free = (float(tight.get(key) or 0) / MIB for key in ("used_bytes", "capacity_bytes", "free_bytes"))
        parts.append(f"{tight.get('device')}: {used:,.1f} of {capacity:,.1f} MiB, {free:,.1f} free")
    fits = bool(result.get("fits"))
    if not fits:
        failed = [r for r in result.get("rules") or [] if isinstance(r, Mapping) and not r.get("ok")]
        if failed:
            parts.insert(0, f"{failed[0].get('rule')}: {failed[0].get('message')}")
    identity = result.get("payload_identity") or {}
    parts.append("payload identity " + ("checked" if identity.get("checked") else "not checked"))
    return (FITS if fits else DOES_NOT_FIT), _first_line("; ".join(parts))


def failure_gate(action: str, task_path: str, task_name: str, result: Mapping[str, Any]) -> str:
    """Which gate a failed task is."""
    if action in GATE_OF_ACTION:
        return GATE_OF_ACTION[action]
    if action in VALIDATE_ACTIONS:
        return "argument_specs"
    if action == DEPLOY_ACTION:
        for key, gate in GATE_OF_DEPLOY_KEY:
            if key in result:
                return gate
        if str(result.get("msg", "")).startswith(PROBE_MESSAGES):
            return "probe"
        return "deploy"
    if task_path.split(":", 1)[0].endswith("/" + PREFLIGHT_FILE):
        return "preflight"
    if task_path.split(":", 1)[0].endswith("/" + BUDGET_FILE):
        return "budget"
    return task_name.split(" : ", 1)[-1]  # without the "ROLE : " prefix


def _is_bookkeeping(task_path: str) -> bool:
    return task_path.split(":", 1)[0].endswith(tuple("/" + name for name in BOOKKEEPING_FILES))


@dataclass
class PlayOutcome:
    """What one play did: its hosts' failures (first one kept as the detail), unreachables, changes."""

    name: str
    started: bool = False
    no_hosts: bool = False
    changed: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)

    def row(self) -> Row:
        if not self.started:
            return Row(self.name, PLAY_NOT_REACHED, "the run stopped before this play")
        if self.no_hosts:
            return Row(self.name, PLAY_NO_HOSTS, "")
        if self.failed:
            return Row(self.name, PLAY_FAILED, "; ".join(f"{host}: {why}" for host, why in self.failed.items()))
        if self.unreachable:
            return Row(self.name, PLAY_UNREACHABLE, "; ".join(f"{host}: {why}" for host, why in self.unreachable.items()))
        if self.changed:
            return Row(self.name, PLAY_CHANGED, ", ".join(sorted(self.changed)))
        return Row(self.name, PLAY_OK, "")


class DeployPlan:
    """Endpoints in play order, and what the run did (or, in check mode, would do) to each; and
    every play of the run with its outcome."""

    def __init__(self) -> None:
        self.endpoints: list[str] = []
        self.outcomes: dict[str, Row] = {}
        self.stopped_at: str | None = None
        self.plays: dict[str, PlayOutcome] = {}
        self.current_play: str | None = None
        self.deploys = 0

    def expect(self, endpoints: list[str]) -> None:
        for name in endpoints:
            if name not in self.endpoints:
                self.endpoints.append(name)

    # --- plays ---------------------------------------------------------------------------------

    def expect_plays(self, plays: list[tuple[str, str]]) -> None:
        """(key, name) of every play of the playbook, in order, before any runs."""
        for key, name in plays:
            self.plays.setdefault(key, PlayOutcome(name))

    def play_started(self, key: str, name: str) -> None:
        outcome = self.plays.setdefault(key, PlayOutcome(name))
        outcome.name, outcome.started, outcome.no_hosts = name or outcome.name, True, False
        self.current_play = key

    def play_had_no_hosts(self) -> None:
        if self.current_play in self.plays and not self._play().changed and not self._play().failed:
            self._play().no_hosts = True

    def _play(self) -> PlayOutcome:
        return self.plays.setdefault(self.current_play or "", PlayOutcome("(play)", started=True))

    def task_ok(self, host: str, changed: bool) -> None:
        if self.current_play is not None and changed:
            self._play().changed.add(host)

    def task_failed(self, host: str, task_path: str, task_name: str, action: str, result: Mapping[str, Any]) -> None:
        if self.current_play is None:
            return
        why = failure_detail(action, result)
        if _is_bookkeeping(task_path):
            why = _first_line(result.get("msg"))
        self._play().failed.setdefault(host, f"{task_name.split(' : ', 1)[-1]}: {why}")

    def task_unreachable(self, host: str, result: Mapping[str, Any]) -> None:
        if self.current_play is not None:
            self._play().unreachable.setdefault(host, _first_line(result.get("msg")))

    # --- endpoints -----------------------------------------------------------------------------

    def priced(self, endpoint: str, result: Mapping[str, Any]) -> None:
        """A budget that passed: the endpoint's verdict until a later task of the run says more."""
        self.expect([endpoint])
        if endpoint not in self.outcomes:
            verdict, detail = priced_verdict(result)
            self.outcomes[endpoint] = Row(endpoint, verdict, detail)

    def priced_only(self) -> bool:
        """Whether the run only priced (a fleet plan, a `--tags budget` run): every endpoint reached
        and priced or refused, nothing deployed, no task changed anything."""
        reached = all(row.verdict not in (PENDING, NOT_DEPLOYED) for row in self.rows())
        return reached and not self.deploys and not any(play.changed for play in self.plays.values())

    def deployed(self, endpoint: str, result: Mapping[str, Any]) -> None:
        self.deploys += 1
        self.expect([endpoint])
        verdict, detail = deploy_verdict(result)
        self.outcomes[endpoint] = Row(endpoint, verdict, detail)

    def not_reached(self, endpoint: str, why: str) -> None:
        """The fleet skipped the endpoint on purpose (a dependency of it failed)."""
        self.expect([endpoint])
        self.outcomes[endpoint] = Row(endpoint, NOT_REACHED, _first_line(why))

    def failed(self, endpoint: str, action: str, task_path: str, task_name: str, result: Mapping[str, Any]) -> None:
        if _is_bookkeeping(task_path):
            return
        self.expect([endpoint])
        gate = failure_gate(action, task_path, task_name, result)
        why = failure_detail(action, result)
        if action == DEPLOY_ACTION and result.get("rolled_back"):
            self.outcomes[endpoint] = Row(endpoint, ROLLED_BACK, f"{gate}: {why}")
        else:
            self.outcomes[endpoint] = Row(endpoint, f"{REFUSED} ({gate})", why)
        self.stopped_at = self.stopped_at or endpoint

    def unreachable(self, endpoint: str, result: Mapping[str, Any]) -> None:
        self.expect([endpoint])
        self.outcomes[endpoint] = Row(endpoint, UNREACHABLE, _first_line(result.get("msg")))
        self.stopped_at = self.stopped_at or endpoint

    def rows(self) -> list[Row]:
        """One row per endpoint; those without an outcome are pending when the run stopped first."""
        rows = []
        for name in self.endpoints:
            if name in self.outcomes:
                rows.append(self.outcomes[name])
            elif self.stopped_at is not None:
                rows.append(Row(name, PENDING, f"never reached: the run stopped at {self.stopped_at}"))
            else:
                rows.append(Row(name, NOT_DEPLOYED, "no deploy task ran (tags or a condition)"))
        return rows

    def play_rows(self) -> list[Row]:
        return [outcome.row() for outcome in self.plays.values()]

    def has_news(self) -> bool:
        """Whether the run deployed or refused anything: other playbooks print no plan."""
        return bool(self.outcomes)


def _table(header: Row, rows: list[Row]) -> list[str]:
    width_name = max(len(row.endpoint) for row in [header, *rows])
    width_verdict = max(len(row.verdict) for row in [header, *rows])
    return [f"{row.endpoint:<{width_name}}  {row.verdict:<{width_verdict}}  {row.detail}".rstrip() for row in [header, *rows]]


def _counts(rows: list[Row]) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    return ", ".join(f"{count} {verdict}" for verdict, count in counts.items())


def render(rows: list[Row], check_mode: bool, plays: list[Row] | None = None, priced_only: bool = False) -> str:
    """The table, with a count per verdict under it; then every play's outcome, when given."""
    title = "Deploy plan (check mode: nothing was changed)" if check_mode else "Deploy result"
    if priced_only:
        title = "Fleet plan (priced only: nothing was changed)"
    lines = [title, "", *_table(Row("endpoint", "verdict", "detail"), rows), "", _counts(rows)]
    if plays:
        lines += ["", *_table(Row("play", "outcome", "detail"), plays), "", _counts(plays)]
    return "\n".join(lines)


def plan_table_from_facts(hosts: list[str], hostvars: Mapping[str, Any]) -> str:
    """The fleet plan's table built from what the plan left on each endpoint (the kept refusal of
    roles/endpoint/tasks/fleet_failed.yml, the budget task's result), for a run without this
    collection's callback: playbooks/plan.yml prints it itself, so an installed user needs no
    ansible.cfg line to read the verdicts."""
    rows = []
    for host in hosts:
        facts = hostvars.get(host) or {}
        failure = facts.get("__fleet_failure")
        budget = facts.get("__endpoint_budget")
        if failure is not None:
            rows.append(Row(host, REFUSED, _first_line(" ".join(str(failure).split()))))
        elif isinstance(budget, Mapping) and "fits" in budget:
            verdict, detail = priced_verdict(budget)
            rows.append(Row(host, verdict, detail))
        else:
            rows.append(Row(host, NOT_REACHED, "not priced in this run"))
    return render(rows, check_mode=False, priced_only=True)
