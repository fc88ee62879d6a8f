# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Payload generations: every payload a deploy runs keeps its own directory, named by its
manifest's sha256, and the path the engine reads (the inventory's payload directory) is a
symlink swapped atomically to the generation the deployed shape's record names.

    /srv/models/frank-large               -> frank-large.generations/<sha256>   (the engine reads this)
    /srv/models/frank-large.generations/<sha256 A>/                             (the running payload)
    /srv/models/frank-large.generations/<sha256 B>/                             (the one before it)
    /srv/models/frank-large.generations/.purge-staged/<sha256 C>/               (past K: staged, not deleted)

Weights are never copied: a generation is filled by the payload gate, a file the previous
generation holds with the same path, size and digest is hard-linked, a legacy directory is
adopted by a rename, a generation past K is renamed into `.purge-staged/` (same filesystem).
Nothing is deleted unless the caller approves it, and then each removed entry is named with the
bytes it freed (the fleet's own purge: "trash-staged, emptied with approval; 763 GiB free").

Why a symlink is safe for a running engine: llama-server and vLLM open their files at start (a
container's bind mount resolves its source when the container starts), so a swap changes what
the next start reads, never what the running process holds; the deploy restarts the unit
whenever the link moved.
"""

from __future__ import annotations

import os
import re
import stat
import time
from typing import Any

from ansible_collections.frank.llm_fleet.plugins.module_utils.files import read_text
from ansible_collections.frank.llm_fleet.plugins.module_utils.host_runner import Host
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.manifest import (
    MAX_MANIFEST_BYTES,
    Manifest,
    ManifestError,
    destination_path,
    manifest_digest,
    parse_manifest_text,
)
from ansible_collections.frank.llm_fleet.plugins.module_utils.payload.verify import not_whole, size_gate, stamped_digest, write_stamp

GENERATIONS_SUFFIX = ".generations"
STAGED_DIR = ".purge-staged"
# The exact manifest text a generation was made for: its sha256 is the generation's name, so a
# generation proves what it holds without the operator's manifest file (which moves on).
MANIFEST_COPY = ".llm-fleet-manifest"
REJECTED_MARK = ".rejected-"
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


class GenerationError(ValueError):
    """A generation layout that cannot be used as it is; names the path and the fix."""


def valid_name(name: Any) -> str:
    """Generation names are manifest digests and nothing else: no path can be built from them."""
    if not isinstance(name, str) or not _DIGEST_RE.match(name):
        raise GenerationError(f"generation: {name!r} is not a manifest sha256 (64 lowercase hex digits); payload generations are named by digest only")
    return name


class Layout:
    """Where one payload directory's generations live: beside it, on its filesystem."""

    def __init__(self, payload_dir: str) -> None:
        if not isinstance(payload_dir, str) or not payload_dir.startswith("/") or any(c in payload_dir for c in "\0\n\r"):
            raise GenerationError(f"payload.dir: {payload_dir!r} must be an absolute path (endpoint_payload_dir)")
        if ".." in payload_dir.split("/"):
            raise GenerationError(f"payload.dir: {payload_dir!r} contains '..'; give the directory's own path (endpoint_payload_dir)")
        self.link = os.path.normpath(payload_dir)
        if self.link == "/":
            raise GenerationError("payload.dir: '/' cannot be a payload directory (endpoint_payload_dir)")
        self.root = self.link + GENERATIONS_SUFFIX
        self.staged = os.path.join(self.root, STAGED_DIR)

    def path(self, name: str) -> str:
        return os.path.join(self.root, valid_name(name))

    def staged_path(self, name: str) -> str:
        return os.path.join(self.staged, valid_name(name))

    def target(self, name: str) -> str:
        """The link's target, relative: it resolves the same inside a unit's RootDirectory."""
        return f"{os.path.basename(self.root)}/{valid_name(name)}"


def _is_real_dir(path: str, what: str) -> bool:
    """True for a directory, False for nothing there; anything else (a planted symlink above all)
    is refused, since every path below it would lead elsewhere."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(info.st_mode):
        raise GenerationError(
            f"{what}: {path} is a symlink (to {os.readlink(path)!r}); payload generations are never reached through one: remove it and run again"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise GenerationError(f"{what}: {path} is not a directory; move it away and run again")
    return True


def link_state(layout: Layout) -> tuple[str, str | None]:
    """("absent", None), ("directory", None) for a payload directory from before generations, or
    ("generation", NAME). A symlink pointing anywhere else is refused: it is not ours to move."""
    try:
        info = os.lstat(layout.link)
    except FileNotFoundError:
        return "absent", None
    if stat.S_ISDIR(info.st_mode):
        return "directory", None
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(layout.link)
        prefix = os.path.basename(layout.root) + "/"
        name = target[len(prefix) :] if target.startswith(prefix) else ""
        if _DIGEST_RE.match(name):
            return "generation", name
        raise GenerationError(
            f"payload.dir: {layout.link} is a symlink to {target!r}, not to one of its generations in {layout.root}: "
            "move that payload into place as a directory (it is then adopted by a rename) or set endpoint_payload_generations: 0"
        )
    raise GenerationError(f"payload.dir: {layout.link} is neither a directory nor a symlink; move it away and run again")


def _manifest_of(directory: str) -> tuple[str, Manifest] | None:
    """A generation's manifest copy and its parse, or None when it has none (or a damaged one)."""
    try:
        text = read_text(os.path.join(directory, MANIFEST_COPY), MAX_MANIFEST_BYTES)
        return (text, parse_manifest_text(text, os.path.join(directory, MANIFEST_COPY))) if text is not None else None
    except (ManifestError, ValueError, OSError):
        return None


def _same_filesystem(source: str, destination_dir: str) -> None:
    """Every move here is a rename: one across filesystems would be a copy of hundreds of GiB."""
    if os.lstat(source).st_dev != os.stat(destination_dir).st_dev:
        raise GenerationError(
            f"payload: {source} and {destination_dir} are on different filesystems and payloads are only ever renamed, never copied: "
            "keep endpoint_payload_dir on the filesystem of its parent directory (a mount point cannot hold generations beside it)"
        )


def prepare(payload_dir: str, manifest_path: str, host: Host) -> dict[str, Any]:
    """Make the generation for this manifest ready for the payload gate to fill: adopt a legacy
    directory (rename), bring back a staged one (rename), or create it and hard-link what the
    current generation already holds. The link moves only when nothing was deployed yet; a
    running payload is switched by the deploy, just before the restart."""
    layout = Layout(payload_dir)
    manifest_path = os.path.normpath(str(manifest_path or ""))
    if not manifest_path.startswith("/"):
        raise GenerationError(f"manifest: {manifest_path!r} must be an absolute path on the host (endpoint_payload_manifest)")
    if os.path.commonpath([manifest_path, layout.link]) == layout.link or os.path.commonpath([manifest_path, layout.root]) == layout.root:
        raise GenerationError(
            f"manifest: {manifest_path} lies inside {layout.link}, which with payload generations is a link that moves from one generation "
            f"to the next: keep the manifest beside it (e.g. {layout.link}.manifest.yml) and set endpoint_payload_manifest to that path"
        )
    text = read_text(manifest_path, MAX_MANIFEST_BYTES)
    if text is None:
        raise GenerationError(f"manifest: {manifest_path} does not exist (endpoint_payload_manifest)")
    manifest = parse_manifest_text(text, manifest_path)
    name = manifest_digest(text)
    directory = layout.path(name)
    state, current = link_state(layout)
    if not os.path.isdir(os.path.dirname(layout.link)):
        raise GenerationError(f"payload.dir: the parent of {layout.link} does not exist; create it first")
    _is_real_dir(layout.root, "payload generations")
    _is_real_dir(layout.staged, "payload generations")
    exists = _is_real_dir(directory, f"generation {name[:12]}")
    result: dict[str, Any] = {"changed": False, "generation": name, "dir": directory, "link": layout.link, "current": current, "shared": []}
    before = len(host.actions)

    if not os.path.isdir(layout.root):
        host.makedirs(layout.root)
    if state == "directory":
        if os.path.ismount(layout.link):
            raise GenerationError(
                f"payload.dir: {layout.link} is a mount point, which cannot be renamed into a generation: mount the disk one level up "
                "and point endpoint_payload_dir below it, or set endpoint_payload_generations: 0"
            )
        if exists:
            raise GenerationError(f"payload.dir: {layout.link} is a directory and generation {directory} exists too: move one of them aside")
        # The payload from before generations becomes this manifest's generation, as an in-place
        # fetch would have used it; the payload gate then completes or refuses it as before.
        if os.path.isdir(layout.root):
            _same_filesystem(layout.link, layout.root)
        host.move(layout.link, directory)
        host.point(layout.link, layout.target(name))
        result["adopted"] = layout.link
    elif not exists and _is_real_dir(layout.staged_path(name), f"staged generation {name[:12]}"):
        host.move(layout.staged_path(name), directory)
        result["unstaged"] = name
    elif not exists:
        host.makedirs(directory)
        if current and current != name:
            result["shared"] = _share(manifest, layout.path(current), directory, host)
    kept = _manifest_of(directory)
    if kept is None or kept[0] != text:
        host.write(os.path.join(directory, MANIFEST_COPY), text, 0o644)
    if state == "absent":
        host.point(layout.link, layout.target(name))
    if host.check_mode and ("adopted" in result or "unstaged" in result):
        # Nothing was renamed: the payload gate's check-mode verify reads the files where they are.
        result["dir"] = layout.link if "adopted" in result else layout.staged_path(name)
    result["actions"] = host.actions[before:]
    result["changed"] = bool(result["actions"])
    return result


def _share(manifest: Manifest, previous: str, directory: str, host: Host) -> list[str]:
    """Hard-link each file the previous generation holds with the same path, size and digest
    (a new revision that changed a config file shares every shard). A valid stamp is carried to
    both names, since the link moved the file's ctime."""
    if not _is_real_dir(previous, "current generation"):
        return []
    kept = _manifest_of(previous)
    if kept is None:
        return []
    before = {entry.path: entry for entry in kept[1].files}
    shared = []
    for entry in manifest.files:
        if not entry.digest or before.get(entry.path) != entry or not size_gate(entry, previous).ok:
            continue
        source, destination = destination_path(previous, entry.path), destination_path(directory, entry.path)
        if os.path.lexists(destination):
            continue
        proven = stamped_digest(previous, entry.path, entry.digest[0]) == entry.digest[1]
        if not os.path.isdir(os.path.dirname(destination)):
            host.makedirs(os.path.dirname(destination))
        host.hardlink(source, destination)
        if proven and not host.check_mode:
            write_stamp(previous, entry.path, *entry.digest)
            write_stamp(directory, entry.path, *entry.digest)
        shared.append(entry.path)
    return shared


def switch(payload_dir: str, name: str, host: Host, bring_back: bool = True) -> dict[str, Any]:
    """Point the payload directory at generation NAME, after checking it holds what its manifest
    copy lists (metadata only: the payload gate proved the bytes). A staged generation is brought
    back by a rename; a purged one is refused, naming it."""
    layout = Layout(payload_dir)
    name = valid_name(name)
    directory = layout.path(name)
    state, current = link_state(layout)
    before = len(host.actions)
    result: dict[str, Any] = {"changed": False, "generation": name, "dir": directory, "link": layout.link, "previous": current}
    if state == "directory" and host.check_mode and not bring_back:
        # Check mode of the first deploy with generations: the payload gate would have adopted it.
        host.point(layout.link, layout.target(name))
        result.update(changed=True, actions=host.actions[before:])
        return result
    if state == "directory":
        raise GenerationError(
            f"payload.dir: {layout.link} is a directory, not a link to a generation: run the payload gate with generations "
            "(hf_payload_gate state=generation) first, which adopts it"
        )
    if not _is_real_dir(directory, f"generation {name[:12]}"):
        if bring_back and _is_real_dir(layout.staged_path(name), f"staged generation {name[:12]}"):
            _same_filesystem(layout.staged_path(name), layout.root)
            host.move(layout.staged_path(name), directory)
            result["unstaged"] = name
        elif host.check_mode and not bring_back:
            # Check mode of a deploy whose payload gate prepared nothing: report the switch it would make.
            host.point(layout.link, layout.target(name))
            result.update(changed=True, actions=host.actions[before:])
            return result
        else:
            raise GenerationError(
                f"payload: generation {name} is not in {layout.root} nor staged in {layout.staged}: it was purged. Fetch that payload "
                "again (the manifest it was made from, through hf_payload_gate state=generation then state=fetch) or deploy a shape for a kept one"
            )
    if "unstaged" not in result:
        _check_generation(directory, name)
    if current != name:
        host.point(layout.link, layout.target(name))
        # The order generations are kept in: the most recently served first.
        copy = os.path.join(directory, MANIFEST_COPY)
        if os.path.exists(copy) or host.check_mode:
            host.touch(copy)
    result["actions"] = host.actions[before:]
    result["changed"] = bool(result["actions"])
    return result


def _check_generation(directory: str, name: str) -> None:
    kept = _manifest_of(directory)
    if kept is None or manifest_digest(kept[0]) != name:
        raise GenerationError(
            f"payload: generation {directory} has no manifest copy {MANIFEST_COPY} of sha256 {name[:12]}: it is not a generation "
            "this collection made; move it away and fetch the payload again"
        )
    listed = not_whole(kept[1], directory)
    if listed:
        raise GenerationError(f"payload: generation {directory} is not whole: {listed}; fetch it again (hf_payload_gate state=fetch)")


def where(payload_dir: str, name: str) -> str:
    """kept, staged or purged: what a rollback to this generation would find (for listings)."""
    try:
        layout = Layout(payload_dir)
        if os.path.isdir(layout.path(name)):
            return "kept"
        return "staged" if os.path.isdir(layout.staged_path(name)) else "purged"
    except GenerationError:
        return "unknown"


# --- retention: staging past K, bounding rejected copies, purging with approval -----------------


def tree_bytes(path: str) -> tuple[int, int]:
    """(bytes the tree's files hold, bytes deleting it would free): a file hard-linked from a
    kept generation frees nothing. Symlinks are never followed."""
    paths = [path] if os.path.islink(path) or not os.path.isdir(path) else []
    for parent, _dirs, files in os.walk(path):
        paths.extend(os.path.join(parent, name) for name in files)
    inodes: dict[tuple[int, int], list[int]] = {}  # (dev, ino) -> [size, links, names in this tree]
    for each in paths:
        info = os.lstat(each)
        if stat.S_ISREG(info.st_mode):
            inodes.setdefault((info.st_dev, info.st_ino), [info.st_size, info.st_nlink, 0])[2] += 1
    held = sum(size * names for size, _links, names in inodes.values())
    freed = sum(size for size, links, names in inodes.values() if links <= names)
    return held, freed


def _generations(layout: Layout) -> list[str]:
    try:
        names = os.listdir(layout.root)
    except FileNotFoundError:
        return []
    return [n for n in names if _DIGEST_RE.match(n) and _is_real_dir(os.path.join(layout.root, n), f"generation {n[:12]}")]


def _last_served(directory: str) -> float:
    try:
        return os.lstat(os.path.join(directory, MANIFEST_COPY)).st_mtime
    except OSError:
        return os.lstat(directory).st_mtime


def _stage(source: str, layout: Layout, name: str, host: Host) -> str:
    if not os.path.isdir(layout.staged):
        host.makedirs(layout.staged, 0o700)
    else:
        _same_filesystem(source, layout.staged)
    destination = os.path.join(layout.staged, name)
    if os.path.lexists(destination):
        destination = f"{destination}.{time.time_ns()}"
    host.move(source, destination)
    return destination


def _rejected_copies(directory: str) -> dict[str, list[str]]:
    """NAME.rejected-* files under a payload directory, by the name they were rejected for."""
    found: dict[str, list[str]] = {}
    for parent, _dirs, files in os.walk(directory):
        for name in files:
            if REJECTED_MARK in name:
                path = os.path.join(parent, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    found.setdefault(path.split(REJECTED_MARK, 1)[0], []).append(path)
    return found


def retain(payload_dir: str, keep: int, keep_rejected: int, approved: bool, host: Host, serving: str | None = None) -> dict[str, Any]:
    """Generations past the K most recently served (the one the link names always kept) and
    rejected copies past the newest `keep_rejected` per file are renamed into `.purge-staged/`
    and reported with their sizes. The staged entries are deleted only when `approved`, each one
    named with the bytes it freed. `serving` names the generation the deploy just switched to (in
    check mode the link has not moved, and the report must match what the real run would do)."""
    layout = Layout(payload_dir)
    if keep < 0 or keep_rejected < 0:
        raise GenerationError(
            f"keep: {keep} and keep_rejected: {keep_rejected} must be 0 or more (endpoint_payload_generations, endpoint_payload_keep_rejected)"
        )
    _is_real_dir(layout.root, "payload generations")
    _is_real_dir(layout.staged, "payload generations")
    state, current = link_state(layout)
    if serving and state == "generation":
        current = valid_name(serving)
    before = len(host.actions)
    staged: list[dict[str, Any]] = []
    kept: list[str] = []
    directories: list[tuple[str, str]] = []
    if state == "directory":
        directories.append(("payload", layout.link))
    if keep and state == "generation":
        ordered = sorted((n for n in _generations(layout) if n != current), key=lambda n: _last_served(layout.path(n)), reverse=True)
        kept = ([current] if current else []) + ordered
        for name in kept[keep:]:
            held, _freed = tree_bytes(layout.path(name))
            staged.append({"name": name, "kind": "generation", "bytes": held, "staged_as": _stage(layout.path(name), layout, name, host)})
        kept = kept[:keep]
        directories.extend((name, layout.path(name)) for name in kept)
    for label, directory in directories:
        for _original, copies in sorted(_rejected_copies(directory).items()):
            newest_first = sorted(copies, key=lambda p: os.lstat(p).st_mtime_ns, reverse=True)
            for path in newest_first[keep_rejected:]:
                relative = os.path.relpath(path, directory).replace("/", "%2F")
                entry = {"name": f"{label}/{os.path.relpath(path, directory)}", "kind": "rejected", "bytes": os.lstat(path).st_size}
                entry["staged_as"] = _stage(path, layout, f"rejected-{label[:12]}-{relative}", host)
                staged.append(entry)
    result: dict[str, Any] = {"changed": False, "kept": kept, "current": current, "staged": staged}
    result.update(purge(layout, approved, host))
    result["actions"] = host.actions[before:]
    result["changed"] = bool(result["actions"])
    result["msg"] = _summary(result)
    return result


def _summary(result: dict[str, Any]) -> str:
    staged = sum(entry["bytes"] for entry in result["staged"])
    waiting = sum(entry["bytes"] for entry in result["awaiting_approval"])
    tail = (
        f"purged {len(result['purged'])} staged entries, {result['bytes_freed']:,} bytes freed"
        if result["purged"]
        else f"{len(result['awaiting_approval'])} staged entries ({waiting:,} bytes) await purge_approved"
    )
    return f"kept {len(result['kept'])} generations; staged {len(result['staged'])} entries ({staged:,} bytes); {tail}"


def purge(layout: Layout, approved: bool, host: Host) -> dict[str, Any]:
    """Every entry in `.purge-staged/` with its size; deleted, entry by entry, only when approved."""
    if not os.path.isdir(layout.staged):
        # Check mode staged nothing on disk: what it would stage is in the actions.
        return {"awaiting_approval": [], "purged": [], "bytes_freed": 0}
    listed = []
    for name in sorted(os.listdir(layout.staged)):
        held, freed = tree_bytes(os.path.join(layout.staged, name))
        listed.append({"name": name, "bytes": held, "frees": freed})
    if not approved:
        return {"awaiting_approval": listed, "purged": [], "bytes_freed": 0}
    for entry in listed:
        host.remove_tree(os.path.join(layout.staged, entry["name"]))
    return {"awaiting_approval": [], "purged": listed, "bytes_freed": sum(entry["frees"] for entry in listed)}
