# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Input errors a person can act on, for the CLI and the playbooks' preflight: the field, the file
(and line) it came from, what is wrong and the accepted form. Controller-only."""

from __future__ import annotations

import difflib
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import SHAPE_FIELDS
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

try:  # Ansible 2.19 tags every value read from an inventory file with where it came from.
    from ansible._internal._datatag._tags import Origin
except ImportError:  # pragma: no cover - another Ansible, or the CLI without Ansible
    Origin = None

SHAPE_DOC = "docs/shape.md"
# The accepted form of each kind of shape key, as a person writes it.
ACCEPTED = {
    "int": "a whole number",
    "float": "a number, e.g. 0.9",
    "bool": "true or false",
    "str": "a string",
    "size": "a size, e.g. `24,576 MiB`, `31.86 GiB` or a byte count",
    "sizes": "a size, or a list of sizes (one per device)",
    "split": "a list of shares, e.g. [3, 1], or 'a,b'",
    "overrides": "a mapping pattern -> buffer, e.g. {exps: CPU}",
    "args": "a list of strings, e.g. [--log-verbosity, '4']",
    "list": "a list",
    "mapping": "a mapping",
}
SUFFIXED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM])\s*$")


class InputError(ValueError):
    """Input that cannot be used; the message names what, where and the fix."""


class Vaulted(str):
    """A `!vault` value read without its password: the ciphertext, never decrypted here."""


def _vault(loader: yaml.SafeLoader, node: yaml.Node) -> Vaulted:
    return Vaulted(loader.construct_scalar(node))


def _unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    return loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode) else loader.construct_mapping(node)


class HostVarsLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """YAML as Ansible's inventory files write it: `!vault` and `!unsafe` values included."""


HostVarsLoader.add_constructor("!vault", _vault)
HostVarsLoader.add_constructor("!unsafe", _unsafe)


