"""Operator CLI for frank.llm_fleet: the same core the modules use, from a shell.

Run as bin/llm-fleet, in a checkout or in the installed collection
(~/.ansible/collections/ansible_collections/frank/llm_fleet/bin/llm-fleet): it finds its
collection from its own path. It works in the current directory: `-i` is relative to it, and
ansible-inventory runs there, so that directory's ansible.cfg applies.

  llm-fleet budget --shape shape.yml [--set ctx_size=262144] [--svg ledger.svg] [--png ledger.png] [--json]
  llm-fleet budget --endpoint frank-secondary -i inventories/production   an inventory endpoint's shape and devices
  llm-fleet budget ... [--manifest FILE] [--hub|--no-hub]   payload identity; Hub geometry before the download
  llm-fleet qualify ENDPOINT -i inventories/production [--dir DIR] [--json]
                                         the last qualify.yml results: the table and the recommended snippet
  llm-fleet gguf MODEL.gguf            header facts, read without touching tensor data
  llm-fleet devices [--source auto|nvidia-smi|rocm-smi|sysfs] [--from FILE --tool nvidia-smi|rocm-smi|sysfs-dir] [--json|--budget-yaml]
                                         this machine's GPUs (gpu_facts), or a recorded output's
  llm-fleet payload manifest --repo OWNER/NAME [--revision main] [--file PATH ...] -o manifest.yml
  llm-fleet payload verify --manifest manifest.yml --dest DIR [--hash]
  llm-fleet payload fetch --manifest manifest.yml --dest DIR [--workers 2] [--refetch]
  llm-fleet bench --arm NAME=URL[,model=ID][,thinking=on|off] ... [--burst 4] [-o DIR]
  llm-fleet bench render RESULT.json     table and plot from a stored result (the playbook's)
  llm-fleet probe --url URL [--model ID] [--parallel 4] [--depth 1024 --depth 8192]
  llm-fleet calibration [--dir DIR] [--endpoint NAME]   predicted vs measured for every stored boot
  llm-fleet generate -i inventories/production -o DIR [--check] [--diff] [--models-dir DIR]
                                         rules, dashboards, models.yml fragments, runbooks
  llm-fleet browser-gate --url URL [--report DIR] [--allowed-host HOST ...] [--insecure]
                                         a real Chromium over the homepage and every link it carries

An endpoint's API key, when it needs one, is read from LLM_FLEET_API_KEY only.
The Hub is HF_ENDPOINT (default the public Hub); a token is read from HF_TOKEN only, never from
the command line, and is sent to the Hub only.

Exit status: 0 the shape fits / the payload is complete / every job answered / every stored boot
agrees / every link passes, 1 it does not / is not / a job came back empty / a boot differs / a link
fails, 2 invalid input (a file, inventory, key or value that cannot be used: the message names it
and the fix; a shape naming a file its manifest lacks, absent qualify results), 3 an error in
llm-fleet itself (LLM_FLEET_TRACEBACK=1 shows where), 130 interrupted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.browser.gate import (
    DEFAULT_CHROMIUM,
    DEFAULT_GUARD_PATTERNS,
    DEFAULT_LINK_SELECTORS,
    GateError,
    GateOptions,
    run_gate,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.calibration import load_boots, render_comparison
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.gguf_header import GGUFError, read_model
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import geometry_from_header
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import render_table
from ansible_collections.frank.llm_fleet.plugins.module_utils.host.records import list_generations
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.bench import Arm, render_bench_table, run_bench
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.capacity_probe import ProbeError, run_capacity_probe
from ansible_collections.frank.llm_fleet.plugins.module_utils.measure.openai_client import ApiError, Endpoint, request_json
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.fetch import FetchError, build_manifest, fetch_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.hub_client import HubClient, HubError
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import ManifestError, dump_manifest, load_manifest
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.progress import BarProgress
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import verify_payload
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.results import ResultsError
from ansible_collections.frank.llm_fleet.plugins.module_utils.qualify.results import read as read_qualify_results
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import compare_boot, price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.cli_views import (
    check_identity,
    hub_hint,
    hub_source,
    inventory_dir_of,
    manifest_to_check,
    qualify_results_dir,
    render_qualify,
    shape_from_hub,
    wants_hub,
    with_rendered_manifest,
)
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.fleet_artifacts import (
    EndpointFacts,
    exported_series,
    facts_from_hostvars,
    generate,
    serialise,
)
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.ledger_svg import render_svg
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.plots import render_ledger_png, render_stored_bench, write_bench_outputs
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.tree_writer import write_tree
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.user_errors import (
    InputError,
    inventory_file_of,
    is_vaulted,
    key_line,
    load_host_vars,
    missing_payload_text,
    shape_field,
    shape_problem_text,
)

# The collection root: the checkout, or the installed ansible_collections/frank/llm_fleet, whose
# observability/exported series and inventories the commands read.
ROOT = Path(__file__).resolve().parents[2]


def inventory_path(inventory: str) -> str:
    """An inventory as the operator named it: absolute, or relative to the current directory, or
    (the checkout habit, `-i inventories/production` from any shell) relative to the collection."""
    path = Path(inventory)
    if path.is_absolute() or path.exists():
        return str(path.resolve())
    if (ROOT / inventory).exists():
        return str((ROOT / inventory).resolve())
    raise InputError(f"-i {inventory}: no such inventory in {os.getcwd()} (give its path, absolute or relative to this directory)")


def _ansible_inventory_command() -> str:
    # The ansible-inventory of the Ansible this Python runs (a venv's), else the one on PATH.
    beside = Path(sys.executable).parent / "ansible-inventory"
    return str(beside) if beside.exists() else shutil.which("ansible-inventory") or "ansible-inventory"


def _ansible_inventory(inventory: str | None, *args: str) -> dict:
    argv = [_ansible_inventory_command(), *args]
    if inventory:
        argv += ["-i", inventory_path(inventory)]
    # In the user's own directory: their ansible.cfg (default inventory, vault settings) applies.
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise InputError(f"cannot run {argv[0]} ({exc.strerror}): run llm-fleet with the Python that runs Ansible, or put ansible-inventory on PATH") from None
    if proc.returncode != 0:
        raise InputError(f"ansible-inventory {' '.join(argv[1:])} failed: {proc.stderr.strip()}")
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise InputError(f"ansible-inventory {' '.join(argv[1:])} printed no inventory: {proc.stdout[:200]!r} {proc.stderr.strip()}") from None


ENDPOINT_GROUP = "llm_endpoints"


def _group_hosts(data: dict, group: str) -> list[str]:
    """The hosts of a group in `ansible-inventory --list` output, its child groups' included, in order."""
    entry = data.get(group, {})
    hosts = list(entry.get("hosts", []))
    for child in entry.get("children", []):
        hosts += [host for host in _group_hosts(data, child) if host not in hosts]
    return hosts


