# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Observability generated from the shape: Prometheus scrape jobs and alert rules, Grafana
dashboards, and the check that every series they name is one the runtime really exports.

A runtime's exported series come from a captured /metrics exposition (observability/series/),
not from memory: the llama.cpp list is the lab llama-server's own /metrics, and the check fails
on any rule or panel that names a series outside the list of the runtime actually deployed.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.base import AlertRule, Panel
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import DRIVERS, driver
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import Shape

# Series every runtime has: Prometheus' own `up`, and the unit facts the machine's textfile timer
# writes (plugins/module_utils/host/unit_metrics_writer.py) for node_exporter to serve.
UNIT_SERIES = frozenset({"llm_fleet_unit_restarts_total", "llm_fleet_unit_active", "llm_fleet_unit_start_time_seconds"})
SYNTHETIC_SERIES = frozenset({"up"})

PROMQL_KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "inf", "nan"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_BRACES = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def series_in_expr(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords and labels excluded)."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in PROMQL_KEYWORDS:
            continue
        names.add(name)
    return names


def unexported(exprs: list[str], exported: set[str]) -> list[str]:
    """The series the expressions name that neither the runtime nor every host exports, sorted."""
    named = set().union(*(series_in_expr(expr) for expr in exprs))
    return sorted(named - exported - UNIT_SERIES - SYNTHETIC_SERIES)


def series_from_exposition(text: str) -> set[str]:
    """Every series name a /metrics exposition lets PromQL select: sample names, plus the names a
    declared type implies before its first sample appears (counters' _total, histograms' parts)."""
    names: set[str] = set()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) < 4:
                continue
            name, kind = parts[2], parts[3]
            if kind == "counter":
                names.add(name if name.endswith("_total") else f"{name}_total")
            elif kind in ("histogram", "summary"):
                names.update({f"{name}_count", f"{name}_sum"} | ({f"{name}_bucket"} if kind == "histogram" else {name}))
            else:
                names.add(name)
            continue
        if line.startswith("#"):
            continue
        names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


# Alert rules every endpoint gets; each runtime adds its own, in its own namespace
# (runtimes/<name>.py `alert_rules`). The generator keeps a rule only when every series it names
# is exported, and says which it dropped.
COMMON_RULES = (
    AlertRule("EndpointDown", "up{sel} == 0", "2m", "critical", "{name} does not answer /metrics: the endpoint is down"),
    AlertRule(
        "UnitCrashLooping",
        'increase(llm_fleet_unit_restarts_total{{unit="{unit}"}}[15m]) > 2',
        "0m",
        "critical",
        "{name}: systemd restarted {unit} more than twice in 15 minutes",
    ),
    AlertRule("UnitNotActive", 'llm_fleet_unit_active{{unit="{unit}"}} == 0', "2m", "critical", "{name}: {unit} is not active"),
)


def unit_name(endpoint: str) -> str:
    return f"{endpoint}.service"


def alert_group(endpoint: str, shape: Shape, exported: set[str]) -> tuple[dict[str, Any], list[str]]:
    """(one Prometheus rule group for the endpoint, notes on rules left out and why)."""
    runtime = shape.runtime
    selector = f'{{job="{endpoint}"}}'
    rules, notes = [], []
    for spec in COMMON_RULES + driver(runtime).alert_rules:
        if spec.when and not getattr(shape, spec.when):
            continue
        expr = spec.expr.format(sel=selector, unit=unit_name(endpoint))
        missing = unexported([expr], exported)
        if missing:
            notes.append(f"{endpoint}: {spec.alert} left out: {runtime} does not export {', '.join(missing)}")
            continue
        rules.append(
            {
                "alert": f"{_camel(endpoint)}{spec.alert}",
                "expr": expr,
                "for": spec.duration,
                "labels": {"severity": spec.severity, "endpoint": endpoint, "runtime": runtime},
                "annotations": {"summary": spec.summary.format(name=endpoint, unit=unit_name(endpoint))},
            }
        )
    return {"name": f"llm-fleet-{endpoint}", "rules": rules}, notes


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[-_]", name))


# Where Prometheus reads a keyed endpoint's key: relative to prometheus.yml (Prometheus resolves it
# so), staged there by the operator, mode 0600, never generated.
KEY_FILE_DIR = "keys"


