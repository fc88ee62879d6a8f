"""The operator CLI's views of what the playbooks decide: where qualify.yml leaves its results, the
budget gate's payload identity, and pricing from the Hub before the download.

Each follows the role that decides it in the play, reading the same variables, so `llm-fleet` and
the playbook answer alike: roles/qualify/defaults/main.yml (qualify_results_dir, rendered here by
Ansible's own templating), roles/endpoint/tasks/budget.yml (the manifest the gate checks) and
roles/endpoint/tasks/hub_geometry.yml (when the Hub is read, which repo and revision).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.budget_gate import identity_result
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient, HubError
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_pricing import HubPricing, HubPricingError, fill_shape, price_from_hub
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape, prices_on_controller
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.module_utils.step_error import StepError
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.user_errors import InputError, identity_problem_text, is_vaulted

ROOT = Path(__file__).resolve().parents[2]
QUALIFY_DEFAULTS = ROOT / "roles" / "qualify" / "defaults" / "main.yml"
RESULTS_DIR_VAR = "qualify_results_dir"
# The variables the results directory's rule reads (besides inventory_dir), which must be paths.
RESULTS_DIR_INPUTS = (RESULTS_DIR_VAR, "llm_fleet_qualify_dir", "llm_fleet_bench_dir")


def inventory_dir_of(inventory: str) -> str:
    """Ansible's inventory_dir for an inventory source: the directory itself, or a file's directory."""
    path = Path(inventory)
    return str(path if path.is_dir() else path.parent)


def _render(expression: str, hostvars: dict[str, Any], inventory_dir: str, needs: str) -> Any:
    """`expression` templated by Ansible as the play templates it, with the host's variables and
    inventory_dir. ImportError (no Ansible in this Python) and Ansible's own errors propagate;
    `needs` says what the rendering is for, in the message when Ansible is missing."""
    try:
        from ansible.parsing.dataloader import DataLoader
        from ansible.plugins.loader import init_plugin_loader
        from ansible.template import Templar
        from ansible.utils.collection_loader import AnsibleCollectionConfig
    except ImportError:
        raise InputError(f"{needs} is rendered by Ansible: run llm-fleet with the Python that runs Ansible") from None
    if AnsibleCollectionConfig.collection_finder is None:
        # As ansible's own commands do first: lookups and filters (ansible.builtin.file, from_yaml)
        # are found through the collection loader.
        init_plugin_loader()
    try:
        from ansible.template import trust_as_template  # ansible-core 2.19+: only trusted text is a template
    except ImportError:

        def trust_as_template(value: str) -> str:
            return value

    # Every host variable, as the play has them (a value may be built from another), but the vaulted
    # ones: the budget reads no secret, and an expression naming one fails as undefined.
    plain = {name: value for name, value in hostvars.items() if not is_vaulted(value)}
    variables = {name: trust_as_template(value) if isinstance(value, str) else value for name, value in plain.items()}
    variables["inventory_dir"] = inventory_dir
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(str(expression)))


def qualify_results_dir(hostvars: dict[str, Any], inventory_dir: str) -> str:
    """The endpoint's qualify_results_dir as the play renders it: its own setting, else the role's
    default rule, templated by Ansible with the host's variables and inventory_dir."""
    expression = hostvars.get(RESULTS_DIR_VAR)
    if expression is None:
        with open(QUALIFY_DEFAULTS, encoding="utf-8") as handle:
            expression = yaml.safe_load(handle)[RESULTS_DIR_VAR]
    for name in RESULTS_DIR_INPUTS:
        value = hostvars.get(name, "")
        if is_vaulted(value) or not isinstance(value, str):
            raise InputError(f"{name} is {'vaulted' if is_vaulted(value) else type(value).__name__}; write the directory as a path in the clear, or give --dir")
    try:
        rendered = _render(str(expression), hostvars, inventory_dir, "the qualify results directory (or give --dir)")
    except InputError:
        raise
    except Exception as exc:  # Ansible's template errors have no common public base across versions
        raise InputError(f"{RESULTS_DIR_VAR}: cannot render {expression!r} ({exc}); set llm_fleet_qualify_dir to a path, or give --dir") from None
    return os.path.normpath(str(rendered).strip())


def with_rendered_manifest(hostvars: dict[str, Any], inventory_dir: str | None, where: str) -> dict[str, Any]:
    """The host's variables with endpoint_payload_manifest as the play reads it: a template (the
    form docs/plan.md gives, a manifest kept beside the inventory and read with a file lookup) is
    rendered with the host's variables and inventory_dir, so the budget checks the same manifest
    the play's budget gate checks. `where` names the file or host it was set in."""
    value = hostvars.get("endpoint_payload_manifest")
    if not isinstance(value, str) or ("{{" not in value and "{%" not in value):
        return hostvars
    if inventory_dir is None:
        raise InputError(f"{where}: endpoint_payload_manifest is a template ({value}); give -i INVENTORY so inventory_dir is known, or --manifest FILE")
    try:
        rendered = _render(value, hostvars, inventory_dir, "endpoint_payload_manifest (or give --manifest FILE)")
    except InputError:
        raise
    except Exception as exc:  # Ansible's template errors have no common public base across versions
        message = " ".join(str(exc).split())
        raise InputError(
            f"{where}: endpoint_payload_manifest: cannot render {value} with inventory_dir {inventory_dir} ({message}); "
            "fix the expression or the manifest file it reads, or give --manifest FILE"
        ) from None
    return {**hostvars, "endpoint_payload_manifest": rendered}


