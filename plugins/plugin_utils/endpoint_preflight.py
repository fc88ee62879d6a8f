# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The endpoint role's preflight: every check of what a person wrote that the controller can make
before any host is contacted, each problem named with the field, the file and line that set it and
the fix. The action frank.llm_fleet.endpoint_preflight gathers the inputs from Ansible's variables
and reports every problem at once; this module is the logic, driven by tests with plain values.

- removed names: the variables of the per-endpoint roles (frank_primary_*, ...) and bench_endpoints;
- the role's variables (endpoint_*) against the role's own argument spec (meta/argument_specs.yml):
  a name the role does not know would be ignored, so it is refused with the closest name; a value
  of the wrong form is refused with the accepted form, before Ansible's own check (which prints the
  whole spec);
- the shape, through the one shape parser (user_errors.shape_problem_text);
- the vaulted secrets a run that reads them cannot decrypt;
- the port: present, and no other endpoint of the inventory on the same machine with the same one
  (both files named);
- the bind policy (a LAN bind needs client networks and a key).
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.firewall import PolicyError, bind_policy
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError
from ansible_collections.frank.llm_fleet.plugins.plugin_utils.user_errors import shape_problem_text

# The role's own argument spec, shipped with the collection beside this file's package.
ROLE_SPEC = Path(__file__).resolve().parents[2] / "roles" / "endpoint" / "meta" / "argument_specs.yml"
ROLE_DEFAULTS = ("roles/endpoint/defaults/main.yml", "roles/endpoint/vars/main.yml")
ROLE_DOC = "roles/endpoint/README.md"
PREFIX = "endpoint_"
# Set by the collection's own playbooks, never by an inventory (playbooks/plan.yml).
INTERNAL = frozenset({"endpoint_budget_controller_only"})
# The names of removed variables that now belong to another role: the rename, not a guess.
RENAMED = {
    "endpoint_unit_metrics": "host_metrics_enabled (the role frank.llm_fleet.host_metrics installs the unit metrics once per machine)",
    "endpoint_metrics_textfile_dir": "host_metrics_textfile_dir (the role frank.llm_fleet.host_metrics installs the unit metrics once per machine)",
}
# The shape is judged by its parser, not by its spec here.
SHAPE = "endpoint_shape"
# Read only where a run needs them: their names are always known, their values are typed only by
# a run that reads the secrets (a budget-only run and the fleet plan have no vault password).
SECRETS = ("endpoint_api_key", "endpoint_secret_environment")
SECRET_NAMES = frozenset({*SECRETS, "endpoint_hub_token"})
OLD_ROLE_VAR = re.compile(r"^frank_(primary|secondary|large)_(.*)$")

# How a person writes a value of each argument-spec type.
FORMS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "path": "a path",
    "list": "a list",
    "dict": "a mapping",
    "raw": "any value",
}
ELEMENT_FORMS = {"str": "strings", "int": "whole numbers", "float": "numbers", "bool": "true or false values", "dict": "mappings", "raw": "values"}


@dataclass(frozen=True)
class RoleSpec:
    """The role's variables: every name it documents, and the spec Ansible validates them by."""

    options: Mapping[str, Mapping[str, Any]]
    known: frozenset[str]


@functools.lru_cache(maxsize=4)
def load_role_spec(path: str = str(ROLE_SPEC)) -> RoleSpec:
    """The entry point main's options (what Ansible validates at the role's start) and every name
    any entry point documents (the preflight entry's secrets and shape keys)."""
    with open(path, encoding="utf-8") as handle:
        # libyaml's loader where PyYAML has it: the spec is read in every task's worker.
        specs = (yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}).get("argument_specs") or {}
    options = dict((specs.get("main") or {}).get("options") or {})
    known = set(options)
    for entry in specs.values():
        known.update((entry or {}).get("options") or {})
    return RoleSpec(options=options, known=frozenset(known | INTERNAL))