def scrape_job(endpoint: str, shape: Shape, address: str, keyed: bool = False) -> dict[str, Any]:
    """The endpoint's own /metrics. A runtime whose engine guards /metrics with its API key
    (llama-server; vLLM guards only /v1) is scraped, when keyed, with the key from a file, never
    with the key in this config."""
    job: dict[str, Any] = {
        "job_name": endpoint,
        "metrics_path": "/metrics",
        "static_configs": [{"targets": [f"{address}:{shape.port}"], "labels": {"endpoint": endpoint, "runtime": shape.runtime}}],
    }
    if keyed and driver(shape.runtime).metrics_need_key:
        job["authorization"] = {"type": "Bearer", "credentials_file": f"{KEY_FILE_DIR}/{endpoint}.key"}
    return job


def node_job(addresses: list[str], port: int = 9100) -> dict[str, Any]:
    """node_exporter on the endpoint hosts: it serves the unit facts from the textfile directory."""
    return {"job_name": "llm-fleet-node", "static_configs": [{"targets": sorted(f"{a}:{port}" for a in set(addresses))}]}


def check_rule_groups(groups: list[dict[str, Any]], exported_by_runtime: dict[str, set[str]]) -> list[str]:
    """Problems: every rule's series must be exported by the runtime its labels name."""
    problems = []
    for group in groups:
        for rule in group.get("rules", []):
            runtime = (rule.get("labels") or {}).get("runtime")
            if runtime not in exported_by_runtime:
                problems.append(f"{group['name']}/{rule.get('alert')}: no exported series list for runtime {runtime!r}")
                continue
            missing = unexported([rule["expr"]], exported_by_runtime[runtime])
            if missing:
                problems.append(f"{group['name']}/{rule.get('alert')}: names series {runtime} does not export: {', '.join(missing)}")
    return problems


# --- Grafana ----------------------------------------------------------------------------------

# Panels every runtime's dashboard opens with; each runtime adds its own (runtimes/<name>.py
# `panels`). {sel} selects the dashboard's chosen endpoints.
COMMON_PANELS = (
    Panel("Up", (("up{sel}", "{{job}}"),)),
    Panel("Unit restarts (15m)", (('increase(llm_fleet_unit_restarts_total{unit=~"$endpoint.service"}[15m])', "{{unit}}"),)),
)


def dashboard(runtime: str, endpoints: list[str], exported: set[str]) -> tuple[dict[str, Any], list[str]]:
    """A Grafana dashboard for the endpoints of one runtime: panels only for exported series."""
    if runtime not in DRIVERS:
        raise ValueError(f"runtime: expected one of {', '.join(DRIVERS)}, got {runtime!r}")
    selector = '{job=~"$endpoint"}'
    panels: list[dict[str, Any]] = []
    notes = []
    for title, queries, unit in ((panel.title, panel.queries, panel.unit) for panel in COMMON_PANELS + DRIVERS[runtime].panels):
        targets = [{"expr": expr.replace("{sel}", selector), "legendFormat": legend, "refId": chr(ord("A") + i)} for i, (expr, legend) in enumerate(queries)]
        missing = unexported([t["expr"] for t in targets], exported)
        if missing:
            notes.append(f"{runtime} dashboard: panel {title!r} left out: not exported: {', '.join(missing)}")
            continue
        index = len(panels)
        panels.append(
            {
                "id": index + 1,
                "type": "timeseries",
                "title": title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": (index % 2) * 12, "y": (index // 2) * 8},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": targets,
            }
        )
    board = {
        "title": f"frank.llm_fleet - {runtime} endpoints",
        "uid": f"llm-fleet-{runtime}",
        "tags": ["llm-fleet", runtime],
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "endpoint",
                    "type": "custom",
                    "label": "Endpoint",
                    "multi": True,
                    "includeAll": True,
                    "query": ",".join(sorted(endpoints)),
                    "current": {"text": "All", "value": "$__all"},
                    "options": [{"text": name, "value": name, "selected": False} for name in sorted(endpoints)],
                },
            ]
        },
        "panels": panels,
    }
    return board, notes


def check_dashboard(board: dict[str, Any], runtime: str, exported: set[str]) -> list[str]:
    problems = []
    for panel in board.get("panels", []):
        for target in panel.get("targets", []):
            missing = unexported([target["expr"]], exported)
            if missing:
                problems.append(f"{board.get('uid')}/{panel.get('title')}: names series {runtime} does not export: {', '.join(missing)}")
    return problems
