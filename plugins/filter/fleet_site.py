# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for what follows the endpoints' shapes after a deploy: the endpoints as the inventory
places them, the harness's models.yml fragments, the homepage's files, Prometheus's jobs and rules
and Grafana's dashboards, and the served-id renames the clients must follow. They run on the
controller from the inventory (hostvars), the same source `llm-fleet generate` reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.utils.display import Display

from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.plugin_utils import served_ids
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.fleet_artifacts import (
    EndpointFacts,
    client_fragments,
    exported_series,
    facts_from_hostvars,
    observability_artifacts,
    serialise,
)
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.homepage import HomepageError, site_files

MAX_ENDPOINTS = 1000
# The series each runtime exports (captured /metrics), shipped with the collection.
EXPORTED_DIR = Path(__file__).resolve().parents[2] / "observability" / "exported"
# The fact playbooks/retired_served_ids.yml sets on an endpoint: the ids its retired units served last.
RETIRED_FACT = "__fleet_retired_served_ids"


def fleet_endpoints(names: list[str], hostvars: Any) -> list[dict[str, Any]]:
    """Each endpoint host's facts as plain data: name, address, shape, key variable, description,
    its served id, and the served ids its kept records name (when this run deployed it)."""
    if len(names or []) > MAX_ENDPOINTS:
        raise AnsibleFilterError(f"fleet_endpoints: {len(names)} endpoints; at most {MAX_ENDPOINTS}")
    out = []
    for name in names or []:
        hv = hostvars[name]
        if "endpoint_shape" not in hv:
            raise AnsibleFilterError(f"{name}: endpoint_shape is not set; every host of group llm_endpoints needs one")
        try:
            facts = facts_from_hostvars(name, hv)
            served_id = facts.typed.served_id
        except ShapeError as exc:
            raise AnsibleFilterError(f"{name}: endpoint_shape: {exc}") from None
        deployed = hv.get("__endpoint_deploy") or {}
        kept = [g.get("served_id") for g in deployed.get("generations") or [] if isinstance(g, dict) and g.get("served_id")]
        # A host rename: the new endpoint's records are its own; the ids the clients still hold are
        # those its retired units' records served (playbooks/retired_served_ids.yml reads them).
        kept += [str(i) for i in hv.get(RETIRED_FACT) or [] if isinstance(i, str) and i]
        out.append(
            {
                "name": facts.name,
                "address": facts.address,
                "shape": dict(facts.shape),
                "api_key_env": facts.api_key_env,
                "description": facts.description,
                "served_id": served_id,
                "served_ids_kept": kept,
            }
        )
    return out


def _facts(endpoints: list[dict[str, Any]]) -> list[EndpointFacts]:
    return [
        EndpointFacts(
            name=e["name"], host=e["name"], address=e["address"], shape=e["shape"], api_key_env=e.get("api_key_env", ""), description=e.get("description", "")
        )
        for e in endpoints
    ]


def homepage_site(endpoints: list[dict[str, Any]], services: list[dict[str, Any]] | None = None, title: str = "frank fleet") -> dict[str, str]:
    try:
        return site_files(_facts(endpoints), services, title)
    except (HomepageError, ShapeError) as exc:
        raise AnsibleFilterError(f"homepage: {exc}") from None


def models_fragments(endpoints: list[dict[str, Any]]) -> dict[str, str]:
    try:
        return client_fragments(_facts(endpoints))
    except ShapeError as exc:
        raise AnsibleFilterError(f"client fragments: {exc}") from None


def observability_files(endpoints: list[dict[str, Any]]) -> dict[str, str]:
    """Prometheus's scrape config and alert rules and Grafana's dashboards, by path relative to the
    output directory, byte for byte what `llm-fleet generate` writes there. Fails, writing nothing,
    when a rule or panel names a series its runtime does not export."""
    # Plain data: the YAML writer represents str, not the tagged strings templating hands a filter.
    plain = json.loads(json.dumps(endpoints))
    try:
        artifacts = observability_artifacts(_facts(plain), exported_series(str(EXPORTED_DIR)))
    except (ShapeError, ValueError, KeyError) as exc:
        raise AnsibleFilterError(f"observability: {exc}") from None
    except OSError as exc:
        raise AnsibleFilterError(f"observability: cannot read the exported series ({exc}); reinstall the collection") from None
    if artifacts.problems:
        raise AnsibleFilterError("observability: the series check failed, nothing is written: " + "; ".join(artifacts.problems))
    return {path: serialise(value).decode() for path, value in artifacts.files.items()}


def retired_served_ids(reads: list[dict[str, Any]]) -> list[str]:
    """The served ids the retired units' last records name (the slurp results of
    playbooks/retired_served_ids.yml); a record that cannot be read is named in a warning."""
    ids, notes = served_ids.retired_served_ids(list(reads or []))
    for note in notes:
        Display().warning(f"retired_served_ids: {note}")
    return ids


def served_id_renames(endpoints: list[dict[str, Any]], extra: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
    """old -> new for every id an endpoint's kept records served that it no longer serves (an
    endpoint renamed twice gives two, both to its current id; the re-key moves whichever holds
    rows). An id another endpoint serves now is never renamed away: the id went with its alias
    (seed 001: "Radiance wins every axis, so it takes the alias") and OpenWebUI's rows stay with
    it. `extra` (openwebui_extra_renames) comes first and overrides any computed rename of the
    same old id."""
    extra = [dict(r) for r in extra or []]
    named = {r.get("from") for r in extra}
    serving = {e["served_id"] for e in endpoints}
    renames: list[dict[str, str]] = []
    for endpoint in endpoints:
        for old in dict.fromkeys(endpoint.get("served_ids_kept") or []):
            if old != endpoint["served_id"] and old not in serving and old not in named:
                renames.append({"from": old, "to": endpoint["served_id"]})
    olds = [r["from"] for r in renames]
    twice = sorted({o for o in olds if olds.count(o) > 1})
    if twice:
        raise AnsibleFilterError(
            f"served_id_renames: {', '.join(twice)} was served by more than one endpoint's kept records; "
            "say where its OpenWebUI rows go in openwebui_extra_renames ({from: OLD, to: NEW})"
        )
    return extra + renames


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "fleet_endpoints": fleet_endpoints,
            "homepage_site": homepage_site,
            "models_fragments": models_fragments,
            "served_id_renames": served_id_renames,
            "observability_files": observability_files,
            "retired_served_ids": retired_served_ids,
        }