def _located(where: str | None) -> str:
    return f" ({where})" if where else ""


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def accepted_form(spec: Mapping[str, Any]) -> str:
    """How to write a value of this spec, as a person reads it."""
    if spec.get("choices"):
        return "one of " + ", ".join(str(choice) for choice in spec["choices"])
    kind = str(spec.get("type") or "str")
    form = FORMS.get(kind, kind)
    if kind == "list" and spec.get("elements"):
        form = f"a list of {ELEMENT_FORMS.get(str(spec['elements']), str(spec['elements']))}"
    return form


def _example(name: str, spec: Mapping[str, Any]) -> str:
    default = spec.get("default")
    if default is None or (isinstance(default, str) and ("{{" in default or default == "")):
        return ""
    return f", e.g. {name}: {yaml.safe_dump(default, default_flow_style=True, width=1000).strip().removesuffix('...').strip()}"


def unknown_name_problem(name: str, known: Iterable[str], where: str | None) -> str:
    """A variable named like the role's that the role does not know: Ansible would ignore it."""
    if name in RENAMED:
        return f"{name}{_located(where)}: renamed to {RENAMED[name]}; fix: rename it (docs/migration.md)"
    close = difflib.get_close_matches(name, sorted(set(known) - INTERNAL), n=1, cutoff=0.75)
    hint = f"did you mean {close[0]}? " if close else ""
    return (
        f"{name}{_located(where)}: not a variable of the endpoint role, so it would be ignored; "
        f"{hint}fix: rename it (every variable of the role and its form: {ROLE_DOC})"
    )


def type_problem(name: str, value: Any, spec: Mapping[str, Any], where: str | None) -> str:
    """'' when Ansible's own validation would take the value, else what is wrong and the fix."""
    checked = {key: spec[key] for key in ("type", "elements", "choices", "options", "no_log") if key in spec}
    result = ArgumentSpecValidator({name: checked}).validate({name: value}, validate_role_argument_spec=True)
    if not result.error_messages:
        return ""
    form = accepted_form(spec)
    description = " ".join(str(spec.get("description") or "").split())
    about = f" ({description.rstrip('.')})" if description else ""
    return f"{name}{_located(where)}: {_shown(value)} is not {form}; fix: write {form}{_example(name, spec)}{about}"


def role_var_problems(
    names: Iterable[str],
    spec: RoleSpec,
    value_of: Callable[[str], Any],
    where_of: Callable[[str], str | None],
    is_role_default: Callable[[str], bool],
    reads_secrets: bool = False,
) -> list[str]:
    """Every endpoint_* variable the host has: unknown names first, then values of the wrong form.
    `value_of` templates a variable (it may raise); `is_role_default` says a value is the role's
    own default (left alone: the role wrote it); the secrets are typed only when `reads_secrets`."""
    untyped = {SHAPE} | (set() if reads_secrets else set(SECRET_NAMES))
    problems = []
    present = sorted(name for name in names if name.startswith(PREFIX))
    for name in present:
        if name not in spec.known:
            problems.append(unknown_name_problem(name, spec.known, where_of(name)))
    for name in present:
        if name not in spec.options or name in untyped or is_role_default(name):
            continue
        try:
            value = value_of(name)
        except Exception as exc:  # a template that cannot be resolved, said in Ansible's words
            problems.append(f"{name}{_located(where_of(name))}: cannot be read: {' '.join(str(exc).split())}")
            continue
        problem = type_problem(name, value, spec.options[name], where_of(name))
        if problem:
            problems.append(problem)
    return problems