def load_host_vars(path: str) -> dict[str, Any]:
    """A host_vars file's variables; every failure an InputError naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text (a whole-file vault? decrypt it with ansible-vault view, or give the shape in the clear)") from None
    if text.startswith("$ANSIBLE_VAULT;"):
        raise InputError(f"{path}: the whole file is vaulted; the budget reads no secret: keep endpoint_shape and endpoint_devices in a file in the clear")
    try:
        data = yaml.load(text, Loader=HostVarsLoader)  # a SafeLoader with two tags added
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise InputError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of variables (endpoint_shape: ..., endpoint_devices: ...), got {type(data).__name__}")
    return data


def is_vaulted(value: Any) -> bool:
    """A vaulted value as a host_vars file or `ansible-inventory --list` gives it (never decrypted)."""
    return isinstance(value, Vaulted) or (isinstance(value, dict) and set(value) == {"__ansible_vault"})


def shown(path: str | Path) -> str:
    """A path as the person wrote it: relative to the current directory when under it."""
    text = str(path)
    try:
        relative = os.path.relpath(text)
    except ValueError:
        return text
    return relative if not relative.startswith("..") else text


def origin_of(value: Any) -> str | None:
    """Where Ansible read a value: 'PATH:LINE', or None where it does not know."""
    tag = Origin.get_tag(value) if Origin is not None else None
    path = getattr(tag, "path", None)
    if not path:
        return None
    return f"{shown(path)}:{tag.line_num}" if getattr(tag, "line_num", None) else shown(path)


def shape_field(exc: ShapeError) -> str:
    """The shape key a ShapeError names (its message starts with it)."""
    match = re.match(r"^([A-Za-z0-9_.\[\]-]+)", str(exc))
    return match.group(1).split(".")[0] if match else ""


def accepted_form(field: str, value: Any = None) -> str:
    """How to write a shape key, for the fix part of a message."""
    spec = SHAPE_FIELDS.get(field)
    if spec is None:
        return f"the keys and their forms: {SHAPE_DOC}"
    if spec.choices:
        return f"{field} is one of {', '.join(spec.choices)} ({SHAPE_DOC})"
    if spec.kind == "int" and isinstance(value, str) and (suffixed := SUFFIXED.match(value)):
        number = float(suffixed.group(1)) * (1000 if suffixed.group(2).lower() == "k" else 1000_000)
        # "262k" on a model card is 2^18 = 262,144 tokens: offer the power of two it rounds.
        power = 1 << round(math.log2(number)) if number >= 1 else 1
        written = power if abs(power - number) <= 0.05 * number else int(number)
        return f"write {field} as a whole number, without a suffix: {field}: {written}"
    return f"{field} is {ACCEPTED.get(spec.kind, spec.kind)}: {spec.help} ({SHAPE_DOC})"


def shape_problem_text(exc: ShapeError, raw: Any = None, fallback_origin: str | None = None) -> str:
    """'endpoint_shape.KEY (FILE:LINE): PROBLEM; fix: ACCEPTED FORM' for a refused shape."""
    field = shape_field(exc)
    problem = str(exc)
    if field and problem.startswith(field):
        problem = problem[len(field) :].lstrip(" :")
    where = None
    value = None
    if isinstance(raw, dict):
        for key in raw:
            if str(key) == field:
                value = raw[key]
                where = origin_of(key) or origin_of(value)
        where = where or origin_of(raw)
    where = where or fallback_origin
    located = f" ({where})" if where else ""
    if "did you mean" in problem or "unknown shape key" in problem or "not a " in problem:
        fix = f"the keys each runtime takes: {SHAPE_DOC}"
    elif problem.startswith("required"):
        fix = f"add {field} to endpoint_shape ({SHAPE_DOC})"
    elif re.search(r"\b(expected|must be)\b", problem) and not (isinstance(value, str) and SUFFIXED.match(value)):
        fix = f"as it says ({field} in {SHAPE_DOC})"
    else:
        fix = accepted_form(field, value)
    return f"endpoint_shape.{field}{located}: {problem}; fix: {fix}"


def missing_payload_text(missing: str, raw: dict[str, Any], payload_dir: str, fallback_origin: Any = None, present: list[str] | None = None) -> str:
    """A payload file the shape names (model_file, projector, drafter, ...) that is not under the
    payload directory: the key, where it is set, the closest file that is there."""
    field = next((str(k) for k, v in raw.items() if isinstance(v, str) and v and missing.endswith(v.lstrip("./"))), "")
    value = raw.get(field, missing)
    where = (origin_of(value) if field else None) or (fallback_origin(field) if fallback_origin and field else None)
    located = f" ({where})" if where else ""
    root = Path(payload_dir)
    if present is None:  # on this machine (the CLI's --payload-dir); the playbook lists the host's
        present = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    close = difflib.get_close_matches(str(value), present, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    name = f"endpoint_shape.{field}" if field else "a payload file"
    return (
        f"{name}{located}: {value} is not in the payload directory {payload_dir}; {hint}"
        f"fix: name the file as it is there (relative to it), or fetch the payload first (the payload gate, or llm-fleet payload fetch)"
    )


IDENTITY_FIX = "fix: name each file as the manifest lists it (relative to endpoint_payload_dir), or pin a manifest that holds it"


def identity_problem_text(identity: dict[str, Any], raw: Any = None, fallback_origin: Any = None) -> str:
    """The payload identity's refusal (the budget gate's `payload_identity` result) as a person acts
    on it: each shape key, the name the manifest lacks and the closest name it has first (a plan's
    table shows the start of it), then the file and line that set the key, the manifest, the fix."""
    parts = []
    for mismatch in identity.get("mismatches") or []:
        field = str(mismatch.get("field") or "")
        key = field.split(" ", 1)[0].split("[", 1)[0]
        value = raw.get(key) if isinstance(raw, dict) else None
        where = (origin_of(value) if value is not None else None) or (fallback_origin(key) if fallback_origin and key else None)
        parts.append(f"endpoint_shape.{mismatch.get('message')}" + (f" (set in {where})" if where else ""))
    manifest = identity.get("manifest")
    return "payload identity: " + "; ".join(parts) + (f"; manifest {manifest}" if manifest else "") + f"; {IDENTITY_FIX}"


def key_line(path: Path, key: str) -> str | None:
    """'PATH:LINE' of the first line that sets `key:` in a YAML file (for files read without Ansible)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*:")
    for number, line in enumerate(lines, 1):
        if pattern.match(line):
            return f"{shown(path)}:{number}"
    return None


def inventory_file_of(inventory: Path, host: str, key: str) -> str | None:
    """The host_vars or group_vars file of an inventory directory that sets `key` for `host`,
    where the inventory is a directory (where it is not, None)."""
    if not inventory.is_dir():
        return None
    candidates = [inventory / "host_vars" / f"{host}{ext}" for ext in (".yml", ".yaml", "")]
    candidates += sorted((inventory / "host_vars" / host).glob("*.y*ml")) if (inventory / "host_vars" / host).is_dir() else []
    candidates += sorted((inventory / "group_vars").glob("**/*.y*ml")) if (inventory / "group_vars").is_dir() else []
    for candidate in candidates:
        if candidate.is_file() and (found := key_line(candidate, key)):
            return found
    return None
