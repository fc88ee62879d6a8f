# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy plan: one verdict per endpoint of a deploy, from the task results the callback
frank.llm_fleet.deploy_plan hands over.

- the endpoint_deploy result: `steps` {engine, unit, probe, record}, each with `changed`, plus
  `rolled_back`; with --diff the record's before/after tells a new endpoint and a runtime swap;
- a failed gate task: vram_budget (budget), hf_payload_gate (payload), the role's preflight
  checks, endpoint_deploy's own gates (digest, ownership, health, probe);
- the endpoints of the play that got neither: pending when the run stopped before them.

Pure code: the callback is a thin adapter, and tests drive this with synthetic results.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

UNCHANGED = "unchanged"
NEW = "new endpoint (install)"
RESTART = "shape change (restart)"
COSMETIC = "cosmetic change (no restart)"
SWAP = "runtime swap"
REFUSED = "refused by a gate"
ROLLED_BACK = "rolled back"
RESTORED = "restored (last-known-good)"
UNREACHABLE = "unreachable"
PENDING = "pending"
NOT_DEPLOYED = "not deployed"

DEPLOY_ACTION = "frank.llm_fleet.endpoint_deploy"
GATE_OF_ACTION = {
    "frank.llm_fleet.vram_budget": "budget",
    "frank.llm_fleet.hf_payload_gate": "payload",
}
PREFLIGHT_FILE = "preflight.yml"
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
    # The unit step says when a change was documentation only (rewritten and reloaded, no restart);
    # any other change of the unit or its env file restarts the engine.
    if unit.get("changed") and not unit.get("cosmetic"):
        return RESTART, detail
    return COSMETIC, detail


def failure_gate(action: str, task_path: str, task_name: str, result: Mapping[str, Any]) -> str:
    """Which gate a failed task is."""
    if action in GATE_OF_ACTION:
        return GATE_OF_ACTION[action]
    if action == DEPLOY_ACTION:
        for key, gate in GATE_OF_DEPLOY_KEY:
            if key in result:
                return gate
        if str(result.get("msg", "")).startswith(PROBE_MESSAGES):
            return "probe"
        return "deploy"
    if task_path.split(":", 1)[0].endswith("/" + PREFLIGHT_FILE):
        return "preflight"
    return task_name.split(" : ", 1)[-1]  # without the "ROLE : " prefix


class DeployPlan:
    """Endpoints in play order, and what the run did (or, in check mode, would do) to each."""

    def __init__(self) -> None:
        self.endpoints: list[str] = []
        self.outcomes: dict[str, Row] = {}
        self.stopped_at: str | None = None

    def expect(self, endpoints: list[str]) -> None:
        for name in endpoints:
            if name not in self.endpoints:
                self.endpoints.append(name)

    def deployed(self, endpoint: str, result: Mapping[str, Any]) -> None:
        self.expect([endpoint])
        verdict, detail = deploy_verdict(result)
        self.outcomes[endpoint] = Row(endpoint, verdict, detail)

    def failed(self, endpoint: str, action: str, task_path: str, task_name: str, result: Mapping[str, Any]) -> None:
        self.expect([endpoint])
        gate = failure_gate(action, task_path, task_name, result)
        why = _first_line(result.get("msg"))
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

    def has_news(self) -> bool:
        """Whether the run deployed or refused anything: other playbooks print no plan."""
        return bool(self.outcomes)


def render(rows: list[Row], check_mode: bool) -> str:
    """The table, with a count per verdict under it."""
    title = "Deploy plan (check mode: nothing was changed)" if check_mode else "Deploy result"
    header = Row("endpoint", "verdict", "detail")
    width_name = max(len(row.endpoint) for row in [header, *rows])
    width_verdict = max(len(row.verdict) for row in [header, *rows])
    lines = [title, ""]
    for row in [header, *rows]:
        lines.append(f"{row.endpoint:<{width_name}}  {row.verdict:<{width_verdict}}  {row.detail}".rstrip())
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    lines += ["", ", ".join(f"{count} {verdict}" for verdict, count in counts.items())]
    return "\n".join(lines)