def removed_names_problem(names: Iterable[str]) -> str:
    """The variables of the removed per-endpoint roles, each with its new name ('' when none)."""
    old = sorted(name for name in names if OLD_ROLE_VAR.match(name))
    if not old:
        return ""
    lines = [
        "the roles frank_primary, frank_secondary and frank_large are gone; every endpoint is an inventory host",
        "of group llm_endpoints with endpoint_* host variables. Rename (docs/migration.md):",
    ]
    for name in old:
        match = OLD_ROLE_VAR.match(name)
        if match is None:  # `old` holds only names OLD_ROLE_VAR matched
            continue
        endpoint, suffix = match.group(1), match.group(2)
        target = f"frank-{endpoint}"
        if suffix == "name":
            new = f"the inventory hostname {target} (endpoint_name defaults to it)"
        elif suffix == "shape_defaults":
            new = f"served_id, port and bind written in endpoint_shape of host {target}"
        else:
            new = f"endpoint_{suffix} in host_vars/{target}.yml"
        lines.append(f"  {name} -> {new}")
    return "\n".join(lines)


def bench_endpoints_problem(value: Any) -> str:
    return (
        f"bench_endpoints={value} is gone: every endpoint is an inventory host, so select them with "
        "--limit (e.g. --limit frank-secondary); see docs/migration.md."
    )


def shape_problem(raw: Any, name: str) -> str:
    """'' for a shape that parses, else the key, where, and the fix (the shape_problem filter's words)."""
    if not isinstance(raw, dict):
        return f"endpoint_shape: expected a mapping of shape keys, got {type(raw).__name__}; fix: runtime: llamacpp, port: 8080, ... (docs/shape.md)"
    try:
        parse_shape(raw, name)
    except ShapeError as exc:
        return shape_problem_text(exc, raw)
    return ""


def vault_problem(locked: list[str]) -> str:
    if not locked:
        return ""
    return (
        f"{', '.join(locked)} is vaulted and this run has no password that decrypts it; fix: give the vault password - "
        "--vault-password-file FILE (or --ask-vault-pass), or ANSIBLE_VAULT_PASSWORD_FILE, or vault_password_file in your "
        "ansible.cfg (a relative path is relative to the ansible.cfg). Only the budget check (--check --tags budget) and the "
        "fleet plan run without it."
    )


def missing_port_problem(host: str) -> str:
    return f"endpoint_shape has no port. Every endpoint writes its port in its shape (host_vars/{host}.yml); the per-endpoint roles' default ports are gone."


@dataclass(frozen=True)
class Neighbour:
    """Another endpoint of the inventory: its machine, its port and where that port is set."""

    name: str
    machine: str
    port: Any
    where: str | None = None


def port_origin(shape: Any, origin: Callable[[Any], str | None]) -> str | None:
    """Where a shape's port is set: its key's line, else its value's, else the shape's."""
    if not isinstance(shape, Mapping):
        return None
    for key in shape:
        if str(key) == "port":
            return origin(key) or origin(shape[key]) or origin(shape)
    return origin(shape)


def port_clash_problem(host: str, machine: str, port: Any, where: str | None, others: Iterable[Neighbour]) -> str:
    """Two endpoints on one machine and one port would pass every other gate and then crash-loop
    (the second cannot bind): named with both files, before anything is priced or fetched."""
    clashes = [other for other in others if other.name != host and other.machine == machine and str(other.port) == str(port)]
    if not clashes:
        return ""
    named = ", ".join(f"{other.name}{_located(other.where)}" for other in clashes)
    # The same place for both (one -e, one group_vars file): the shape is not the endpoint's own.
    shared = where is None or any(other.where == where for other in clashes)
    hint = f" An endpoint_shape given with -e (or in group_vars) applies to every endpoint: give it in host_vars/{host}.yml instead." if shared else ""
    fix = f"give each endpoint on a machine its own port: endpoint_shape.port{_located(where)}."
    return f"port {port} on {machine} is also the port of {named}; fix: {fix}{hint}"