def endpoint_hostvars(data: dict) -> dict[str, dict]:
    """The inventory's endpoints: the hosts of group llm_endpoints that set endpoint_shape -> their variables."""
    hostvars = data.get("_meta", {}).get("hostvars", {})
    return {host: hostvars[host] for host in _group_hosts(data, ENDPOINT_GROUP) if "endpoint_shape" in hostvars.get(host, {})}


def _inventory_endpoint(endpoint: str, inventory: str | None) -> dict:
    endpoints = endpoint_hostvars(_ansible_inventory(inventory, "--list"))
    if endpoint not in endpoints:
        known = ", ".join(endpoints) or "none"
        raise InputError(f"{endpoint} is not an endpoint of the inventory (a host of group {ENDPOINT_GROUP} with endpoint_shape; it has: {known})")
    return endpoints[endpoint]


def _shape_key_origin(args: argparse.Namespace, field: str) -> str | None:
    """The file and line that set a refused shape key (an --set override names itself)."""
    if any(assignment.partition("=")[0] == field for assignment in args.set or []):
        return f"--set {field}=..."
    if args.shape:
        return key_line(Path(args.shape), field) or key_line(Path(args.shape), "endpoint_shape")
    source = inventory_path(args.inventory) if args.inventory else _configured_inventory()
    if source:
        inventory = Path(source)
        return inventory_file_of(inventory, args.endpoint, field) or inventory_file_of(inventory, args.endpoint, "endpoint_shape")
    return None


def _configured_inventory() -> str | None:
    """The inventory the ansible.cfg of this directory names (what ansible-inventory reads without
    -i), the first that exists; None where Ansible is not importable or none is set."""
    try:
        from ansible import constants  # reads the same ansible.cfg ansible-inventory does, here
    except ImportError:
        return None
    sources = [str(source) for source in constants.DEFAULT_HOST_LIST or [] if os.path.exists(str(source))]
    return sources[0] if sources else None


def _budget_inventory_dir(args: argparse.Namespace) -> str | None:
    """inventory_dir as the play has it for the priced endpoint: -i's, else the inventory the
    ansible.cfg of this directory names; for --shape FILE, the inventory its host_vars/ lies in."""
    if args.shape:
        path = Path(args.shape).resolve()
        return str(path.parent.parent if path.parent.name == "host_vars" else path.parent)
    source = inventory_path(args.inventory) if args.inventory else _configured_inventory()
    return inventory_dir_of(source) if source else None


