# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Payload manifests: exactly the files an endpoint needs, pinned to a Hub commit.

    repo_id: unsloth/Qwen3-Coder-GGUF
    revision: 0123456789abcdef0123456789abcdef01234567   # a commit, never a branch
    repo_type: model
    files:
      - path: Q4_K_M/model-00001-of-00003.gguf
        size: 49392123904
        sha256: 3f0c...                                    # the Hub's LFS oid; absent for git files
        lfs: true
      - path: config.json
        size: 1423
        git_blob_sha1: 9a1e...                             # the tree's oid of a git file
        lfs: false

Split GGUF parts are listed as they are on the Hub and never concatenated. Paths are relative and
may not escape the destination.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

try:
    import yaml

    HAS_YAML = True
except ImportError:  # target hosts may lack PyYAML; JSON manifests (valid YAML) still load
    HAS_YAML = False

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA1_RE = _COMMIT_RE  # a git blob sha1 has the commit's shape: 40 hex digits


class ManifestError(ValueError):
    """A manifest that is malformed or names an unsafe path."""


def digest_fields(sha256: str | None, git_blob_sha1: str | None) -> dict[str, str]:
    """The digests a payload file's entry reports (manifest, verdict, fetch result): those known."""
    return {key: value for key, value in (("sha256", sha256), ("git_blob_sha1", git_blob_sha1)) if value}


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str | None = None
    lfs: bool = False
    git_blob_sha1: str | None = None  # a git (non-LFS) file's oid: sha1(b"blob SIZE\0" + content)

    @property
    def digest(self) -> tuple[str, str] | None:
        """(algorithm, expected hex) that proves the content: the LFS sha256, else the git blob sha1."""
        if self.sha256:
            return "sha256", self.sha256
        if self.git_blob_sha1:
            return "git_blob_sha1", self.git_blob_sha1
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, **digest_fields(self.sha256, self.git_blob_sha1), "lfs": self.lfs}


@dataclass
class Manifest:
    repo_id: str
    revision: str
    files: list[ManifestFile] = field(default_factory=list)
    repo_type: str = "model"

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "revision": self.revision, "repo_type": self.repo_type, "files": [f.as_dict() for f in self.files]}


def safe_relative_path(path: str, field_name: str = "path") -> str:
    """Refuse absolute paths, `..`, empty parts and backslashes; return the normalised path."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"{field_name}: must be a non-empty relative path")
    if "\\" in path or "\0" in path:
        raise ManifestError(f"{field_name}: {path!r} contains a backslash or NUL")
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise ManifestError(f"{field_name}: {path!r} is absolute; manifest paths are relative to the destination")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ManifestError(f"{field_name}: {path!r} contains an empty, '.' or '..' component")
    return posixpath.normpath(path)


def destination_path(dest: str, relative: str) -> str:
    """The file's place under `dest`, refusing anything that resolves outside it (symlinked dirs too)."""
    relative = safe_relative_path(relative)
    root = os.path.realpath(dest)
    target = os.path.realpath(os.path.join(root, *relative.split("/")))
    if os.path.commonpath([root, target]) != root:
        raise ManifestError(f"path: {relative!r} resolves outside the destination {dest!r}")
    return os.path.join(root, *relative.split("/"))


def parse_manifest(data: Any) -> Manifest:
    if not isinstance(data, dict):
        raise ManifestError("manifest: expected a mapping with repo_id, revision and files")
    repo_id = data.get("repo_id")
    if not isinstance(repo_id, str) or not re.match(r"^[\w.-]+(/[\w.-]+)?$", repo_id):
        raise ManifestError(f"repo_id: expected 'owner/name', got {repo_id!r}")
    revision = str(data.get("revision", ""))
    if not _COMMIT_RE.match(revision):
        raise ManifestError(f"revision: expected a 40-hex commit (pin the payload), got {revision!r}")
    files_data = data.get("files")
    if not isinstance(files_data, list) or not files_data:
        raise ManifestError("files: list at least one file")
    files = []
    seen = set()
    for index, entry in enumerate(files_data):
        where = f"files[{index}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where}: expected a mapping with path and size")
        path = safe_relative_path(entry.get("path"), f"{where}.path")
        if path in seen:
            raise ManifestError(f"{where}.path: {path!r} is listed twice")
        seen.add(path)
        size = entry.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ManifestError(f"{where}.size: expected a byte count, got {size!r}")
        sha256 = entry.get("sha256")
        if sha256 is not None:
            sha256 = str(sha256).lower()
            if not _SHA256_RE.match(sha256):
                raise ManifestError(f"{where}.sha256: expected 64 hex digits, got {entry.get('sha256')!r}")
        blob = entry.get("git_blob_sha1")
        if blob is not None:
            blob = str(blob).lower()
            if not _SHA1_RE.match(blob):
                raise ManifestError(f"{where}.git_blob_sha1: expected 40 hex digits (the Hub tree's oid), got {entry.get('git_blob_sha1')!r}")
        files.append(ManifestFile(path, size, sha256, bool(entry.get("lfs", sha256 is not None)), blob))
    return Manifest(repo_id, revision, files, str(data.get("repo_type", "model")))


# A manifest lists a payload's files and is a few KiB; one near this bound is not one of ours.
MAX_MANIFEST_BYTES = 16 << 20


def manifest_digest(text: str) -> str:
    """The sha256 of a manifest's exact text: a deploy record pins its payload by it, and a payload
    generation is named by it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_manifest(path: str) -> Manifest:
    with open(path, encoding="utf-8") as handle:
        return parse_manifest_text(handle.read(), path)


def parse_manifest_text(text: str, where: str) -> Manifest:
    """A manifest file's text (YAML, or JSON where PyYAML is absent); `where` names it in errors."""
    if text.lstrip().startswith("{"):
        # JSON (valid YAML too) parses a hundred times faster with json: 144 entries in about 1 ms.
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            pass  # YAML flow style, read below
        else:
            return parse_manifest(data)
    if HAS_YAML:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ManifestError(f"{where}: not YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ManifestError(f"{where}: PyYAML is not installed here, and the manifest is not JSON: {exc}") from None
    return parse_manifest(data)


def dump_manifest(manifest: Manifest) -> str:
    if HAS_YAML:
        return "---\n" + yaml.safe_dump(manifest.as_dict(), sort_keys=False)
    return json.dumps(manifest.as_dict(), indent=2) + "\n"