def bind_policy_problem(shape: Any, name: str, networks: list[str], has_key: bool, lan_without_key: bool) -> tuple[str, str]:
    """(problem, what the firewall admits): the bind_policy filter's judgement and words."""
    try:
        typed = parse_shape(shape, name)
        firewall = bind_policy(name, typed.bind, typed.port, list(networks or []), bool(has_key), bool(lan_without_key))
    except (ShapeError, PolicyError) as exc:
        return f"{name}: {exc}", ""
    if firewall is None:
        return "", "loopback bind: no firewall needed"
    return "", f"LAN bind on port {firewall.port}: the firewall admits loopback, this host and {', '.join(firewall.networks)}"


class HostVariables(Protocol):
    """One endpoint's variables as Ansible holds them (the action's adapter; a test's fake)."""

    def names(self) -> Iterable[str]:
        """Every variable name the host has."""

    def raw(self, name: str) -> Any:
        """A variable as written (not templated), KeyError when the host has none."""

    def value(self, name: str) -> Any:
        """A variable templated (lookups run, vaulted values decrypted); may raise."""

    def where(self, name: str) -> str | None:
        """'FILE:LINE' that set the variable, where known."""

    def origin(self, value: Any) -> str | None:
        """'FILE:LINE' a value (or a mapping's key) was read from, where known."""

    def is_role_default(self, name: str) -> bool:
        """Whether the value is the role's own default (defaults/main.yml), not the inventory's."""

    def locked(self, names: Iterable[str]) -> list[str]:
        """'NAME (FILE:LINE)' of each vaulted value among these variables (a mapping's values
        included) that this run cannot decrypt."""


@dataclass
class Preflight:
    """The verdict: every problem (the first line of the task's message is the first problem), and
    what the bind policy admits (shown when the run reads the secrets)."""

    problems: list[str] = field(default_factory=list)
    firewall: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def message(self, host: str) -> str:
        return "\n".join(f"{host}: {problem}" for problem in self.problems)


def preflight(
    host: str,
    variables: HostVariables,
    neighbours: Iterable[Neighbour],
    reads_secrets: bool,
    spec: RoleSpec | None = None,
) -> Preflight:
    """Every check, each problem kept (not only the first). `reads_secrets`: this run reads the
    vaulted values (not a budget-only run, not the fleet plan), so they are checked, and the bind
    policy with them (it needs to know whether there is a key)."""
    spec = spec or load_role_spec()
    names = list(variables.names())
    verdict = Preflight()
    add = verdict.problems.append
    if removed := removed_names_problem(names):
        add(removed)
    if "bench_endpoints" in names:
        add(bench_endpoints_problem(variables.raw("bench_endpoints")))
    locked = variables.locked(SECRETS) if reads_secrets else []
    if locked:
        add(vault_problem(locked))
    # A locked secret cannot be typed: its problem is the password, said above.
    typed_secrets = reads_secrets and not locked
    verdict.problems.extend(role_var_problems(names, spec, variables.value, variables.where, variables.is_role_default, typed_secrets))
    name = str(variables.value("endpoint_name")) if "endpoint_name" in names else host
    shape = variables.value("endpoint_shape") if "endpoint_shape" in names else {}
    if problem := shape_problem(shape, name):
        add(problem)
    port = shape.get("port") if isinstance(shape, Mapping) else None
    if isinstance(shape, Mapping) and port is None:
        add(missing_port_problem(host))
    elif port is not None:
        machine = str(variables.value("ansible_host")) if "ansible_host" in names else host
        if clash := port_clash_problem(host, machine, port, port_origin(shape, variables.origin), neighbours):
            add(clash)
    if reads_secrets and verdict.ok:
        has_key = len(str(variables.value("endpoint_api_key") or "")) > 0 if "endpoint_api_key" in names else False
        networks = variables.value("endpoint_allowed_networks") if "endpoint_allowed_networks" in names else []
        without_key = boolean(variables.value("endpoint_lan_without_key"), strict=False) if "endpoint_lan_without_key" in names else False
        problem, verdict.firewall = bind_policy_problem(shape, name, networks, has_key, without_key)
        if problem:
            add(problem)
    return verdict