def cmd_budget(args: argparse.Namespace) -> int:
    where = None
    if args.shape:
        # The variables an endpoint's host_vars file holds: endpoint_shape and endpoint_devices.
        hostvars = load_host_vars(args.shape)
        if "endpoint_shape" not in hostvars:
            raise InputError(f"{args.shape}: write endpoint_shape and endpoint_devices, as an endpoint's host_vars file does")
        where = args.shape
    elif args.host or args.var:
        raise InputError("--host and --var are gone: every endpoint is an inventory host; write --endpoint NAME (docs/migration.md)")
    elif args.endpoint:
        hostvars = _inventory_endpoint(args.endpoint, args.inventory)
        where = f"host {args.endpoint}"
    else:
        raise InputError("give --shape FILE or --endpoint NAME")
    if not isinstance(hostvars["endpoint_shape"], dict):
        raise InputError(f"{where}: endpoint_shape is {type(hostvars['endpoint_shape']).__name__}, not a mapping of shape keys (docs/shape.md)")
    vaulted = [f"endpoint_shape.{name}" for name, value in hostvars["endpoint_shape"].items() if is_vaulted(value)]
    if is_vaulted(hostvars.get("endpoint_devices")):
        vaulted.append("endpoint_devices")
    if vaulted:
        raise InputError(
            f"{where}: {', '.join(vaulted)} is vaulted; the budget reads no secret: write the shape and devices in the clear "
            "(vault only endpoint_api_key and endpoint_secret_environment)"
        )
    shape = dict(hostvars["endpoint_shape"])
    for assignment in args.set or []:
        key, sep, value = assignment.partition("=")
        if not sep:
            raise InputError(f"--set {assignment!r}: write KEY=VALUE")
        try:
            shape[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or exc
            raise InputError(f"--set {assignment!r}: the value is not YAML ({problem}); quote it, e.g. --set '{key}=\"{value}\"'") from None
    # The budget gate's order: the payload identity first, then the Hub's geometry, then the price.
    hostvars = with_rendered_manifest(hostvars, _budget_inventory_dir(args), args.shape or where)
    manifest, unchecked = manifest_to_check(hostvars, args.manifest)
    try:
        identity = {"checked": False, "summary": unchecked}
        if manifest is not None:
            identity = check_identity(shape, manifest, functools.partial(_shape_key_origin, args))
    except InputError as exc:
        raise InputError(str(exc) if args.shape else f"{where}: {exc}") from None
    repo, revision = hub_source(hostvars)
    mode = args.hub or str(hostvars.get("endpoint_hub_pricing", "auto"))
    hub = None
    try:
        if wants_hub(mode, repo, shape, args.payload_dir):
            shape, hub = shape_from_hub(shape, repo, revision)
        elif args.hub == "always":
            raise InputError("--hub: no repo to read: set endpoint_payload_manifest (a mapping with repo_id) or endpoint_hub_repo")
    except InputError as exc:
        raise InputError(str(exc) if args.shape else f"{where}: {exc}") from None
    try:
        result = price_shape(shape, hostvars.get("endpoint_devices"), args.payload_dir)
    except ShapeError as exc:
        problem = shape_problem_text(exc, shape, _shape_key_origin(args, shape_field(exc))) + hub_hint(shape_field(exc), repo, hub, args.payload_dir)
        raise InputError(problem if args.shape else f"{where}: {problem}") from None
    except FileNotFoundError as exc:
        if not args.payload_dir or not exc.filename:
            raise InputError(f"{where}: {exc.filename or exc}: no such file") from None
        problem = missing_payload_text(str(exc.filename), shape, args.payload_dir, lambda field: _shape_key_origin(args, field))
        raise InputError(problem if args.shape else f"{where}: {problem}") from None
    except (GGUFError, OSError) as exc:
        raise InputError(f"{where}: {exc}") from None
    hub_line = (
        f"from the Hub: {hub.repo_id}@{hub.commit[:12]} ({', '.join(hub.shape_keys)}; {hub.bytes_read} of {sum(f.size for f in hub.files)} bytes read)"
        if hub
        else None
    )
    if args.json:
        report = result.as_dict()
        report["payload_identity"] = identity
        report["hub"] = hub.as_dict() if hub else None
        print(json.dumps(report, indent=2))
    else:
        print(render_table(result))
        print(f"payload identity: {identity['summary']}")
        if hub_line:
            print(hub_line)
    if args.svg:
        Path(args.svg).write_text(render_svg(result, args.title or ""))
        print(f"ledger picture: {args.svg}", file=sys.stderr)
    if args.png:
        # The same picture the generated runbooks embed.
        render_ledger_png(result.as_dict(), args.png, args.title or "")
        print(f"ledger picture: {args.png}", file=sys.stderr)
    return 0 if result.fits else 1


def cmd_qualify(args: argparse.Namespace) -> int:
    """The last qualification of an endpoint (playbooks/qualify.yml): its table and snippet."""
    if args.dir:
        results_dir = args.dir
    else:
        if not args.inventory:
            raise InputError("give -i INVENTORY (its endpoint's qualify_results_dir is read from it) or --dir DIR")
        hostvars = _inventory_endpoint(args.endpoint, args.inventory)
        results_dir = qualify_results_dir(hostvars, inventory_dir_of(inventory_path(args.inventory)))
    try:
        document = read_qualify_results(results_dir, args.endpoint)
    except ResultsError as exc:
        raise InputError(str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:  # a rung the reader cannot type
        raise InputError(
            f"{results_dir}: {args.endpoint}.qualify.json holds a rung it cannot read ({exc}); run playbooks/qualify.yml --limit {args.endpoint} again"
        ) from None
    print(json.dumps(document, indent=2) if args.json else render_qualify(document))
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    """The GPUs as gpu_facts reads them: live on this machine, or from a recorded output."""
    from ansible_collections.frank.llm_fleet.plugins.module_utils.devices import gpu_facts

    def run(argv: list[str]) -> tuple[int, str, str]:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    try:
        if args.recorded:
            if args.tool == "sysfs-dir":
                devices = gpu_facts.parse_amd_sysfs(args.recorded)
            else:
                text = Path(args.recorded).read_text(encoding="utf-8", errors="replace")
                devices = gpu_facts.parse_nvidia_smi(text) if args.tool == "nvidia-smi" else gpu_facts.parse_rocm_smi(text)
        else:
            devices = gpu_facts.discover(run, args.source)
        if args.budget_yaml:
            print(yaml.safe_dump({"endpoint_devices": gpu_facts.budget_devices(devices)}, sort_keys=False), end="")
        elif args.json:
            print(json.dumps([device.as_dict() for device in devices], indent=2))
        else:
            print(gpu_facts.render_devices(devices))
    except (gpu_facts.GpuFactsError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"llm-fleet devices: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_gguf(args: argparse.Namespace) -> int:
    try:
        header = read_model(args.path)
        geometry = geometry_from_header(header)
    except (GGUFError, OSError, ValueError) as exc:
        print(f"llm-fleet: {exc}", file=sys.stderr)
        return 2
    facts = {
        "architecture": header.architecture,
        "version": header.version,
        "tensors": len(header.tensors),
        "tensor_bytes": header.tensor_bytes(),
        "block_count": geometry.n_layer,
        "layer_kinds": [layer.kind for layer in geometry.layers],
        "n_head_kv": [layer.n_head_kv for layer in geometry.layers],
        "head_dim_k": geometry.layers[0].head_dim_k if geometry.layers else 0,
        "head_dim_v": geometry.layers[0].head_dim_v if geometry.layers else 0,
        "sliding_window": geometry.sliding_window,
        "context_length": geometry.n_ctx_train,
        "expert_count": geometry.expert_count,
        "expert_used_count": geometry.expert_used_count,
        "split": {k: v for k, v in header.metadata.items() if k.startswith("split.")},
    }
    print(json.dumps(facts, indent=2))
    return 0


def _hub(args: argparse.Namespace) -> HubClient:
    return HubClient(args.endpoint, os.environ.get("HF_TOKEN") or None)


def cmd_payload(args: argparse.Namespace) -> int:
    try:
        if args.action == "manifest":
            manifest = build_manifest(_hub(args), args.repo, args.revision, args.file)
            text = dump_manifest(manifest)
            if args.output:
                Path(args.output).write_text(text)
                print(f"{args.output}: {len(manifest.files)} files, {manifest.total_bytes:,} bytes, commit {manifest.revision}", file=sys.stderr)
            else:
                print(text, end="")
            return 0
        manifest = load_manifest(args.manifest)
        if args.action == "verify":
            progress = BarProgress({f.path: f.size for f in manifest.files}) if args.hash else None
            verdicts = verify_payload(manifest, args.dest, check_hash=args.hash, workers=args.workers, progress=progress)
            for verdict in verdicts:
                print(f"{'ok' if verdict.ok else verdict.status.upper():<14} {verdict.path}" + (f"  {verdict.detail}" if verdict.detail else ""))
            bad = sum(not v.ok for v in verdicts)
            print(f"{len(verdicts) - bad}/{len(verdicts)} files ok, {manifest.total_bytes:,} bytes" + (" (sha256)" if args.hash else " (size)"))
            return 1 if bad else 0
        progress = BarProgress({f.path: f.size for f in manifest.files})
        results = fetch_payload(_hub(args), manifest, args.dest, workers=args.workers, refetch=args.refetch, progress=progress)
        progress.finish()
        for result in results:
            print(f"{result.action:<10} {result.path}  {result.bytes_transferred:,} bytes" + (f"  {result.detail}" if result.detail else ""))
        return 1 if any(r.action == "failed" for r in results) else 0
    except (ManifestError, HubError, FetchError, OSError) as exc:  # FetchError: the destination's lock or free space
        print(f"llm-fleet: {exc}", file=sys.stderr)
        return 2


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _parse_arm(text: str, api_key: str | None) -> Arm:
    name, sep, rest = text.partition("=")
    if not sep or not rest:
        raise InputError(f"--arm {text!r}: write NAME=URL[,model=ID][,thinking=on|off]")
    url, *options = rest.split(",")
    fields = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in ("model", "thinking"):
            raise InputError(f"--arm {name}: unknown option {option!r} (model=ID, thinking=on|off)")
        fields[key] = value
    thinking = {"on": True, "off": False, None: None}.get(fields.get("thinking"), "bad")
    if thinking == "bad":
        raise InputError(f"--arm {name}: thinking is on or off")
    endpoint = Endpoint(url, api_key)
    model = fields.get("model") or _served_model(endpoint)
    return Arm(name, endpoint, model, thinking)  # type: ignore[arg-type]


def _served_model(endpoint: Endpoint) -> str:
    try:
        models = request_json(endpoint, "GET", "/v1/models", timeout=30).get("data") or []
    except ApiError as exc:
        raise InputError(f"{endpoint.url}: {exc}") from None
    if not models:
        raise InputError(f"{endpoint.url} serves no model; give model=ID")
    return str(models[0]["id"])


def cmd_bench(args: argparse.Namespace) -> int:
    if args.action == "render":
        report, paths = render_stored_bench(args.result)
    else:
        if not args.arm:
            raise InputError("bench needs at least one --arm NAME=URL")
        api_key = os.environ.get("LLM_FLEET_API_KEY") or None
        try:
            extra = json.loads(args.extra_body) if args.extra_body else {}
        except ValueError as exc:
            raise InputError(f"--extra-body: not JSON: {exc}") from None
        arms = [Arm(a.name, a.endpoint, a.model, a.thinking, extra) for a in (_parse_arm(text, api_key) for text in args.arm)]
        if args.thinking == "both":
            arms = [Arm(f"{a.name}/{label}", a.endpoint, a.model, flag, a.extra_body) for a in arms for label, flag in (("think", True), ("no-think", False))]
        try:
            report = run_bench(arms, max_tokens=args.max_tokens, burst=args.burst, timeout=args.timeout, progress=_progress).as_dict()
        except ValueError as exc:
            raise InputError(f"{exc}") from None
        stem = Path(args.output) / f"bench-{report['run_id']}"
        paths = write_bench_outputs(report, str(stem))
    print(render_bench_table(report))
    print("written: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    for warning in report["warnings"]:
        print(f"WARNING: {warning}", file=sys.stderr)
    # Rendering a stored result succeeds even when it holds warnings (they are in the table).
    return 1 if report["warnings"] and args.action == "run" else 0


def cmd_probe(args: argparse.Namespace) -> int:
    endpoint = Endpoint(args.url, os.environ.get("LLM_FLEET_API_KEY") or None)
    model = args.model or _served_model(endpoint)
    try:
        report = run_capacity_probe(endpoint, model, args.parallel, args.depth, args.max_tokens, progress=_progress)
    except (ProbeError, ApiError) as exc:
        print(f"llm-fleet: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    boundary = report["boundary"]
    print(f"refusal boundary: {boundary['window']:,} tokens per request (the engine: {boundary['message']})")
    if "parallel" in report:
        par = report["parallel"]
        queued = "" if par["parallel"] else "  WARNING: requests queue"
        print(f"parallel: {par['max_decoding_at_once']} of {par['requested']} streams decoded together{queued}")
    for row in report.get("depths", []):
        if "decode_tps" in row:
            print(f"depth {row['depth']:>8,}: prompt {row['prompt_tokens']:,} tokens, ttft {row['ttft_s']}s, decode {row['decode_tps']} tok/s")
        else:
            print(f"depth {row['depth']:>8,}: {row.get('skipped') or row.get('error')}")
    return 0 if report.get("parallel", {}).get("parallel", True) else 1


def cmd_calibration(args: argparse.Namespace) -> int:
    if not Path(args.dir).is_dir():
        raise InputError(f"--dir {args.dir}: no calibration store there (the inventory's calibration directory, e.g. my-fleet/calibration)")
    boots = load_boots(args.dir, args.endpoint)
    rows = [compare_boot(boot, boots) for boot in boots]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(render_comparison(rows))
    return 1 if any(row.get("agree") is False for row in rows) else 0


def cmd_records(args: argparse.Namespace) -> int:
    """The known-good records an endpoint's host keeps (STATE_DIR/ENDPOINT), newest first: the
    generations `playbooks/rollback.yml -e generation=N` brings back."""
    listed = list_generations(args.record_dir)
    if args.json:
        print(json.dumps(listed, indent=2))
        return 0 if listed else 1
    if not listed:
        print(f"{args.record_dir}: no known-good record")
        return 1
    print(f"{'generation':>10}  {'written':<20}  {'runtime':<8}  {'served_id':<24}  {'port':<5}  payload (generation, on disk)")
    for row in listed:
        # With payload generations: whether a rollback to this record finds its payload.
        payload = f"{row['payload']['generation'][:12]} {row['payload']['on_disk']}" if row.get("payload") else "-"
        print(f"{row['generation']:>10}  {row['written']:<20}  {row['runtime'] or '-':<8}  {row['served_id'] or '-':<24}  {row['port'] or '-':<5}  {payload}")
    return 0


GENERATED_DIRS = ("prometheus", "grafana", "client", "runbooks")


def inventory_endpoints(inventory: str, calibration_dir: str | None) -> tuple[list[EndpointFacts], str]:
    """The endpoints `ansible-inventory --list` places (hosts of group llm_endpoints with an
    endpoint_shape; the endpoint is the host, its address the host's ansible_host) and the boot store."""
    data = _ansible_inventory(inventory, "--list")
    hostvars = data.get("_meta", {}).get("hostvars", {})
    inventory_dir = inventory_path(inventory)
    if calibration_dir is None:
        # The inventory's own setting, with the one variable it may use resolved here.
        configured = next((hv["llm_fleet_calibration_dir"] for hv in hostvars.values() if "llm_fleet_calibration_dir" in hv), None)
        calibration_dir = configured.replace("{{ inventory_dir }}", inventory_dir) if configured else os.path.join(inventory_dir, "calibration")
    boots = load_boots(calibration_dir)
    endpoints = []
    for name, hv in sorted(endpoint_hostvars(data).items()):
        endpoints.append(facts_from_hostvars(name, hv, [b for b in boots if b.get("endpoint") == name]))
    return endpoints, calibration_dir


def cmd_generate(args: argparse.Namespace) -> int:
    endpoints, calibration_dir = inventory_endpoints(args.inventory, args.calibration_dir)
    if not endpoints:
        print(f"llm-fleet: {args.inventory} places no endpoint (no host of group llm_endpoints with an endpoint_shape)", file=sys.stderr)
        return 2
    try:
        artifacts = generate(endpoints, exported_series(str(ROOT / "observability" / "exported")), Path(args.inventory).name)
    except (ValueError, KeyError) as exc:
        print(f"llm-fleet: {exc}", file=sys.stderr)
        return 2
    for note in artifacts.notes:
        print(f"note: {note}", file=sys.stderr)
    if artifacts.problems:
        # Nothing is written when a rule or panel names a series the runtime does not export.
        for problem in artifacts.problems:
            print(f"SERIES CHECK FAILED: {problem}", file=sys.stderr)
        return 1
    files = {path: serialise(value) for path, value in artifacts.files.items()}
    with tempfile.TemporaryDirectory() as scratch:
        for relative, (result, title) in artifacts.ledgers.items():
            picture = os.path.join(scratch, "ledger.png")
            render_ledger_png(result.as_dict() if result else None, picture, title)
            files[relative] = Path(picture).read_bytes()
    models = {p: v for p, v in files.items() if p.startswith("client/")}
    if args.models_dir:
        files = {p: v for p, v in files.items() if not p.startswith("client/")}
    reports = [write_tree(args.output, files, GENERATED_DIRS if not args.models_dir else tuple(d for d in GENERATED_DIRS if d != "client"), args.check)]
    if args.models_dir:
        reports.append(write_tree(args.models_dir, {os.path.basename(p): v for p, v in models.items()}, (), args.check))
    verb = "would change" if args.check else "changed"
    for report in reports:
        if args.diff:
            for diff in report.diffs:
                print(diff, end="" if diff.endswith("\n") else "\n")
        for path in report.changed:
            print(f"{verb}: {path}")
        for path in report.removed:
            print(f"{'would remove' if args.check else 'removed'}: {path}")
    changed = sum(len(r.changed) + len(r.removed) for r in reports)
    total = sum(len(r.changed) + len(r.unchanged) for r in reports)
    print(f"{len(endpoints)} endpoint(s), {total} file(s), {changed} {verb}; boots from {calibration_dir}", file=sys.stderr)
    return 0


def cmd_browser_gate(args: argparse.Namespace) -> int:
    """The browser gate from a shell: one line per link, the homepage first."""
    try:
        options = GateOptions(
            url=args.url,
            report_dir=args.report,
            link_selectors=tuple(args.selector or DEFAULT_LINK_SELECTORS),
            allowed_hosts=tuple(args.allowed_host or ()),
            guard_patterns=tuple(args.guard or DEFAULT_GUARD_PATTERNS),
            deadline_s=args.deadline,
            chromium_path=args.chromium,
            validate_certs=not args.insecure,
        )
        report = run_gate(options)
    except GateError as exc:
        print(f"llm-fleet: {exc}", file=sys.stderr)
        return 2
    for link in report.links:
        aborts = f", {len(link.home_reissues)} abort(s) on the way home" if link.home_reissues else ""
        if link.ok:
            print(f"PASS {link.url} -> {link.final_url} (status {link.status}{aborts})")
        else:
            print(f"FAIL {link.url} -> {link.final_url or '-'}: {'; '.join(link.reasons)}{aborts}")
    passed = len(report.links) - len(report.failed)
    print(f"{passed} of {len(report.links)} links pass in {report.seconds:.1f} s; report: {report.report_path}", file=sys.stderr)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """The CLI's exit status as documented: no Python traceback for any input."""
    try:
        return _main(argv)
    except InputError as exc:
        print(f"llm-fleet: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("llm-fleet: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `llm-fleet ... | head`: the reader left; nothing to report.
        return 0
    except OSError as exc:  # a path given that cannot be read or written
        print(f"llm-fleet: {exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else f"llm-fleet: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: say so in one line, the traceback on request
        if os.environ.get("LLM_FLEET_TRACEBACK"):
            raise
        print(f"llm-fleet: internal error ({type(exc).__name__}: {exc}); LLM_FLEET_TRACEBACK=1 shows where", file=sys.stderr)
        return 3


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-fleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    budget = sub.add_parser("budget", help="price a shape on every device (vram_budget)")
    budget.add_argument("--shape", help="a YAML file holding endpoint_shape and endpoint_devices, as an endpoint's host_vars file does")
    budget.add_argument("--endpoint", help="read the shape and devices of this inventory endpoint (a host of group llm_endpoints)")
    budget.add_argument("--host", help=argparse.SUPPRESS)  # removed: an endpoint is a host now (--endpoint)
    budget.add_argument("--var", help=argparse.SUPPRESS)
    budget.add_argument("-i", "--inventory", help="inventory (default: ansible.cfg's, the lab)")
    budget.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a shape key (value parsed as YAML)")
    budget.add_argument("--payload-dir", help="read the model, projector and drafter headers under this directory")
    budget.add_argument("--json", action="store_true", help="print the full result as JSON")
    budget.add_argument("--svg", metavar="FILE", help="write the ledger as a stacked-bar picture")
    budget.add_argument("--png", metavar="FILE", help="write the ledger as a PNG picture (as the runbooks embed it)")
    budget.add_argument("--title", help="title of the picture")
    budget.add_argument(
        "--manifest", metavar="FILE", help="check the payload names against this manifest file (default: endpoint_payload_manifest when a mapping)"
    )
    budget.add_argument(
        "--hub",
        dest="hub",
        action="store_const",
        const="always",
        help="price from the Hub's headers even when the shape has a geometry (default: endpoint_hub_pricing, auto)",
    )
    budget.add_argument("--no-hub", dest="hub", action="store_const", const="never", help="never read the Hub")
    budget.set_defaults(func=cmd_budget)
    qualify = sub.add_parser("qualify", help="an endpoint's last qualification (playbooks/qualify.yml): the table and the recommended snippet")
    qualify.add_argument("endpoint", help="the endpoint (its inventory host)")
    qualify.add_argument("-i", "--inventory", help="the inventory whose qualify_results_dir holds the results")
    qualify.add_argument("--dir", help="the results directory itself (no inventory read)")
    qualify.add_argument("--json", action="store_true", help="print the stored result document")
    qualify.set_defaults(func=cmd_qualify)
    devices = sub.add_parser("devices", help="this machine's GPUs as gpu_facts reads them, or a recorded output's")
    devices.add_argument("--source", choices=["auto", "nvidia-smi", "rocm-smi", "sysfs"], default="auto", help="where to read the live facts")
    devices.add_argument("--from", dest="recorded", metavar="FILE", help="parse a recorded output instead (a sysfs root directory for --tool sysfs-dir)")
    devices.add_argument("--tool", choices=["nvidia-smi", "rocm-smi", "sysfs-dir"], help="what --from holds")
    devices.add_argument("--json", action="store_true", help="print every fact as JSON")
    devices.add_argument("--budget-yaml", action="store_true", help="print endpoint_devices for llm-fleet budget --shape")
    devices.set_defaults(func=cmd_devices)
    gguf = sub.add_parser("gguf", help="print a GGUF model's header facts")
    gguf.add_argument("path")
    gguf.set_defaults(func=cmd_gguf)
    payload = sub.add_parser("payload", help="Hub payloads: write a manifest, verify, fetch (hf_payload_gate)")
    payload.add_argument("action", choices=["manifest", "verify", "fetch"])
    payload.add_argument("--endpoint", help="the Hub's base URL (default: HF_ENDPOINT or the public Hub)")
    payload.add_argument("--repo", help="manifest: the repository, owner/name")
    payload.add_argument("--revision", default="main", help="manifest: branch, tag or commit (pinned to the commit)")
    payload.add_argument("--file", action="append", help="manifest: a wanted path (repeat); default all files")
    payload.add_argument("-o", "--output", help="manifest: write here instead of stdout")
    payload.add_argument("--manifest", help="verify/fetch: the manifest file")
    payload.add_argument("--dest", help="verify/fetch: the payload directory")
    payload.add_argument("--hash", action="store_true", help="verify: compare sha256 too (reads all data)")
    payload.add_argument("--workers", type=int, default=2, help="files hashed or fetched in parallel")
    payload.add_argument("--refetch", action="store_true", help="fetch: set aside and refetch files that are present but wrong")
    payload.set_defaults(func=cmd_payload)
    bench = sub.add_parser("bench", help="conversation bench: TTFT and decode tok/s per prompt and arm")
    bench.add_argument("action", nargs="?", choices=["run", "render"], default="run")
    bench.add_argument("result", nargs="?", help="render: a stored result JSON")
    bench.add_argument("--arm", action="append", metavar="NAME=URL[,model=ID][,thinking=on|off]", help="an endpoint to bench (repeat for an A/B)")
    bench.add_argument("--thinking", choices=["both"], help="run every arm with thinking on and off")
    bench.add_argument("--max-tokens", type=int, default=128)
    bench.add_argument("--burst", type=int, default=0, help="also send every prompt N times at once")
    bench.add_argument("--timeout", type=float, default=600.0)
    bench.add_argument("--extra-body", metavar="JSON", help="further request fields for every job, e.g. '{\"ignore_eos\": true}'")
    bench.add_argument("-o", "--output", default=".", help="directory for bench-RUN.json/.txt/.png")
    bench.set_defaults(func=cmd_bench)
    probe = sub.add_parser("probe", help="capacity probe: refusal boundary, parallel serving, decode at depth")
    probe.add_argument("--url", required=True, help="the endpoint, http://HOST:PORT")
    probe.add_argument("--model", help="default: the first model the endpoint serves")
    probe.add_argument("--parallel", type=int, default=0, help="check that N requests decode together")
    probe.add_argument("--depth", type=int, action="append", help="measure decode with this many tokens in context (repeat)")
    probe.add_argument("--max-tokens", type=int, default=64)
    probe.add_argument("--json", action="store_true")
    probe.set_defaults(func=cmd_probe)
    calib = sub.add_parser("calibration", help="predicted vs measured KV for every stored boot ledger")
    calib.add_argument("--dir", default=str(ROOT / "inventories" / "production" / "calibration"), help="the calibration store")
    calib.add_argument("--endpoint", help="only this endpoint's boots")
    calib.add_argument("--json", action="store_true")
    calib.set_defaults(func=cmd_calibration)
    records = sub.add_parser("records", help="the known-good records kept on an endpoint's host (rollback generations)")
    records.add_argument("record_dir", help="the endpoint's record directory on its host (STATE_DIR/ENDPOINT, e.g. /var/lib/llm-fleet/frank-primary)")
    records.add_argument("--json", action="store_true")
    records.set_defaults(func=cmd_records)
    gen = sub.add_parser("generate", help="Prometheus rules, Grafana dashboards, models.yml fragments and runbooks from an inventory")
    gen.add_argument("-i", "--inventory", required=True, help="the inventory that deploys (e.g. inventories/production)")
    gen.add_argument("-o", "--output", required=True, help="directory to write (prometheus/, grafana/, client/, runbooks/, README.md)")
    gen.add_argument("--models-dir", help="write the models.yml fragments here instead (where the harness reads them)")
    gen.add_argument("--calibration-dir", help="the boot ledger store (default: the inventory's llm_fleet_calibration_dir or INVENTORY/calibration)")
    gen.add_argument("--check", action="store_true", help="write nothing; report what would change")
    gen.add_argument("--diff", action="store_true", help="show a unified diff of each text change")
    gen.set_defaults(func=cmd_generate)
    gate = sub.add_parser("browser-gate", help="crawl a homepage and every card and docs link on it with a real Chromium (browser_gate)")
    gate.add_argument("--url", required=True, help="the homepage")
    gate.add_argument("--report", default="browser-gate-report", help="directory for report.json and the failing links' screenshots")
    gate.add_argument("--selector", action="append", help=f"CSS selector of the links to crawl (repeat; default {' '.join(DEFAULT_LINK_SELECTORS)})")
    gate.add_argument("--allowed-host", action="append", help="a hostname a link may end on besides its own (repeat)")
    gate.add_argument("--guard", action="append", help="a regular expression of the auth guard's URLs (repeat; default authentik's)")
    gate.add_argument("--deadline", type=float, default=300.0, help="seconds for the whole gate")
    gate.add_argument("--chromium", default=DEFAULT_CHROMIUM, help="the Chromium executable")
    gate.add_argument("--insecure", action="store_true", help="accept TLS certificates the browser does not trust (a lab's)")
    gate.set_defaults(func=cmd_browser_gate)
    args = parser.parse_args(argv)
    if args.command == "bench" and args.action == "render" and not args.result:
        parser.error("bench render needs RESULT.json")
    if args.command == "devices" and bool(args.recorded) != bool(args.tool):
        parser.error("devices: --from and --tool go together")
    if args.command == "payload":
        needed = {"manifest": ["repo"], "verify": ["manifest", "dest"], "fetch": ["manifest", "dest"]}[args.action]
        missing = [f"--{name}" for name in needed if not getattr(args, name)]
        if missing:
            parser.error(f"payload {args.action} needs {' and '.join(missing)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
