# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Payload identity: every file a shape names is a file of the endpoint's pinned manifest.

The budget gate prices a shape before anything on the host changes, often on the controller
from a declared geometry, so a misspelt `model_file` (`...Q4_K_M.ggfu`) would price as `fits: yes`
and fail only when the engine starts on the GPU host. This check ties each payload path of the
shape (the model, every part of a split GGUF, the projector, the drafter, a tokenizer directory
and its files) to the manifest the payload gate fetches and verifies, and names the shape key,
the path and the closest manifest name for each one that is not there.

Which shape keys name payload files is each runtime driver's knowledge (`Runtime.payload_names`
in runtimes/base.py); this module only compares names. Paths are relative to the payload
directory, the manifest's own root, so no file is read.
"""

from __future__ import annotations

import difflib
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import Manifest

FILE = "file"
DIRECTORY = "directory"

# A name this close to a manifest path is offered as "did you mean" (difflib's ratio, 0..1).
CLOSE_MATCH_CUTOFF = 0.6

# What the budget says when no manifest reached it: none is set, or it is a file on the host and
# the budget ran on the controller (which then says where the manifest is and how to check it).
UNCHECKED = "not checked here (the budget read no manifest)"


@dataclass(frozen=True)
class PayloadName:
    """One payload path a shape names. `path` is relative to the payload directory ('.' is the
    directory itself); a directory must hold at least one manifest file, and each of `holds`
    (relative to it)."""

    field: str
    path: str
    kind: str = FILE
    holds: tuple[str, ...] = ()


@dataclass(frozen=True)
class Mismatch:
    """A payload name the manifest does not have, with the closest name it does have."""

    field: str
    path: str
    problem: str
    closest: str | None = None

    @property
    def message(self) -> str:
        hint = f"; did you mean {self.closest!r}?" if self.closest else ""
        return f"{self.field}: {self.path!r} {self.problem}{hint}"

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "path": self.path, "problem": self.problem, "closest": self.closest, "message": self.message}


@dataclass
class IdentityReport:
    """What the check found: every name checked, and those the manifest lacks."""

    manifest: str
    checked: list[PayloadName] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def summary(self) -> str:
        if self.ok:
            fields = ", ".join(dict.fromkeys(name.field.split(" ", 1)[0].split("[", 1)[0] for name in self.checked)) or "no payload key"
            return f"the shape's payload ({fields}: {len(self.checked)} paths) is in the manifest {self.manifest}"
        return "; ".join(m.message for m in self.mismatches) + f" (manifest {self.manifest})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "checked": True,
            "ok": self.ok,
            "manifest": self.manifest,
            "names": [{"field": n.field, "path": n.path, "kind": n.kind} for n in self.checked],
            "mismatches": [m.as_dict() for m in self.mismatches],
            "summary": self.summary,
        }


def manifest_label(manifest: Manifest) -> str:
    """repo@short-revision: enough to say which pinned payload the names were checked against."""
    return f"{manifest.repo_id}@{manifest.revision[:12]}"


def _directories(paths: Iterable[str]) -> set[str]:
    """Every directory a manifest path lies under ('.' is the payload directory itself)."""
    found = {"."}
    for path in paths:
        parent = posixpath.dirname(path)
        while parent:
            found.add(parent)
            parent = posixpath.dirname(parent)
    return found


def _closest(path: str, candidates: Iterable[str]) -> str | None:
    """The candidate nearest to `path`, by the whole path or by its file name alone."""
    pool = sorted(set(candidates))
    whole = difflib.get_close_matches(path, pool, n=1, cutoff=CLOSE_MATCH_CUTOFF)
    if whole:
        return whole[0]
    by_name = {posixpath.basename(candidate): candidate for candidate in pool}
    named = difflib.get_close_matches(posixpath.basename(path), sorted(by_name), n=1, cutoff=CLOSE_MATCH_CUTOFF)
    return by_name[named[0]] if named else None


def closest_name(path: str, candidates: Iterable[str]) -> str | None:
    """The candidate nearest to `path` (by the whole path, else by its file name), or None: the
    "did you mean" of a name the manifest, or the Hub's tree, does not hold."""
    return _closest(path, candidates)


def _normalise(name: PayloadName) -> str | Mismatch:
    """The path as the manifest spells it, or why it cannot be one of the manifest's paths."""
    path = name.path
    if path.startswith("/"):
        return Mismatch(name.field, path, "is absolute; manifest paths are relative to the payload directory (endpoint_payload_dir): give it relative to it")
    if "\\" in path or ".." in path.split("/"):
        return Mismatch(name.field, path, "leaves the payload directory or uses a backslash; give a path inside endpoint_payload_dir with '/'")
    return posixpath.normpath(path)


def check_identity(names: Iterable[PayloadName], manifest: Manifest) -> IdentityReport:
    """Each name against the manifest's paths: a file must be listed exactly; a directory must
    hold a listed file, and each file it must hold."""
    files = {entry.path for entry in manifest.files}
    directories = _directories(files)
    names = list(names)
    # "Did you mean" offers only a manifest file the shape does not already name (a missing split
    # part is not offered its sibling).
    spare = files - {posixpath.normpath(name.path) for name in names}
    report = IdentityReport(manifest_label(manifest))
    for name in names:
        report.checked.append(name)
        path = _normalise(name)
        if isinstance(path, Mismatch):
            report.mismatches.append(path)
            continue
        if name.kind == DIRECTORY:
            if path not in directories:
                report.mismatches.append(Mismatch(name.field, name.path, "is not a directory of the manifest", _closest(path, directories - {"."})))
                continue
            for held in name.holds:
                inner = posixpath.normpath(posixpath.join(path, held))
                if inner not in files:
                    inside = {p for p in spare if path == "." or p.startswith(path + "/")}
                    report.mismatches.append(Mismatch(name.field, inner, "is not in the manifest", _closest(inner, inside or spare)))
            continue
        if path in files:
            continue
        if path in directories:
            report.mismatches.append(Mismatch(name.field, name.path, "is a directory of the manifest, not a file; name the file in it"))
            continue
        report.mismatches.append(Mismatch(name.field, name.path, "is not in the manifest", _closest(path, spare)))
    return report