def render_qualify(document: dict[str, Any]) -> str:
    """The table, the answer, the recommended inventory snippet and the picture's path of one stored qualification."""
    rungs = document.get("rungs") or []
    best = document.get("answer")
    answer = f"{document.get('key')} = {best}" if best is not None else "none: no rung passed"
    lines = [f"endpoint {document.get('endpoint')}: ladder over {document.get('key')}, {len(rungs)} rung(s); answer {answer}", "", document["table"]]
    picture = document.get("picture")
    lines += ["", f"picture: {picture}" if picture else f"no picture stored ({document.get('endpoint')}.qualify.png is drawn by playbooks/qualify.yml)"]
    snippet = document.get("snippet")
    lines += ["", "recommended (inventory snippet):", snippet.rstrip("\n")] if snippet else ["", "no recommended snippet stored"]
    return "\n".join(lines)


def manifest_to_check(hostvars: dict[str, Any], manifest_file: str | None) -> tuple[Any, str | None]:
    """The manifest the budget gate checks the shape's payload names against, as budget.yml picks
    it on the controller: endpoint_payload_manifest when it is a mapping (a manifest file lives on
    the host; --manifest names a copy here). The second value says why none is checked."""
    if manifest_file:
        return manifest_file, None
    manifest = hostvars.get("endpoint_payload_manifest")
    if is_vaulted(manifest):
        raise InputError("endpoint_payload_manifest is vaulted; the budget reads no secret: write the manifest in the clear")
    if isinstance(manifest, dict) and manifest:
        return manifest, None
    if isinstance(manifest, str) and manifest:
        return None, f"not checked here: endpoint_payload_manifest {manifest} is a file on the host (give a copy with --manifest FILE)"
    return None, "not checked here (no endpoint_payload_manifest)"


def check_identity(shape: dict[str, Any], manifest: Any, origin: Callable[[str], str | None] | None = None) -> dict[str, Any]:
    """The budget gate's identity check; a misnamed file is bad input (exit 2), not a refusal, named
    with the shape key and the file that set it (`origin(key)`). A shape that does not parse is
    left to the pricing, which names the key that is wrong."""
    try:
        parse_shape(shape)
    except ShapeError:
        return {"checked": False, "summary": "not checked (the shape does not parse)"}
    try:
        return identity_result(shape, manifest)
    except StepError as exc:
        identity = exc.result.get("payload_identity") or {}
        if identity.get("mismatches"):
            raise InputError(identity_problem_text(identity, shape, origin)) from None
        raise InputError(f"{exc}; correct the shape key (or the manifest), then price again") from None


def hub_source(hostvars: dict[str, Any]) -> tuple[str, str]:
    """The repo and revision hub_geometry.yml reads: endpoint_hub_repo / endpoint_hub_revision,
    else the manifest mapping's repo_id / revision (revision main)."""
    manifest = hostvars.get("endpoint_payload_manifest")
    manifest = manifest if isinstance(manifest, dict) else {}
    repo = hostvars.get("endpoint_hub_repo", manifest.get("repo_id", ""))
    revision = hostvars.get("endpoint_hub_revision", manifest.get("revision", "main"))
    return str(repo or ""), str(revision or "main")


HUB_MODES = ("auto", "always", "never")


def wants_hub(mode: str, repo: str, shape: dict[str, Any], payload_dir: str | None) -> bool:
    """Whether to price from the Hub: a repo is named and the mode is always, or auto with a shape
    the controller cannot price otherwise (no model_geometry) and no payload directory given here."""
    if mode not in HUB_MODES:
        raise InputError(f"endpoint_hub_pricing is {mode!r}; write one of {', '.join(HUB_MODES)}")
    if not repo or mode == "never":
        return False
    try:
        parse_shape(shape)
    except ShapeError:
        return False  # the pricing names the key that is wrong, before anything is read from the Hub
    return mode == "always" or (not payload_dir and not prices_on_controller(shape))


def hub_hint(field: str, repo: str, hub: HubPricing | None, payload_dir: str | None) -> str:
    """What a refusal of a shape without a geometry adds: the Hub, which could have priced it."""
    if hub is not None or payload_dir or field not in ("model_file", "model_geometry"):
        return ""
    if repo:
        return f"; or price it from {repo} on the Hub (without --no-hub, with endpoint_hub_pricing auto or always)"
    return "; or name the Hub repo to read it from (endpoint_payload_manifest as a mapping with repo_id, or endpoint_hub_repo)"


def shape_from_hub(shape: dict[str, Any], repo: str, revision: str) -> tuple[dict[str, Any], HubPricing]:
    """The shape with the geometry the Hub's headers give (HF_ENDPOINT, token from HF_TOKEN only)."""
    model_file = shape.get("model_file")
    if not isinstance(model_file, str) or not model_file:
        raise InputError(f"{repo}@{revision}: the shape names no model_file to read from the Hub; set endpoint_shape.model_file")
    client = HubClient(None, os.environ.get("HF_TOKEN") or None)
    try:
        pricing = price_from_hub(client, repo, model_file, revision=revision, projector=shape.get("projector") or None, drafter=shape.get("drafter") or None)
    except (HubPricingError, HubError) as exc:
        raise InputError(f"pricing from the Hub ({client.endpoint}): {exc}") from None
    return fill_shape(shape, pricing.shape_keys), pricing
